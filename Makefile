# Set-up is part of every target: a fresh machine needs only `make demo` or `make test`.
# Every environment is installed with pip from a lock (requirements/): the tested set, exactly.
VENV ?= .venv
PY := $(VENV)/bin/python
BOOTSTRAP := requirements/bootstrap.txt
LOCK := requirements/lock.txt
FLOORS_LOCK := requirements/floors.txt
LATEST_VENV := .venv-latest
FLOORS_VENV := .venv-floors
PYTEST := -m pytest -q -p no:cacheprovider --durations=20

# $(call locked_env,VENV,LOCK): a new virtual environment holding exactly LOCK, and the package
# (made anew, so that nothing a previous lock installed lingers). pip, not uv, installs: pip
# takes torch 2.13.0 from this machine's local CPU wheel (bootstrap first), uv would fetch CUDA.
define locked_env
	rm -rf $(1)
	python3 -m venv $(1)
	$(1)/bin/python -m pip install -q -r $(BOOTSTRAP)
	$(1)/bin/python -m pip install -q -r $(2)
	$(1)/bin/python -m pip install -q --no-deps -e .
	$(1)/bin/python -m pip check
	touch $(1)/.installed
endef

$(VENV)/.installed: pyproject.toml $(BOOTSTRAP) $(LOCK)
	$(call locked_env,$(VENV),$(LOCK))

$(FLOORS_VENV)/.installed: pyproject.toml $(BOOTSTRAP) $(FLOORS_LOCK)
	$(call locked_env,$(FLOORS_VENV),$(FLOORS_LOCK))

.PHONY: setup demo test test-slow test-latest test-floors lock lint docs bench notebooks
setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/gna-interp demo

# `make test` leaves out the checks marked slow (pyproject.toml); `make test-slow` runs them.
# CI runs both on the lock, once; test-latest / test-floors run the fast suite (`make test`'s set).
test: setup
	$(PY) $(PYTEST) -m "not slow"

test-slow: setup
	$(PY) $(PYTEST) -m slow

# The newest releases the ranges in pyproject.toml allow (torch held at the bootstrap's), in a
# fresh environment: what `pip install gna-interp` would give a user today. Prints which
# packages differ from the lock, then runs the suite there.
test-latest:
	rm -rf $(LATEST_VENV)
	python3 -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/python -m pip install -q -r $(BOOTSTRAP)
	$(LATEST_VENV)/bin/python -m pip install -q -c $(BOOTSTRAP) -e ".[viz,dev]"
	$(LATEST_VENV)/bin/python -m pip check
	$(LATEST_VENV)/bin/python tools/lock_drift.py $(LOCK)
	$(LATEST_VENV)/bin/python $(PYTEST) -m "not slow"

# The oldest releases the ranges allow (requirements/floors.in), locked like the main set.
test-floors: $(FLOORS_VENV)/.installed
	$(FLOORS_VENV)/bin/python tools/lock_drift.py $(LOCK)
	$(FLOORS_VENV)/bin/python $(PYTEST) -m "not slow"

# Refresh both locks: uv resolves (the newest releases in range, or the floors), for Python 3.11
# on this machine's CPU torch (its wheel lies in /opt/wheels). Then: make test test-floors.
UV_COMPILE = $(VENV)/bin/uv pip compile pyproject.toml --extra viz --extra dev --python-version 3.11 \
	--find-links /opt/wheels -c $(BOOTSTRAP) --custom-compile-command "make lock" --quiet
lock: setup
	$(UV_COMPILE) --upgrade -o $(LOCK)
	$(UV_COMPILE) --upgrade -c requirements/floors.in -o $(FLOORS_LOCK)

lint: setup
	$(VENV)/bin/ruff check gna_interp tests examples benchmarks tools
	$(VENV)/bin/ruff format --check gna_interp tests examples benchmarks tools
	$(VENV)/bin/mypy gna_interp

docs: setup
	$(VENV)/bin/mkdocs build --strict -d /tmp/gna-site

notebooks: setup
	$(PY) examples/run_notebooks.py --keep build/notebooks

bench: setup
	$(PY) benchmarks/ablation_sweep.py
