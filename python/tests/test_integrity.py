# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Clients cannot corrupt what they do not own (docs/reliability.md "Page checksums"): the pool is
mapped read-only by clients and each session stages into its own object; a page changed by
another process makes FETCH (dense and blocks) and APPEND of that sequence fail closed with
DATA_LOSS (FETCH: when no FETCH verified the changed chunk since it was written, or with
pool.verify_on_fetch = "all" always), the scrubber finds it without any FETCH, other sequences
are unaffected, STATS counts it."""

import mmap
import os
import stat
import subprocess
import sys

import pytest

import kvctl
from helpers import random_kv, wait_for

LAYERS, HEADS, DIM, TOKENS = 2, 2, 64, 300

# A second process that opens the pool writable, as a process with the rights to can (root, or
# the owner after changing the mode back from 0400), and flips one byte at an offset.
FLIP = """
import mmap, os, sys
try:
    fd = os.open(sys.argv[1], os.O_RDWR)
except PermissionError:
    os.chmod(sys.argv[1], 0o600)
    fd = os.open(sys.argv[1], os.O_RDWR)
m = mmap.mmap(fd, int(sys.argv[2]) + 1, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
m[int(sys.argv[2])] ^= 0x5A
m.close()
os.close(fd)
"""


def flip_in_other_process(daemon, offset: int) -> None:
    subprocess.run([sys.executable, "-c", FLIP, "/dev/shm" + daemon.shm_name, str(offset)],
                   check=True, timeout=60)


def store(c, seq: int, seed: int):
    c.open(seq)
    k, v = random_kv(LAYERS, TOKENS, HEADS, DIM, seed=seed, dtype="float16")
    c.append(seq, k, v, use_staging=True)
    return k, v


def first_record_offset(c, seq: int) -> int:
    blocks = c.fetch_blocks(seq)
    assert len(blocks.record_offsets) > 0
    return int(blocks.record_offsets[0])


def test_pool_is_read_only_to_clients_and_staging_is_private(kvarn_daemon, connect):
    c = connect(kvarn_daemon)
    s = c.hello(LAYERS, HEADS, DIM)
    pool_path = "/dev/shm" + s.shm_name
    assert stat.S_IMODE(os.stat(pool_path).st_mode) == 0o400
    # The staging slot is the session's own object, named after the pool, mode 0600.
    assert s.staging_shm_name.startswith(s.shm_name + "-stg-")
    assert len(s.staging_shm_name) == len(s.shm_name) + 5 + 32
    assert s.staging_offset == 0 and s.staging_bytes > 0
    assert stat.S_IMODE(os.stat("/dev/shm" + s.staging_shm_name).st_mode) == 0o600
    # Another session's staging object has another unguessable name.
    other = connect(kvarn_daemon).hello(LAYERS, HEADS, DIM)
    assert other.staging_shm_name != s.staging_shm_name
    # The client's map of the pool is read-only: writing raises.
    pytest.importorskip("torch")
    from kvctl.pool_view import PoolView
    view = PoolView.from_client(c)
    with pytest.raises(TypeError):
        view._mmap[0] = 1
    view.close()
    # Staging still works end to end (APPEND reads the session's object).
    k, v = store(c, 1, seed=3)
    fk, fv, _ = c.fetch(1, stacked=True)
    assert fk.shape == (LAYERS, TOKENS, HEADS, DIM)


@pytest.mark.parametrize("verify", ["unverified", "all"])
@pytest.mark.parametrize("mode,where", [("dense", "record"), ("blocks", "record"),
                                        ("dense", "window"), ("blocks", "window"),
                                        ("blocks_layer1", "window")])
def test_a_page_changed_by_another_process_fails_fetch_closed(daemon_factory, connect, mode,
                                                              where, verify):
    # A blocks FETCH names window rows in the pool, so it verifies their pages as it verifies the
    # records' (of every layer, or of the requested layers only: blocks_layer1).
    def start():
        d = daemon_factory(pool__scrub_interval_ms=0,  # Only FETCH can find it here.
                           pool__verify_on_fetch=verify)
        c = connect(d)
        c.hello(LAYERS, HEADS, DIM)
        store(c, 1, seed=1)
        return d, c

    def offset_of(c):
        if where == "record":
            return first_record_offset(c, 1)
        # The first window row of layer 1, head 0 (a sink row: in the pool since the APPEND).
        return int(c.fetch_blocks(1, layers=1).window_offsets[0])

    d, c = start()
    if verify == "all":
        offset = offset_of(c)  # Every FETCH verifies every chunk again.
    else:
        # Asking this daemon where the row is would verify it, after which only the scrubber
        # checks it again: a second daemon given the same requests places it at the same offset.
        offset = offset_of(start()[1])
    k2, v2 = store(c, 2, seed=2)
    assert c.stats("pool")["pool"]["checksum_failures_total"] == 0
    flip_in_other_process(d, offset + 5)
    with pytest.raises(kvctl.ServerError) as e:
        if mode == "dense":
            c.fetch(1)
        else:
            c.fetch_blocks(1, layers=1 if mode == "blocks_layer1" else None)
    assert e.value.code == "DATA_LOSS" and "changed outside the daemon" in e.value.message
    # Every later request of that sequence answers the same; the other one is unaffected.
    with pytest.raises(kvctl.ServerError) as again:
        c.fetch(1)
    assert again.value.code == "DATA_LOSS"
    with pytest.raises(kvctl.ServerError) as appended:
        k, v = random_kv(LAYERS, 1, HEADS, DIM, seed=9, dtype="float16")
        c.append(1, k, v, first_position=TOKENS)
    assert appended.value.code == "DATA_LOSS"
    fk, _, _ = c.fetch(2, stacked=True)
    assert fk.shape == (LAYERS, TOKENS, HEADS, DIM)
    c.fetch_blocks(2)
    assert c.stats("pool")["pool"]["checksum_failures_total"] == 1
    assert c.close(1) > 0


def test_a_change_after_fetch_verified_it_is_the_scrubbers_to_find(daemon_factory, connect):
    # pool.verify_on_fetch = "unverified" (the default): a FETCH does not check again a chunk a
    # FETCH verified and nothing wrote since, so a change made after that is answered until the
    # scrubber's walk reaches it; from then on the sequence fails closed.
    d = daemon_factory(pool__scrub_interval_ms=0)
    c = connect(d)
    c.hello(LAYERS, HEADS, DIM)
    store(c, 1, seed=6)
    offset = first_record_offset(c, 1)
    flip_in_other_process(d, offset + 2)
    c.fetch_blocks(1)  # The documented gap: verified before the change.
    assert c.stats("pool")["pool"]["checksum_failures_total"] == 0
    # test_the_scrubber_finds_a_changed_page_without_any_fetch: the scrubber then finds it.


def test_the_scrubber_finds_a_changed_page_without_any_fetch(daemon_factory, connect):
    d = daemon_factory(pool__scrub_interval_ms=20, pool__scrub_bytes_per_second="64MiB")
    c = connect(d)
    c.hello(LAYERS, HEADS, DIM)
    store(c, 1, seed=4)
    store(c, 2, seed=5)
    # Blocks FETCH verifies too: the page is good so far, and FETCH does not check it again.
    offset = first_record_offset(c, 2)
    flip_in_other_process(d, offset)
    found = wait_for(lambda: c.stats("pool")["pool"]["checksum_failures_total"] >= 1,
                     timeout_s=120)
    assert found, "the scrubber did not report the changed page within 120 s"
    pool = c.stats("pool")["pool"]
    assert pool["checksum_failures_total"] == 1 and pool["scrubbed_bytes_total"] > 0
    with pytest.raises(kvctl.ServerError) as e:
        c.fetch(2)
    assert e.value.code == "DATA_LOSS" and "scrubber" in e.value.message
    c.fetch(1)
    with open(d.log_path) as log:
        assert "lost" in log.read()
