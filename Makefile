# Two entry points: `make demo` (train the quickstart on a local Ray) and `make test`;
# `make bench-check` runs every benchmark's quick form (CI runs it after `make test`).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast bench-check clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch and torchvision pinned to the builds on this machine's disk (see README)
	$(BIN)/pip install -q torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m orchestrator train configs/quickstart.yaml

test: $(STAMP)
	$(BIN)/python -m pytest -q

# every bench/*.py in its --quick form (tests/integration/test_benches.py), about 15 min here
bench-check: $(STAMP)
	$(BIN)/python -m pytest -q -m bench tests/integration/test_benches.py

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

clean:
	rm -rf ray_runs mlruns mlflow.db .pytest_cache
