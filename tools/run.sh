#!/usr/bin/env bash
# The README's main job: set up and build, start the kvctl daemon on configs/default.toml (CPU
# pool), generate a continuation of a prompt with SmolLM2-135M (HF transformers, CPU, float32)
# whose KV cache lives in the daemon (python/kvctl/hf.py), print the text, the bits/element,
# the memory against an fp16 cache and a STATS snapshot, then stop the daemon with SIGTERM.
# Extra arguments go to the generator: --prompt TEXT, --max-new-tokens N.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh

CONFIG=${KVCTL_CONFIG_FILE:-configs/default.toml}
ENDPOINT=$(sed -n 's/^endpoint *= *"\(.*\)".*/\1/p' "$CONFIG" | head -n1)
# A pool or socket left by a daemon that was killed does not stop the demo: the daemon removes a
# leftover shm object or socket when no live process holds it (pool.unlink_stale, on by default),
# and the wait below accepts only a socket made after this start.
STARTED=$(mktemp)
./build/bin/kvctl --config "$CONFIG" &
DAEMON=$!
trap 'kill -TERM $DAEMON 2>/dev/null || true; wait $DAEMON 2>/dev/null || true; rm -f "$STARTED"' EXIT
for _ in $(seq 1 100); do
  kill -0 $DAEMON 2>/dev/null || { echo "run.sh: kvctl exited at start (see its message above)" >&2; exit 1; }
  [ -S "${ENDPOINT#ipc://}" ] && [ "${ENDPOINT#ipc://}" -nt "$STARTED" ] && break
  sleep 0.1
done
PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" python3 -m kvctl.hf --endpoint "$ENDPOINT" "$@"
kill -TERM $DAEMON
wait $DAEMON
trap - EXIT
rm -f "$STARTED"
echo "kvctl stopped cleanly"
