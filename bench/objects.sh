#!/usr/bin/env bash
# Collections through an object store (issue 40, item 4), on loopback: the 200,000-document synthetic collection
# indexed and published to a file:// object store beside a throwaway PostgreSQL; then the time until an empty
# replica serves it (`serve` started to `/health` ready, its pull included) against copying the collection's
# directory and starting a replica on the copy; then an incremental commit of 1,000 new documents through the
# writer (the first replica): the bytes it uploads, and the bytes a second replica fetches to serve it.
# usage: bench/objects.sh [WORK_DIR=/tmp/longrank-objects] [DOCUMENTS=200000]   (BIN: the binary)
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="$(realpath -m "${1:-/tmp/longrank-objects}")"
N="${2:-200000}"
SHARED="$(realpath "${LONGRANK_SHARED:-../shared}")"
BIN="${BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/longrank-target}/release/longrank}"
export RUST_LOG=info
mkdir -p "$WORK"
[ -s "$WORK/synth/docs.jsonl" ] || python3 "$SHARED/bench/synth_collection.py" "$WORK/synth" "$N" 42 > /dev/null
head -n 1000 "$WORK/synth/docs.jsonl" | sed 's/"id": *"\([^"]*\)"/"id": "new-\1"/' > "$WORK/new.jsonl"
rm -rf "$WORK/pg" "$WORK/objects" "$WORK/writer" "$WORK/replica" "$WORK/copy" "$WORK/follower"
bash scripts/postgres.sh start "$WORK/pg" > /dev/null
cleanup() {
  for pid in $(jobs -p); do kill "$pid" 2> /dev/null || true; done
  bash scripts/postgres.sh stop "$WORK/pg" > /dev/null
}
trap cleanup EXIT
export LONGRANK_STORE_URL="$(cat "$WORK/pg/url")" LONGRANK_STORE_OBJECTS="file://$WORK/objects"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
echo "== index and publish $N documents"
/usr/bin/time -f "index + publish: %e s, peak RSS %M KB" "$BIN" --data-dir "$WORK/writer" index --collection synth \
  "$WORK/synth/docs.jsonl" 2>&1 | grep -E "published|index \+ publish|^collection synth"
du -sb "$WORK/writer/collections/synth" "$WORK/objects" | sed 's/^/bytes: /'

echo "== an empty replica, from the object store (it becomes the writer)"
port=$(free_port)
start=$EPOCHREALTIME
"$BIN" --data-dir "$WORK/replica" serve --addr "127.0.0.1:$port" > "$WORK/replica.log" 2>&1 &
until curl -fs "127.0.0.1:$port/health" > /dev/null; do sleep 0.05; done
python3 -c "print(f'serving after {$EPOCHREALTIME - $start:.2f} s (process start to /health ready)')"
grep -o 'pulled the newest version.*' "$WORK/replica.log" | sed 's/\x1b\[[0-9;]*m//g'

echo "== a replica on a copy of the directory (no object store)"
start=$EPOCHREALTIME
mkdir -p "$WORK/copy/collections"
cp -r "$WORK/writer/collections/synth" "$WORK/copy/collections/"
sync
copied=$EPOCHREALTIME
port2=$(free_port)
env -u LONGRANK_STORE_URL -u LONGRANK_STORE_OBJECTS "$BIN" --data-dir "$WORK/copy" serve --addr "127.0.0.1:$port2" \
  > "$WORK/copy.log" 2>&1 &
until curl -fs "127.0.0.1:$port2/health" > /dev/null; do sleep 0.05; done
python3 -c "print(f'serving after {$EPOCHREALTIME - $start:.2f} s (cp -r and sync {$copied - $start:.2f} s, then start)')"

echo "== a second empty replica, a follower"
port3=$(free_port)
"$BIN" --data-dir "$WORK/follower" serve --addr "127.0.0.1:$port3" > "$WORK/follower.log" 2>&1 &
until curl -fs "127.0.0.1:$port3/health" > /dev/null; do sleep 0.05; done

echo "== an incremental commit of 1,000 documents (sent to the writer by longrank index)"
"$BIN" --data-dir "$WORK/writer" index --collection synth "$WORK/new.jsonl" 2>&1 | grep -E "published"
grep -o 'published a version.*' "$WORK/replica.log" | sed 's/\x1b\[[0-9;]*m//g'
until grep -q 'version=2' "$WORK/follower.log"; do sleep 0.1; done
grep -o 'pulled the newest version.*version=2.*' "$WORK/follower.log" | sed 's/\x1b\[[0-9;]*m//g'
