#!/usr/bin/env bash
# A throwaway PostgreSQL server on loopback, for the tests and the local cluster (Debian's `postgresql`).
#   scripts/postgres.sh start DIR   initializes DIR, starts the server on a free port, writes the URL of its
#                                   database `longrank` to DIR/url (a random password, in no log) and prints it
#   scripts/postgres.sh stop DIR    stops it (DIR stays; `rm -rf DIR` forgets it)
# initdb refuses to run as root: as root the server runs as the `postgres` user.
set -euo pipefail

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
action=$1
dir=$(realpath -m "$2")

bin=$(printf "%s\n" /usr/lib/postgresql/*/bin | sort -V | tail -1)
[ -x "$bin/initdb" ] || { echo "ERROR: PostgreSQL is not installed (apt-get install postgresql)" >&2; exit 1; }

as_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case $action in
start)
  mkdir -p "$dir"
  if [ ! -f "$dir/data/PG_VERSION" ]; then
    password=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
    umask 077
    printf '%s\n' "$password" >"$dir/password"
    [ "$(id -u)" = 0 ] && chown postgres "$dir" "$dir/password"
    as_owner "$bin/initdb" -D "$dir/data" -U longrank --pwfile="$dir/password" --auth=scram-sha-256 \
      -E UTF8 --locale=C.UTF-8 --no-sync >"$dir/initdb.log" 2>&1 \
      || { cat "$dir/initdb.log" >&2; exit 1; }
  fi
  port=$(python3 "$(dirname "$0")/free-port.py")
  # Durability off: the server is thrown away with its directory.
  as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start \
    -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off \
        -c full_page_writes=off -c max_connections=200" >/dev/null
  PGPASSWORD=$(cat "$dir/password") "$bin/psql" -qAt -h 127.0.0.1 -p "$port" -U longrank -d postgres \
    -c "SELECT 1 FROM pg_database WHERE datname = 'longrank'" | grep -q 1 \
    || PGPASSWORD=$(cat "$dir/password") "$bin/createdb" -h 127.0.0.1 -p "$port" -U longrank longrank
  echo "postgres://longrank:$(cat "$dir/password")@127.0.0.1:$port/longrank" >"$dir/url"
  cat "$dir/url"
  ;;
stop)
  [ -f "$dir/data/PG_VERSION" ] || exit 0
  as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
  ;;
*) usage ;;
esac
