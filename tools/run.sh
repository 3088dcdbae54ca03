#!/usr/bin/env bash
# The README's first command: install what is missing (tools/setup.sh --deps-only), build only the
# daemon binary into build-demo/ (no tests, tools, CUDA or torch extension: the demo's short
# sequence decodes on the dense path, which needs none of them), start it on $KVCTL_CONFIG
# (default configs/default.toml, the same variable the daemon reads for its --config), then run
# `python3 -m kvctl.hf`: SmolLM2-135M generates a greedy continuation whose KV cache lives in the
# daemon, then the same prompt with an uncompressed cache as the baseline, and a short summary.
# One line per stage with the seconds since start; the daemon is stopped with SIGTERM at the end.
# Extra arguments go to the demo (python3 -m kvctl.hf --help): --prompt TEXT, --max-new-tokens N,
# --send-queries, --stats, --no-baseline. tools/test.sh builds everything else, in build/.
set -euo pipefail
cd "$(dirname "$0")/.."
# The demo's own stage lines count from the same start (kvctl.hf reads KVCTL_DEMO_T0).
export KVCTL_DEMO_T0=$EPOCHREALTIME
T0_US=${EPOCHREALTIME/./}
# CPU seconds (user + system) of the finished child processes, in $CPU: the build's cost on a
# quiet machine is about this over the cores, whatever else shares them. (`times` must run in
# this shell, not in a $(...) subshell, to see its children.)
cpu_seconds() {
  times >"$BUILD/times.txt"
  CPU=$(awk 'NR == 2 { split($1, u, /[ms]/); split($2, s, /[ms]/);
                       printf "%.0f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$BUILD/times.txt")
}
stage() {
  local us=$((${EPOCHREALTIME/./} - T0_US))
  printf '[%4d.%ds] run.sh: %s\n' $((us / 1000000)) $((us / 100000 % 10)) "$*"
}
BUILD=build-demo
LOG=$BUILD/run.log
mkdir -p "$BUILD"

stage "setup: Debian packages and pinned pip requirements (tools/setup.sh --deps-only)"
bash tools/setup.sh --deps-only

stage "configure: $BUILD/ (Release; tests, CUDA and torch extension off)"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKVCTL_BUILD_TESTS=OFF -DKVCTL_CUDA=OFF \
  -DKVCTL_TORCH=OFF ${KVCTL_CMAKE_ARGS:-} >"$LOG" 2>&1 || { cat "$LOG" >&2; exit 1; }

# Make prints "[ 42%] Building CXX object ..." per file; one short line each, the full log on
# failure. The percentage counts the kvctl target's own objects only.
stage "build: the kvctl daemon, $(nproc) jobs (KVCTL_JOBS to change)"
set +e
cmake --build "$BUILD" -j "${KVCTL_JOBS:-$(nproc)}" --target kvctl 2>&1 | tee -a "$LOG" |
  while IFS= read -r line; do
    if [[ $line =~ ^\[\ *([0-9]+)%\]\ (Building|Linking)\ [A-Za-z+]+\ (object|executable)\ (.*)$ ]]
    then
      stage "build ${BASH_REMATCH[1]}%: ${BASH_REMATCH[4]##*/}"
    fi
  done
rc=${PIPESTATUS[0]}
set -e
[ "$rc" -eq 0 ] || { echo "run.sh: the build failed; its output:" >&2; cat "$LOG" >&2; exit 1; }
cpu_seconds
stage "build: done, $BUILD/bin/kvctl ($CPU s of CPU so far, setup and build)"

CONFIG=${KVCTL_CONFIG:-configs/default.toml}
export KVCTL_CONFIG=$CONFIG
ENDPOINT=$(sed -n 's/^endpoint *= *"\(.*\)".*/\1/p' "$CONFIG" | head -n1)
ENDPOINT=${KVCTL_SERVER_ENDPOINT:-${ENDPOINT:-ipc:///tmp/kvctl.sock}}
stage "daemon: $BUILD/bin/kvctl --config $CONFIG (endpoint $ENDPOINT)"
# A pool or socket left by a daemon that was killed does not stop the demo: the daemon removes a
# leftover shm object or socket when no live process holds it (pool.unlink_stale, on by default),
# and the wait below accepts only a socket made after this start.
STARTED=$(mktemp)
"$BUILD/bin/kvctl" --config "$CONFIG" &
DAEMON=$!
trap 'kill -TERM $DAEMON 2>/dev/null || true; wait $DAEMON 2>/dev/null || true; rm -f "$STARTED"' \
  EXIT
# A tcp endpoint has no file to wait for; ZeroMQ delivers the demo's HELLO once the daemon binds.
for ((i = 0; i < 600; i++)); do
  [[ $ENDPOINT == ipc://* ]] || break
  kill -0 $DAEMON 2>/dev/null ||
    { echo "run.sh: kvctl exited at start (see its message above)" >&2; exit 1; }
  [ -S "${ENDPOINT#ipc://}" ] && [ "${ENDPOINT#ipc://}" -nt "$STARTED" ] && break
  sleep 0.1
done
[ "$i" -lt 600 ] || { echo "run.sh: no socket at ${ENDPOINT#ipc://} after 60 s" >&2; exit 1; }

stage "demo: python3 -m kvctl.hf (model load, generation through kvctl, baseline)"
# torch's OpenMP threads spin at every barrier by default: on a machine whose cores are busy with
# other work a spinning thread waits for one that is not scheduled (the baseline's 2-thread SDPA
# sat in barrier waits for minutes here, seen with gdb). Passive waiting costs little when idle.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" python3 -m kvctl.hf --endpoint "$ENDPOINT" "$@"
kill -TERM $DAEMON
wait $DAEMON
trap - EXIT
rm -f "$STARTED"
stage "kvctl stopped cleanly"
