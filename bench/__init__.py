"""`make bench`: Envoy alone vs Envoy + the loadaware sidecar — CPU per request, added latency, top rate.

Modules: `schedule` (open-loop arrival times), `loadgen` (the asyncio/aiohttp client, run in its own
process), `stats` (percentiles), `promtext` (Prometheus histogram deltas), `workload` (request bodies),
`cases` (one measured arm against a running stack), `report` (Markdown + JSON), `run` (the CLI).
"""
