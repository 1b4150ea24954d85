"""`make bench`: Envoy alone vs Envoy + the loadaware sidecar — CPU per request, added latency, top rate.

Modules: `schedule` (open-loop arrival times), `loadgen` (the asyncio/aiohttp client, run in its own
process), `stats` (percentiles), `promtext` (Prometheus histogram deltas), `workload` (request bodies),
`cases` (one measured arm against a running stack), `report` (Markdown + JSON), `run` (the CLI);
`table_arms`, `table`, `table_report` (case 8: every router side by side on one fleet, peers included);
`profile` and `pyspy` (`make profile`: py-spy on the sidecar, its stacks ranked).
"""
