#!/usr/bin/env bash
# Create the `batchserve` database on the local PostgreSQL if it does not exist yet.
set -euo pipefail
db=${1:-batchserve}
if ! psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$db'" | grep -q 1; then
  createdb -h 127.0.0.1 -U postgres "$db"
fi
