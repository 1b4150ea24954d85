"""One-off probes: each measures one cost or one leak, in process or on loopback, for a figure in
research/notebook.md, docs/results.md or docs/memory.md. None is part of `make bench`; each runs alone as
`python -m research.probes.<name>` (research/README.md lists them)."""
