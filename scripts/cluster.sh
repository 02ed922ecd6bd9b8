#!/usr/bin/env bash
# A local cluster on loopback: PostgreSQL (scripts/postgres.sh), three longrank replicas sharing it and one data
# directory (read-only: build collections with `longrank index` first), and HAProxy in front
# (deploy/haproxy.cfg).
#   scripts/cluster.sh up DIR [DATA_DIR]   starts it (state and logs in DIR); prints the front's URL
#   scripts/cluster.sh down DIR            stops it
# LONGRANK_BIN names the binary (default target/release/longrank, from `cargo build --release`); other
# LONGRANK_* settings pass through to the replicas.
set -euo pipefail

usage() { echo "usage: $0 up DIR [DATA_DIR] | down DIR" >&2; exit 2; }
[ $# -ge 2 ] || usage
action=$1
dir=$(realpath -m "$2")
data=$(realpath -m "${3:-data}")
replicas=3 # one `server rN` line each in deploy/haproxy.cfg
bin=$(realpath -m "${LONGRANK_BIN:-target/release/longrank}")
cd "$(dirname "$0")/.."

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_healthy() { # url seconds
  local deadline=$((SECONDS + $2))
  until curl -fsS -o /dev/null "$1/health" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || { echo "ERROR: $1 not ready after $2 s" >&2; return 1; }
    sleep 0.2
  done
}

case $action in
up)
  [ -x "$bin" ] || { echo "ERROR: $bin is missing (cargo build --release, or set LONGRANK_BIN)" >&2; exit 1; }
  command -v haproxy >/dev/null || { echo "ERROR: HAProxy is not installed (apt-get install haproxy)" >&2; exit 1; }
  mkdir -p "$dir"
  chmod 755 "$dir"
  url=$(bash scripts/postgres.sh start "$dir/pg")
  for i in $(seq 1 "$replicas"); do
    port=$(free_port)
    LONGRANK_STORE_URL="$url" LONGRANK_SERVER_REPLICA_ID="r$i" LONGRANK_DATA_DIR="$data" \
      "$bin" serve --addr "127.0.0.1:$port" >"$dir/r$i.log" 2>&1 &
    echo $! >"$dir/r$i.pid"
    echo "127.0.0.1:$port" >"$dir/r$i.addr"
    export "LONGRANK_REPLICA_$i=127.0.0.1:$port"
  done
  for i in $(seq 1 "$replicas"); do
    wait_healthy "http://$(cat "$dir/r$i.addr")" 120
  done
  front="127.0.0.1:$(free_port)"
  LONGRANK_FRONT="$front" haproxy -q -D -p "$dir/haproxy.pid" -f deploy/haproxy.cfg
  echo "$front" >"$dir/front.addr"
  wait_healthy "http://$front" 30
  echo "http://$front"
  ;;
down)
  for pidfile in "$dir"/haproxy.pid "$dir"/r*.pid; do
    [ -f "$pidfile" ] || continue
    kill "$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
  done
  bash scripts/postgres.sh stop "$dir/pg"
  ;;
*) usage ;;
esac
