#!/usr/bin/env bash
# A local cluster on loopback: PostgreSQL (scripts/postgres.sh), three longrank replicas sharing it and one data
# directory (read-only: build collections with `longrank index` first), and HAProxy in front
# (deploy/haproxy.cfg). With LONGRANK_STORE_OBJECTS set (an object store, docs/operations.md "Collections through an object
# store"), each replica has a data directory of its own (DIR/rN.data, empty at first) that it pulls the
# collections into, one of them writes, and collection writes go through any of them.
#   scripts/cluster.sh up DIR [DATA_DIR] [MODEL]
#                                          starts it (state and logs in DIR); prints the front's URL. MODEL (a
#                                          directory or hub id; default LONGRANK_MODEL_PATH, else none: BM25
#                                          only, no hub tried) is every replica's default model
#   scripts/cluster.sh restart DIR N       restarts replica N (killed or not) on its address; HAProxy's health
#                                          checks take it back into rotation once it is ready
#   scripts/cluster.sh add DIR             starts one more replica (the next number) and, once it is ready,
#                                          reloads HAProxy with it in rotation (no request lost); prints its N
#   scripts/cluster.sh down DIR            stops it
# Runs from any directory. LONGRANK_BIN names the binary (default: the release build of this repository,
# under CARGO_TARGET_DIR when set); other LONGRANK_* settings pass through to the replicas.
set -euo pipefail

usage() { echo "usage: $0 up DIR [DATA_DIR] [MODEL] | restart DIR N | add DIR | down DIR" >&2; exit 2; }
[ $# -ge 2 ] || usage
action=$1
dir=$(realpath -m "$2")
root=$(cd "$(dirname "$0")/.." && pwd)
replicas=3 # at `up`; `add` starts more
bin=$(realpath -m "${LONGRANK_BIN:-${CARGO_TARGET_DIR:-$root/target}/release/longrank}")
[ "$action" = up ] && data=$(realpath -m "${3:-data}")
# The replicas read the repository's config.toml.
cd "$root"

free_port() {
  python3 "$root/scripts/free-port.py"
}

wait_healthy() { # url seconds
  local deadline=$((SECONDS + $2))
  until curl -fsS -o /dev/null "$1/health" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || { echo "ERROR: $1 not ready after $2 s" >&2; return 1; }
    sleep 0.2
  done
}

start_replica() { # N: on the address in DIR/rN.addr, with the store and data directory `up` recorded
  local i=$1 data_dir
  data_dir=$(cat "$dir/data.dir")
  [ -n "${LONGRANK_STORE_OBJECTS:-}" ] && data_dir="$dir/r$i.data"
  env -u LONGRANK_BIN LONGRANK_STORE_URL="$(cat "$dir/pg/url")" LONGRANK_SERVER_REPLICA_ID="r$i" \
    LONGRANK_DATA_DIR="$data_dir" LONGRANK_MODEL_PATH="$(cat "$dir/model")" \
    "$bin" serve --addr "$(cat "$dir/r$i.addr")" >>"$dir/r$i.log" 2>&1 &
  echo $! >"$dir/r$i.pid"
}

# HAProxy's configuration: deploy/haproxy.cfg with one `server` line per replica of DIR, in number order.
write_haproxy_cfg() {
  {
    cat "$root/deploy/haproxy.cfg"
    for addr in $(ls "$dir"/r*.addr | sort -V); do
      echo "    server $(basename "$addr" .addr) $(cat "$addr")"
    done
  } >"$dir/haproxy.cfg"
}

case $action in
up)
  [ -x "$bin" ] || { echo "ERROR: $bin is missing (cargo build --release, or set LONGRANK_BIN)" >&2; exit 1; }
  command -v haproxy >/dev/null || { echo "ERROR: HAProxy is not installed (apt-get install haproxy)" >&2; exit 1; }
  mkdir -p "$dir"
  chmod 755 "$dir"
  bash "$root/scripts/postgres.sh" start "$dir/pg" >/dev/null
  echo "$data" >"$dir/data.dir"
  echo "${4:-${LONGRANK_MODEL_PATH:-}}" >"$dir/model"
  for i in $(seq 1 "$replicas"); do
    echo "127.0.0.1:$(free_port)" >"$dir/r$i.addr"
    start_replica "$i"
  done
  for i in $(seq 1 "$replicas"); do
    wait_healthy "http://$(cat "$dir/r$i.addr")" 120
  done
  front="127.0.0.1:$(free_port)"
  echo "$front" >"$dir/front.addr"
  write_haproxy_cfg
  # Master-worker mode: a reload (SIGUSR2 to the master) passes the listening socket on to the new worker, so
  # no connection is refused meanwhile.
  LONGRANK_FRONT="$front" haproxy -q -W -D -p "$dir/haproxy.pid" -f "$dir/haproxy.cfg"
  wait_healthy "http://$front" 30
  echo "http://$front"
  ;;
restart)
  [ $# -eq 3 ] && [ -f "$dir/r$3.addr" ] || usage
  if [ -f "$dir/r$3.pid" ] && kill "$(cat "$dir/r$3.pid")" 2>/dev/null; then
    while kill -0 "$(cat "$dir/r$3.pid")" 2>/dev/null; do sleep 0.1; done
  fi
  start_replica "$3"
  wait_healthy "http://$(cat "$dir/r$3.addr")" 120
  ;;
add)
  [ $# -eq 2 ] && [ -f "$dir/front.addr" ] || usage
  n=$(($(ls "$dir"/r*.addr | wc -l) + 1))
  echo "127.0.0.1:$(free_port)" >"$dir/r$n.addr"
  start_replica "$n"
  wait_healthy "http://$(cat "$dir/r$n.addr")" 120
  write_haproxy_cfg
  kill -USR2 "$(cat "$dir/haproxy.pid")"
  echo "$n"
  ;;
down)
  for pidfile in "$dir"/haproxy.pid "$dir"/r*.pid; do
    [ -f "$pidfile" ] || continue
    kill "$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
  done
  bash "$root/scripts/postgres.sh" stop "$dir/pg"
  ;;
*) usage ;;
esac
