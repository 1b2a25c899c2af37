# Two commands do all the set-up: `make demo` and `make test` (see README.md).
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q

.PHONY: demo test test-fast test-coverage lint bench bench-hooks native clean test-twins test-monitoring test-services

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade "setuptools>=77" wheel

# Base install (no extras): what `make demo` needs.
$(VENV)/.stamp-base: pyproject.toml setup.py | $(PY)
	$(PIP) install -e .
	touch $@

# Test install: every extra, torch pinned to the local 2.13.0 wheel.
# HTA (trace-compatibility tests) without its notebook dependencies: see tests/requirements.txt.
$(VENV)/.stamp-test: pyproject.toml setup.py tests/requirements.txt $(VENV)/.stamp-base
	$(PIP) install -e ".[dev,torch,prometheus,otlp]"
	$(PIP) install -r tests/requirements.txt
	$(PIP) install --no-deps "HolisticTraceAnalysis==0.5.0"
	touch $@

# Rebuild the C extension in place whenever its sources change.
native: $(VENV)/.stamp-base
	$(PY) setup.py -q build_ext --inplace

# The demo: the example loop under `stepscope run` (steps end at each train_step), then
# `stepscope report` on its traces: the terminal summary and a self-contained HTML page.
DEMO_OUT ?= out/demo
demo: $(VENV)/.stamp-base native
	rm -rf $(DEMO_OUT)/traces
	$(VENV)/bin/stepscope run -o $(DEMO_OUT)/traces --step-on train_loop:train_step \
	  --sampling-rate 500 --wait 8 --warmup 1 --active 20 --top 10 examples/train_loop.py
	$(VENV)/bin/stepscope report $(DEMO_OUT)/traces --html $(DEMO_OUT)/report.html
	@echo "HTML report (works offline): file://$(abspath $(DEMO_OUT))/report.html"

# Real programs the tests talk to (Prometheus, Pushgateway, Chromium + chromedriver), installed where we can.
test-services:
	@bash scripts/install-test-services.sh

# Every stage runs whatever the others did; one summary of all of them closes the run.
# The suite with the C extension runs once, in two stages: the fast tier under line coverage
# (holding the floor below), then the slow tier with the tests that measure the interpreter's own
# allocations or speed (marked `measures_interpreter` by tests/conftest.py: coverage's tracer
# changes what they measure, so they run without it).
COVERAGE_FLOOR ?= 78
test: $(VENV)/.stamp-test native test-services
	@bash scripts/test-stages.sh \
	  "the fast tier with the C extension, under line coverage" "$(MAKE) --no-print-directory test-coverage" \
	  "the slow tier and the measuring tests with the C extension" "$(PY) -m pytest -q --durations=15 -m 'slow or measures_interpreter'" \
	  "the suite on the pure-Python twins" "$(MAKE) --no-print-directory test-twins" \
	  "C-part tests under Python 3.12 and 3.13" "$(MAKE) --no-print-directory test-monitoring"

# Line coverage of the package over the fast tier; fails under COVERAGE_FLOOR percent.
test-coverage: $(VENV)/.stamp-test native
	STEPSCOPE_UNDER_COVERAGE=1 $(PY) -m coverage run -m pytest -q -m "not slow"
	$(PY) -m coverage report --fail-under=$(COVERAGE_FLOOR)

# The inner loop: no subprocess-heavy, trainer or browser tests (marked `slow`), the extension built.
test-fast: $(VENV)/.stamp-test native
	$(PY) -m pytest -q -m "not slow"

# The suite again on the pure-Python twins, as a machine without a compiler runs it (tests of
# what only the extension has skip, saying so).  Tests marked `implementation_independent` are
# left out: they reach no choice between the extension and a twin (the metrics pipeline and its
# servers, the tables, fleet SQL and its page, the layering check...), or choose it themselves
# for the processes they start, so this stage would run exactly what the first one did.  The
# marker is set by each test and held by tests/implementation_guard.py: a marked test that
# reaches a choice fails.  Tests marked `whole_trainers` (the shapes matrix, trainer failures:
# many whole HF/Lightning runs whose subject is the analysis or the failure path) run with the
# extension only; each C part's agreement with its twin has tests of its own here.
test-twins: $(VENV)/.stamp-test
	STEPSCOPE_IMPLEMENTATION=python $(PY) -m pytest -q --durations=15 -m "not implementation_independent and not whole_trainers"

# The C parts' tests (marked `native`: the tracer's sys.monitoring path, the sampler's frame
# walk, record_function, the clock, the Chrome scanner) under Python 3.12 and 3.13, where
# present (pyenv versions or python3.X on PATH), each in its own .venv3XX (no torch), with the
# extension and on the twins; skipped where absent.
test-monitoring:
	@for v in 3.12 3.13; do \
	  py=$$(ls -d $$HOME/.pyenv/versions/$$v*/bin/python$$v 2>/dev/null | head -n 1); \
	  if [ -z "$$py" ] && python$$v -c '' 2>/dev/null; then py=python$$v; fi; \
	  if [ -z "$$py" ]; then echo "test-monitoring: no python$$v here, skipped"; continue; fi; \
	  venv=.venv$$(echo $$v | tr -d .); \
	  if [ ! -f $$venv/.stamp-tracer ] || [ pyproject.toml -nt $$venv/.stamp-tracer ] \
	      || [ Makefile -nt $$venv/.stamp-tracer ]; then \
	    $$py -m venv $$venv && \
	    $$venv/bin/python -m pip --disable-pip-version-check -q install "setuptools>=77" wheel \
	      pytest pytest-timeout hypothesis coverage && \
	    $$venv/bin/python -m pip --disable-pip-version-check -q install -e ".[prometheus,otlp]" && \
	    touch $$venv/.stamp-tracer || exit 1; \
	  fi; \
	  $$venv/bin/python setup.py -q build_ext --inplace 2>/dev/null || exit 1; \
	  echo "== C-part tests (-m native) under python$$v"; \
	  $$venv/bin/python -m pytest -q -p no:cacheprovider -m native || exit 1; \
	  echo "== C-part tests (-m native) on the pure-Python twins under python$$v"; \
	  STEPSCOPE_IMPLEMENTATION=python $$venv/bin/python -m pytest -q -p no:cacheprovider -m native \
	    || exit 1; \
	done

lint: $(VENV)/.stamp-test
	$(PY) -m ruff check src tests bench examples
	$(PY) -m ruff format --check src tests bench examples
	$(PY) -m mypy

# The benchmarks' own native hooks (the tracer's floor, clock reads): a module of bench/ alone,
# never in the package's extension (tests/test_bench_hooks.py builds it into a temporary folder).
bench-hooks: $(VENV)/.stamp-base
	$(PY) bench/hooks/build.py

bench: $(VENV)/.stamp-test native bench-hooks
	$(PIP) install -r bench/requirements.txt
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) build src/*.egg-info src/stepscope/*.so bench/*.so
