#!/usr/bin/env bash
# Start PostgreSQL, RabbitMQ and Redis on this machine if their ports are closed, and wait for
# them. Used by `make run` and `make test`; safe to run when they are already up.
set -euo pipefail

port_open() { (echo >"/dev/tcp/127.0.0.1/$1") >/dev/null 2>&1; }

wait_port() {
  local name=$1 port=$2 tries=${3:-120}
  for _ in $(seq "$tries"); do
    port_open "$port" && return 0
    sleep 0.5
  done
  echo "ensure-services: $name did not open port $port" >&2
  return 1
}

if ! port_open 5432; then
  echo "ensure-services: starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
  wait_port PostgreSQL 5432
fi

if ! port_open 6379; then
  echo "ensure-services: starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  wait_port Redis 6379
fi

if ! port_open 5672; then
  echo "ensure-services: starting RabbitMQ"
  rabbitmq-server -detached
  rabbitmqctl await_startup --timeout 120 >/dev/null
  wait_port RabbitMQ 5672
fi
