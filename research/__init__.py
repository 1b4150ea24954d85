"""The lab: research arms, probes and the lab notebook, kept out of the product's way (research/README.md).

Nothing in the product, the simulator, the benchmarks or the demo imports this package (the import contracts
in pyproject.toml forbid it); it imports them. Importing `research.arms` registers the research arms into the
simulator's registry (`experiment.arms`); this package's own import does nothing, so a probe starts light.
"""
