"""Admission under saturation (flow control): while every eligible engine is saturated the sidecar holds a
request on its ext_proc stream instead of answering, and releases the held ones highest priority first and
fairly across tenants within a priority (docs/architecture.md, "Admission").

objectives.py: an objective's priority (--objectives FILE, or InferenceObjective resources)
saturation.py: when an engine, and the pool, has no room (pure)
flow_queue.py: the held requests in priority bands, round robin across fairness ids (pure)
controller.py: admit / hold / shed, driven by the request lifecycle and the engines' scrapes
"""
