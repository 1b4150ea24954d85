# One home for every command a newcomer or CI runs. Each target installs what it needs itself.
PYTHON ?= python3
VENV := .venv
LMCACHE_VENV := .lmcache-venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LMCACHE_STAMP := $(LMCACHE_VENV)/.installed

.PHONY: help install lmcache demo test test-unit bench proto proto-check k8s-config clean

help:
	@echo "make demo   - Envoy + sidecar + simulated engines + LMCache controller on loopback, with traffic"
	@echo "make test   - every test (unit, integration, end-to-end)"
	@echo "make bench  - Envoy alone vs Envoy + sidecar: CPU, latency, rate"

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

demo: $(STAMP) $(LMCACHE_STAMP)
	$(PY) -m sim.demo

test: $(STAMP) $(LMCACHE_STAMP) proto-check
	$(PY) -m pytest -q -ra

test-unit: $(STAMP)
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

clean:
	rm -rf $(VENV) $(LMCACHE_VENV) build *.egg-info
