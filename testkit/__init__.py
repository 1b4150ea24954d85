"""Test and run tooling (not installed; run from the repository root): launchers for Envoy, the sidecar,
the simulated fleet and the LMCache controller, and fakes of what a deployment talks to (the Kubernetes API
server, an EDS file source).

Imports run one way: loadaware <- sim <- testkit <- bench / experiment <- demo. The sidecar package never
imports this one.
"""
