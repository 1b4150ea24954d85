# One home for every command a newcomer or CI runs. Each target installs what it needs itself.
PYTHON ?= python3
VENV := .venv
LMCACHE_VENV := .lmcache-venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LMCACHE_STAMP := $(LMCACHE_VENV)/.installed
EXPERIMENT_STAMP := $(VENV)/.experiment-installed

.PHONY: help install lmcache demo test test-unit bench proto proto-check k8s-config clean

help:
	@echo "make demo   - Envoy + sidecar + simulated engines + LMCache controller on loopback, with traffic"
	@echo "make test   - every test (unit, integration, end-to-end)"
	@echo "make bench  - Envoy alone vs Envoy + sidecar: CPU, latency, rate"
	@echo "make experiment       - the reference experiment in real time, all arms + peers (SEEDS=1-20)"
	@echo "make experiment-quick - the same, 3 seeds and the arms the targets are judged on (< 15 min)"

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

install: $(STAMP)

# LMCache pins clash with ours (grpcio, protobuf, prometheus_client, numpy): it gets its own environment.
$(LMCACHE_STAMP):
	test -x $(LMCACHE_VENV)/bin/python || $(PYTHON) -m venv $(LMCACHE_VENV)
	$(LMCACHE_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LMCACHE_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(LMCACHE_VENV)/bin/python -m pip install --quiet lmcache==0.5.6
	touch $@

lmcache: $(LMCACHE_STAMP)

demo: $(EXPERIMENT_STAMP) $(LMCACHE_STAMP)
	$(PY) -m sim.demo

test: $(EXPERIMENT_STAMP) $(LMCACHE_STAMP) proto-check
	$(PY) -m pytest -q -ra

test-unit: $(EXPERIMENT_STAMP)
	$(PY) -m pytest -q tests/unit

bench: $(STAMP) $(LMCACHE_STAMP)
	$(PY) -m bench.run

# The project's own gRPC API: proto/loadaware/v1 -> sidecar/api/v1 (checked in).
proto: $(STAMP)
	$(PY) proto/generate.py

# Fails when the checked-in generated code no longer matches the .proto (also a unit test).
proto-check: $(STAMP)
	$(PY) proto/generate.py --check

# The in-pod Envoy config in k8s/base (the ConfigMap) is derived from envoy/envoy.yaml.
k8s-config: $(STAMP)
	$(PY) k8s/envoy_config.py

# The peer routers (DESIGN.md 7), Rust wheels from PyPI, in their own environment (they pull their own deps).
PEERS_VENV := .peers-venv
PEERS_STAMP := $(PEERS_VENV)/.installed
$(PEERS_STAMP):
	test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install --quiet sglang-router==0.3.2 vllm-router==0.1.17
	touch $@

peers: $(PEERS_STAMP)

# The reference experiment in real time (experiment/realtime): every arm and both peers, then the report.
# SEEDS, POINT, ARMS and EXPERIMENT_ARGS (e.g. --max-minutes 60 --resume) are overridable.
SEEDS ?= 1-20
POINT ?= reference
ARMS ?= all
EXPERIMENT_OUT ?= out/experiment/realtime-$(POINT)
EXPERIMENT_ARGS ?=
# numpy, scipy, matplotlib: the experiment (and the demo's closing short run of it).
$(EXPERIMENT_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,experiment]'
	touch $@

experiment: $(EXPERIMENT_STAMP) $(LMCACHE_STAMP) $(PEERS_STAMP)
	$(PY) -m experiment.realtime.driver --point $(POINT) --seeds $(SEEDS) --arms $(ARMS) --out $(EXPERIMENT_OUT) $(EXPERIMENT_ARGS)

experiment-quick: $(EXPERIMENT_STAMP) $(LMCACHE_STAMP) $(PEERS_STAMP)
	$(PY) -m experiment.realtime.driver --quick --out out/experiment/realtime-quick $(EXPERIMENT_ARGS)

clean:
	rm -rf $(VENV) $(LMCACHE_VENV) $(PEERS_VENV) build *.egg-info
