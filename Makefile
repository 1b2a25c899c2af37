# Two commands do all the set-up: `make demo` and `make test` (see README.md).
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q

.PHONY: demo test lint bench native clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade "setuptools>=68" wheel

# Base install (no extras): what `make demo` needs.
$(VENV)/.stamp-base: pyproject.toml setup.py | $(PY)
	$(PIP) install -e .
	touch $@

# Test install: every extra, torch pinned to the local 2.13.0 wheel.
$(VENV)/.stamp-test: pyproject.toml setup.py $(VENV)/.stamp-base
	$(PIP) install -e ".[dev,torch,prometheus,otlp]"
	touch $@

# Rebuild the C extension in place whenever its sources change.
native: $(VENV)/.stamp-base
	$(PY) setup.py -q build_ext --inplace

demo: $(VENV)/.stamp-base native
	$(PY) examples/train_loop.py

test: $(VENV)/.stamp-test native
	$(PY) -m pytest -q

lint: $(VENV)/.stamp-test
	$(PY) -m ruff check src tests bench examples
	$(PY) -m ruff format --check src tests bench examples
	$(PY) -m mypy

bench: $(VENV)/.stamp-test native
	$(PIP) install -r bench/requirements.txt
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) build src/*.egg-info src/stepscope/*.so
