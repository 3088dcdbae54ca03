#!/usr/bin/env bash
# The README's main job: set up and build, start the kvctl daemon on configs/default.toml (CPU
# pool), run a short engine-like client session against it (prefill, token-by-token decode
# through shared-memory staging, dense fetch, STATS), then stop the daemon with SIGTERM.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh

CONFIG=${KVCTL_CONFIG_FILE:-configs/default.toml}
ENDPOINT=$(sed -n 's/^endpoint *= *"\(.*\)".*/\1/p' "$CONFIG" | head -n1)
./build/bin/kvctl --config "$CONFIG" &
DAEMON=$!
trap 'kill -TERM $DAEMON 2>/dev/null || true; wait $DAEMON 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  [ -S "${ENDPOINT#ipc://}" ] && break
  kill -0 $DAEMON 2>/dev/null || { echo "run.sh: kvctl exited at start" >&2; exit 1; }
  sleep 0.1
done
./build/bin/kvdemo --endpoint "$ENDPOINT" "$@"
kill -TERM $DAEMON
wait $DAEMON
trap - EXIT
echo "kvctl stopped cleanly"
