#!/usr/bin/env bash
# Installs what kvctl needs on a fresh Debian 12 machine and builds it into build/.
# Idempotent: apt runs only when a package is missing; pip only when a pin is unmet.
# --deps-only: install, but build nothing (tools/run.sh builds just the daemon, in build-demo/).
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(cmake g++ make pkg-config libzmq3-dev cppzmq-dev libboost-dev libtomlplusplus-dev
  catch2 libspdlog-dev libcli11-dev libncurses-dev libbenchmark-dev tmux
  clang-14 libclang-rt-14-dev libomp-14-dev  # These three: tools/fuzz.sh, tools/sanitize.sh.
  libhiredis-dev redis-server redis-tools)  # These three: the cluster tier (tier/, docs/tier.md).

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# True when every `name==version` pin of the requirement files is installed at that version (a
# second instead of pip's ~30 s of resolving when nothing is missing).
pins_met() {
  python3 - "$@" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
for path in sys.argv[1:]:
    for line in open(path):
        spec = line.split("#")[0].strip()
        if not spec:
            continue
        name, _, want = spec.partition("==")
        try:
            if not want or version(name.strip()) != want.strip():
                sys.exit(1)
        except PackageNotFoundError:
            sys.exit(1)
PY
}

REQS=(python/requirements.txt tools/requirements.txt python/requirements-model.txt
  python/requirements-nodeps.txt)
if [ "${KVCTL_SKIP_PIP:-0}" != "1" ] && ! pins_met "${REQS[@]}"; then
  PIP=(python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore)
  for req in python/requirements.txt tools/requirements.txt python/requirements-model.txt; do
    [ -f "$req" ] && "${PIP[@]}" -r "$req"
  done
  "${PIP[@]}" --no-deps -r python/requirements-nodeps.txt
fi

[ "${1:-}" = "--deps-only" ] && exit 0
JOBS=${KVCTL_JOBS:-$(nproc)}
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${KVCTL_CMAKE_ARGS:-} >/dev/null
cmake --build build -j "$JOBS"
