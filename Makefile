# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: install demo test bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[torch,dev,hf,lightning]'
	touch $(STAMP)

demo: install
	SPOTRUN_HOME=$(CURDIR)/.demo $(VENV)/bin/spotrun demo

test: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: install
	$(PY) bench/policy.py
	$(PY) bench/checkpoint.py

clean:
	rm -rf $(VENV) .demo .pytest_cache
