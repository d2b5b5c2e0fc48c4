# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# Four workers, one test module each at a time (module fixtures stay whole), even on 2 cores:
# most tests wait on processes and paced market clocks, so fewer workers leave the cores idle
# (2-core box, same tree: 1,061 s with four, 1,180-1,220 s with three; docs/benchmarks.md).
# The load fixture shares its busy loops among the workers: the machine carries the same load.
# Modules go out in collection order, which tests/conftest.py starts with the longest (xdist
# would sort them by test count). TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 4

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
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

bench: install
	$(PY) bench/policy.py
	$(PY) bench/checkpoint.py

clean:
	rm -rf $(VENV) .demo .pytest_cache
