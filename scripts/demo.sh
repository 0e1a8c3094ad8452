#!/usr/bin/env bash
# Starts an embedded dev server on a free port, shows conlock run and sem against it,
# and always stops the server (also on Ctrl-C).
set -euo pipefail
bin=${1:-target/debug/conlock}  # make demo passes the debug build it made
out=$(mktemp)
# The server runs in its own session, so a Ctrl-C on the terminal does not stop it
# before the demo's jobs have released their locks against it.
setsid "$bin" dev-server --addr 127.0.0.1:0 --session-ttl-min 1s >"$out" &
server=$!
cleanup() {
  # Stop the demo's jobs first (they release against the running server), then the server.
  local p
  for p in $(jobs -p); do
    if [ "$p" != "$server" ]; then kill -TERM "$p" 2>/dev/null || true; fi
  done
  for p in $(jobs -p); do
    if [ "$p" != "$server" ]; then wait "$p" 2>/dev/null || true; fi
  done
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  rm -f "$out"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
for _ in $(seq 1 100); do grep -q 'listening on' "$out" && break; sleep 0.05; done
cat "$out"
addr=$(sed -n 's/.*listening on \(http:\/\/[0-9.:]*\).*/\1/p' "$out" | head -n1)
[ -n "$addr" ] || { echo "demo: the dev server did not start" >&2; exit 1; }
export CONSUL_HTTP_ADDR=$addr

echo
echo "== conlock run: two jobs contend for one lock; they take turns =="
pids=()
for name in alpha beta; do
  "$bin" run --key demo/leader -- sh -c "echo \"  $name: got the lock (fencing token \$CONLOCK_MODIFY_INDEX)\"; sleep 1; echo \"  $name: done\"" &
  pids+=($!)
done
wait "${pids[@]}"

echo
echo "== conlock run --timeout 0s: skip if busy (exit 75) =="
"$bin" run --key demo/leader --session-name "demo holder" -- sleep 2 &
holder=$!
sleep 0.5
echo "-- conlock status --key demo/leader:"
"$bin" status --key demo/leader | sed 's/^/  /' || true
echo "-- a second job with --timeout 0s:"
set +e
"$bin" run --key demo/leader --timeout 0s -- echo "never printed"
echo "  exit code: $? (75 = busy)"
set -e
wait "$holder"

echo
echo "== conlock sem: four workers, two slots =="
pids=()
for n in 1 2 3 4; do
  "$bin" sem --limit 2 --prefix demo/workers -- sh -c "echo \"  worker $n: in a slot\"; sleep 1; echo \"  worker $n: leaving\"" &
  pids+=($!)
done
wait "${pids[@]}"
echo
echo "demo finished; stopping the dev server"
