"""The reference experiment (experiment/README.md), reproducible on a simulated fleet.

Modules, each usable on its own (the real-time driver through Envoy reuses all but `des`):

    workload     the reference workload: prefixes, Zipf popularity, unique suffixes, arrivals (ids + text)
    records      what a run collects: per-request records and per-engine scrape samples
    metrics      per-seed metrics exactly as the reference defines them, and the validity gate
    stats        exact one-sided Wilcoxon signed-rank, median paired relative reduction + bootstrap CI
    calibration  the service-model numbers fitted to the reference table, in one place
    des          discrete-event simulator: the sim/ engine model + the sidecar's own policies, no network
    des_run      `python -m experiment.des_run`: seeds x arms, tables, paired tests, sweeps, plots
    report       Markdown tables and matplotlib plots from per-seed results
"""
