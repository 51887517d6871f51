# Two commands do all the set-up on a fresh machine:
#   make run    install, start the embedded broker + PostgreSQL, run the main job
#   make test   install (and the SGLang environment), run the test suite (real broker,
#               real PostgreSQL, real SGLang server)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-fast lint typecheck bench install clean sglang-env cookbook-env browser

# SGLang serves rollouts from its own virtual environment (it pins its own torch and CUDA
# packages); StreamRL only talks HTTP to it. Built once per machine, outside the checkout,
# keyed by the sglang version; STREAMRL_SGLANG_PYTHON points elsewhere instead.
SGLANG_VERSION := 0.5.23
SGLANG_ENV := $(HOME)/.cache/streamrl/sglang-$(SGLANG_VERSION)
SGLANG_STAMP := $(SGLANG_ENV)/.installed

$(SGLANG_STAMP):
	@echo "building the SGLang $(SGLANG_VERSION) environment in $(SGLANG_ENV) (about 11 GB, a few minutes, once per machine)"
	rm -rf $(SGLANG_ENV)
	python3 -m venv $(SGLANG_ENV)
	$(SGLANG_ENV)/bin/python -m pip install --quiet --upgrade pip
	$(SGLANG_ENV)/bin/python -m pip install --quiet sglang==$(SGLANG_VERSION)
	touch $(SGLANG_STAMP)

sglang-env: $(SGLANG_STAMP)

# tinker-cookbook is a client program of `streamrl serve-training`, not part of StreamRL:
# it pins its own transformers and tinker, so it gets its own environment, built like the
# SGLang one. 0.5.8 is the newest release the index serves whole (0.6.x needs
# tml-renderers>=0.4.1, which it lacks). STREAMRL_COOKBOOK_PYTHON points elsewhere instead.
COOKBOOK_VERSION := 0.5.8
COOKBOOK_ENV := $(HOME)/.cache/streamrl/tinker-cookbook-$(COOKBOOK_VERSION)
COOKBOOK_STAMP := $(COOKBOOK_ENV)/.installed

$(COOKBOOK_STAMP):
	@echo "building the tinker-cookbook $(COOKBOOK_VERSION) environment in $(COOKBOOK_ENV) (about 2 GB, once per machine)"
	rm -rf $(COOKBOOK_ENV)
	python3 -m venv $(COOKBOOK_ENV)
	$(COOKBOOK_ENV)/bin/python -m pip install --quiet --upgrade pip
	command -v nvidia-smi >/dev/null || $(COOKBOOK_ENV)/bin/python -m pip install --quiet '$(TORCH_CPU)'
	$(COOKBOOK_ENV)/bin/python -m pip install --quiet 'tinker-cookbook[math-rl]==$(COOKBOOK_VERSION)'
	touch $(COOKBOOK_STAMP)

cookbook-env: $(COOKBOOK_STAMP)

# The run browser's tests drive the machine's chromium through Playwright: Debian's
# package (Playwright's own browser download comes from a host outside the registries).
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || \
	  echo "could not install chromium (apt-get, as root): the browser tests will be skipped"


# torch is a range in pyproject.toml, so a GPU machine keeps (or gets) a CUDA build. Where
# there is no NVIDIA driver, the CPU build goes in first: the range is then met, and pip
# pulls no multi-GB CUDA build for a machine that cannot use it.
TORCH_CPU := torch==2.13.0

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	command -v nvidia-smi >/dev/null || $(PY) -c 'import torch' 2>/dev/null || \
	  $(PY) -m pip install --quiet '$(TORCH_CPU)'
	$(PY) -m pip install --quiet -e '.[all,test,lint]'
	touch $(STAMP)

BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[all,test,lint,bench]'
	touch $(BENCH_STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/streamrl up
	$(VENV)/bin/streamrl run recipes/arith/recipe.yaml

# The SGLang tests need the SGLang environment: built here when missing (unless
# STREAMRL_SGLANG_PYTHON names one); if it cannot be built they say so and are skipped
# (under CI they fail).
# Two pytest-xdist workers, each taking whole modules (the module fixtures start services),
# the longest first (tests/conftest.py): most tests wait on processes of ~1 core each, so
# two fill a 2-core machine. Long end-to-end runs no longer need the machine to themselves
# once waiting torch threads sleep (OMP_WAIT_POLICY, docs/benchmarks.md "Waiting threads").
TEST_WORKERS ?= 2
# mypy (a minute and a half of one core without its cache) runs beside the tests, which
# leave about a fifth of the cores idle (docs/benchmarks.md); its verdict is printed after
# theirs, and either failing fails the target.

test: $(STAMP) browser
ifeq ($(STREAMRL_SGLANG_PYTHON),)
	@$(MAKE) --no-print-directory sglang-env || echo "could not build the SGLang environment (the error is above): the SGLang tests will be skipped"
endif
ifeq ($(STREAMRL_COOKBOOK_PYTHON),)
	@$(MAKE) --no-print-directory cookbook-env || echo "could not build the tinker-cookbook environment (the error is above): its tests will be skipped"
endif
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	@$(PY) tools/typecheck.py > $(VENV)/typecheck.log 2>&1 & typecheck=$$!; \
	$(PY) -m pytest -p no:cacheprovider --durations=25 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder; tests=$$?; \
	wait $$typecheck; types=$$?; echo "$(PY) tools/typecheck.py:"; cat $(VENV)/typecheck.log; \
	test $$tests -eq 0 && test $$types -eq 0

# The tests that need no service (no broker, PostgreSQL, SGLang or browser): a few minutes.
# Markers (pyproject.toml, --strict-markers): services, slow, learning, gpu; e.g.
# `.venv/bin/pytest -m learning` runs only the learning tests.
test-fast: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider -n $(TEST_WORKERS) -m "not services"

# ruff (lint and format) and mypy (over the installed layout: tools/typecheck.py), as
# `make test` runs them first
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) tools/typecheck.py

typecheck: $(STAMP)
	$(PY) tools/typecheck.py

bench: $(BENCH_STAMP)
	$(PY) bench/codec_bench.py
	$(PY) bench/bus_bench.py
	$(PY) bench/broker_requests.py
	$(PY) bench/sink_bench.py
	$(PY) bench/learner_bench.py
	$(PY) bench/learner_ranks.py
	$(PY) bench/learner_gpu.py
	$(MAKE) --no-print-directory sglang-env
	$(PY) bench/inference_bench.py
	$(PY) bench/weight_sync.py
	$(PY) bench/step_cpu.py
	$(PY) bench/worker_cpu.py
	$(PY) bench/remote_step.py
	$(PY) bench/processor_cpu.py
	$(PY) bench/group_membership.py
	$(PY) bench/broker_memory.py
	$(PY) bench/broker_window.py
	$(PY) bench/ui_pages.py
	$(PY) bench/time_to_accuracy.py
	STREAMRL_HOME=bench/out/home $(VENV)/bin/streamrl down

clean:
	-$(VENV)/bin/streamrl down
	rm -rf $(VENV) .streamrl
