#!/usr/bin/env bash
# pool.backend = "cuda" has no device arena yet: the daemon must refuse it at start with an error
# that names the key and the value, exit non-zero, and leave no socket or shm object behind.
set -u
kvctl="$1"
tag="kvctl-cuda-refusal-$$"
out=$("$kvctl" --set pool.backend=cuda --set "pool.shm_name=/$tag" \
  --set "server.endpoint=ipc:///tmp/$tag.sock" --set server.stats_endpoint= 2>&1)
rc=$?
echo "$out"
if [ "$rc" -eq 0 ]; then echo "FAIL: kvctl exited 0 with pool.backend=cuda"; exit 1; fi
if ! grep -q 'pool.backend: got "cuda"' <<<"$out"; then echo "FAIL: error does not name the key"; exit 1; fi
if [ -e "/tmp/$tag.sock" ] || [ -e "/dev/shm/$tag" ]; then echo "FAIL: left a socket or shm"; exit 1; fi
echo "PASS: refused with exit code $rc"
