"""Real-time mode of the reference experiment: the real stack on loopback, one arm at a time.

    python -m experiment.realtime.driver --point reference --seeds 1-3 --out out/experiment/rt

Modules, one job each:

    arms      what each arm runs: a sidecar policy (through Envoy) or a peer router (sent to directly)
    points    operating points: fleet size, service model (experiment.calibration), workload shape
    fleetctl  the simulated fleet's flags, cache reset between runs, idle check, LMCache emptiness check
    envoycfg  the shipped envoy.yaml rewritten for the run's engines (2 or 4 instead of 3)
    scrape    engine /metrics text -> experiment.records.EngineSample
    sender    the open-loop client, a separate process: warm-up waves, measured phase, scrapes
    outputs   where a run's files go and how they are read back (the report reads these)
    driver    seeds x arms over one fleet: reset, start the router, send, collect, stop

The peer routers (sglang-router / vllm-router from .peers-venv) are launched by testkit.peers, shared with
`make bench`.
"""
