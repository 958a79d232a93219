# Set-up is part of every target: a fresh machine needs only `make demo` or `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first: 2.13.0 resolves to the local CPU wheel; an open requirement pulls CUDA builds.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[viz,dev]"
	touch $@

.PHONY: setup demo test lint docs bench notebooks
setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/gna-interp demo

test: setup
	$(PY) -m pytest -q

lint: setup
	$(VENV)/bin/ruff check gna_interp tests examples benchmarks
	$(VENV)/bin/ruff format --check gna_interp tests examples benchmarks
	$(VENV)/bin/mypy gna_interp

docs: setup
	$(VENV)/bin/mkdocs build --strict -d /tmp/gna-site

notebooks: setup
	$(PY) examples/run_notebooks.py

bench: setup
	$(PY) benchmarks/ablation_sweep.py
