# Two entry points: `make demo` (train the quickstart on a local Ray) and `make test`;
# `make bench-check` runs every benchmark's quick form (CI runs it after `make test`).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch and torchvision, pinned to the builds on this project's machines' disk.  A machine without an
# NVIDIA GPU can take PyTorch's CPU wheels instead of the default CUDA ones (no CUDA libraries:
# GBs less to download and keep), on a fresh .venv:
#   make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH ?= torch==2.14.1 torchvision==0.29.1
TORCH_INDEX ?=

.PHONY: demo test test-unit test-fast bench-check lint format install clean

$(STAMP): pyproject.toml
	@echo "install 1/4: the virtual environment $(VENV) ($(PY))"
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo "install 2/4: pip itself"
	@$(BIN)/pip install -qq --upgrade pip
	@echo "install 3/4: $(TORCH)$(if $(TORCH_INDEX), from $(TORCH_INDEX), (the biggest part: the default CUDA build is GBs; no GPU? see TORCH_INDEX in the README)) ..."
	@$(BIN)/pip install -qq $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) $(TORCH)
	@echo "install 4/4: this project and its dependencies (Ray, MLflow, Optuna, ...) ..."
	@$(BIN)/pip install -qq -e '.[test,dashboard]'
	@touch $(STAMP)
	@echo "installed: $$(du -sh $(VENV) | cut -f1) in $(VENV)"

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m orchestrator train configs/quickstart.yaml

test: $(STAMP)
	$(BIN)/python -m pytest -q

# every bench/*.py in its --quick form (tests/integration/test_benches.py): about 11 min here quiet,
# 18.5 under load (docs/benchmarks.md)
bench-check: $(STAMP)
	$(BIN)/python -m pytest -q -m bench tests/integration/test_benches.py

# the unit tier: no processes, no Ray (under a minute)
test-unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

test-fast: test-unit

# ruff (pinned in pyproject.toml): the linter's rules and the formatter's layout, checked (CI runs it first)
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# apply the formatter and the linter's safe fixes
format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf ray_runs mlruns mlflow.db .pytest_cache
