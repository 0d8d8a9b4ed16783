#!/usr/bin/env bash
# `make run`: serve every role. With servers configured in the environment, on those; else on
# this machine's PostgreSQL, RabbitMQ and Redis when they are here (started if stopped); else
# the embedded mode (a SQLite file and an in-process queue), which needs nothing installed.
set -euo pipefail
host=${1:-127.0.0.1}
port=${2:-8000}
bin=.venv/bin

if [[ -n "${BATCHSERVE_DATABASE_URL:-}" ]]; then
  exec "$bin/batchserve" serve --host "$host" --port "$port"
fi

port_open() { (echo >"/dev/tcp/127.0.0.1/$1") >/dev/null 2>&1; }
have() { port_open "$2" || command -v "$1" >/dev/null 2>&1; }

if have pg_ctlcluster 5432 && have redis-server 6379 && have rabbitmq-server 5672; then
  ./scripts/ensure-services.sh
  ./scripts/ensure-database.sh batchserve
  export BATCHSERVE_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/batchserve
  export BATCHSERVE_BROKER_URL=amqp://guest:guest@127.0.0.1:5672//
  export BATCHSERVE_REDIS_URL=redis://127.0.0.1:6379/0
  "$bin/batchserve" migrate
else
  echo "make run: PostgreSQL, RabbitMQ or Redis is not installed here: running embedded" >&2
fi
exec "$bin/batchserve" serve --host "$host" --port "$port"
