# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Time and process boundaries with the real daemon: timeouts and Lazy Pirate recovery, lease
expiry, a SIGKILLed engine, daemon restarts, STATS."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import kvctl
from helpers import PYTHON_DIR, random_kv, wait_for

LEASE_MS = 500


def _pool(observer):
    return observer.stats("pool")["pool"]


def _sequences(observer):
    return observer.stats("sequences")["sequences"]


def _all_threads_stopped(pid):
    states = []
    for task in os.listdir("/proc/%d/task" % pid):
        with open("/proc/%d/task/%s/stat" % (pid, task)) as f:
            states.append(f.read().rsplit(")", 1)[1].split()[0])
    return all(state in ("T", "t") for state in states)


def test_timeout_without_daemon_then_recovery_when_it_starts(daemon_factory, connect):
    d = daemon_factory(start=False)
    c = connect(d, timeout_ms=300)
    for _ in range(2):  # Twice: the recreated socket times out the same way.
        t0 = time.monotonic()
        with pytest.raises(kvctl.Timeout, match="no reply from .* within 300 ms"):
            c.ping()
        elapsed = time.monotonic() - t0
        assert 0.29 <= elapsed < 1.0, elapsed
    assert c.socket_resets == 2
    d.start()
    assert c.ping() > 0
    s = c.hello(1, 1, 64, dtype="float32")
    assert s.session_id != 0


def test_timeout_from_a_stopped_daemon_drops_the_late_reply(daemon_factory, connect):
    d = daemon_factory(quant__lossless=True)
    c = connect(d, timeout_ms=300)
    c.hello(1, 1, 8, dtype="float32")
    c.open(1)
    k = np.arange(8, dtype=np.float32).reshape(1, 1, 1, 8)
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        # kill() returns before every thread has stopped; a thread still running could answer.
        assert wait_for(lambda: _all_threads_stopped(d.proc.pid), timeout_s=5)
        with pytest.raises(kvctl.Timeout):
            c.append(1, k, k)
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    # The daemon now runs the abandoned APPEND; its reply goes to the closed socket. Later calls
    # get their own answers, and the append does happen (once: the client does not retry).
    def appended():
        fetched = c.fetch(1, stacked=True)
        return fetched if fetched.positions.size else None

    fk, _, pos = wait_for(appended, timeout_s=3)
    assert pos.tolist() == [0] and np.array_equal(fk, k)
    assert c.append(1, k, k, first_position=1).tokens_total == 2


def test_lease_expiry_frees_an_idle_session(daemon_factory, connect):
    d = daemon_factory(server__lease_ms=LEASE_MS)
    observer = connect(d)  # No session: STATS with session 0 renews nothing.
    idle, alive = connect(d), connect(d)
    for c in (idle, alive):
        c.hello(2, 2, 64, dtype="float16")
        c.open(1)
        k, v = random_kv(2, 40, 2, 64, dtype=np.float16)
        c.append(1, k, v)
    last_seen = time.monotonic()
    assert _pool(observer)["pages_used"] > 0 and _sequences(observer)["sessions"] == 2
    used_by_one = _pool(observer)["pages_used"] // 2

    def freed_one():
        alive.ping()  # Keeps `alive` leased.
        return _sequences(observer)["sessions"] == 1

    assert wait_for(freed_one, timeout_s=LEASE_MS / 1000 + 3)
    assert time.monotonic() - last_seen >= LEASE_MS / 1000 * 0.9
    assert _pool(observer)["pages_used"] == used_by_one
    assert _pool(observer)["staging_slots_used"] == 1
    assert _sequences(observer)["sessions_expired_total"] == 1
    with pytest.raises(kvctl.ServerError) as e:
        idle.fetch(1)
    assert e.value.code == "NOT_FOUND" and "session_id" in e.value.message
    assert alive.fetch(1, stacked=True).positions.tolist() == list(range(40))
    idle.hello(2, 2, 64, dtype="float16")  # A new session works.
    idle.open(1)


_ENGINE = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    import kvctl
    c = kvctl.Client(sys.argv[2], timeout_ms=5000)
    c.hello(2, 2, 64, dtype="float16", client_name="doomed")
    c.open(1)
    rng = np.random.default_rng(0)
    step = 0
    while True:
        k = rng.standard_normal((2, 4, 2, 64)).astype(np.float16)
        c.append(1, k, k, use_staging=step % 2 == 1)
        step += 1
        if step == 3:
            print("ready", flush=True)
""")


def test_pages_come_back_after_a_client_is_killed(daemon_factory, connect):
    d = daemon_factory(server__lease_ms=LEASE_MS)
    observer = connect(d)
    engine = subprocess.Popen([sys.executable, "-c", _ENGINE, PYTHON_DIR, d.endpoint],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = engine.stdout.readline()
        assert line.strip() == "ready", engine.stderr.read() if engine.poll() is not None else line
        assert _pool(observer)["pages_used"] > 0
        assert _pool(observer)["staging_slots_used"] == 1
        engine.send_signal(signal.SIGKILL)
        assert engine.wait(timeout=10) == -signal.SIGKILL
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait()

    def all_freed():
        pool, seqs = _pool(observer), _sequences(observer)
        return (pool["pages_used"], pool["staging_slots_used"], seqs["sessions"]) == (0, 0, 0)

    assert wait_for(all_freed, timeout_s=LEASE_MS / 1000 + 3), observer.stats()
    assert _sequences(observer)["tokens"] == 0


def test_daemon_restart_invalidates_old_sessions(daemon_factory, connect):
    d = daemon_factory()
    c = connect(d, timeout_ms=1000)
    c.hello(1, 1, 64, dtype="float16")
    c.open(1)
    k, v = random_kv(1, 10, 1, 64, dtype=np.float16)
    c.append(1, k, v)
    d.stop()  # SIGTERM: exit code 0, socket file and shm removed (checked by stop()).
    with pytest.raises(kvctl.Timeout):
        c.fetch(1)
    d.start()  # Same endpoint, same shm name.
    with pytest.raises(kvctl.ServerError) as e:
        c.fetch(1)
    assert e.value.code == "NOT_FOUND" and "session_id" in e.value.message
    s = c.hello(1, 1, 64, dtype="float16")
    c.open(1)
    assert c.append(1, k, v).tokens_total == 10  # Positions restart with the new sequence.
    assert s.staging_offset + s.staging_bytes <= s.pool_bytes


def test_stale_session_id_never_names_a_session_of_the_new_daemon(daemon_factory, connect):
    d = daemon_factory()
    old = connect(d, timeout_ms=1000)
    old.hello(1, 1, 64, dtype="float16")
    d.stop()
    d.start()
    newcomer = connect(d)
    newcomer.hello(1, 1, 64, dtype="float16")
    try:
        old.ping()
    except kvctl.ServerError as e:
        assert e.code == "NOT_FOUND"
    else:
        raise AssertionError("session id %d from before the restart names the new session of "
                             "client %r" % (old.session.session_id,
                                            newcomer.session.client_name))


def test_stats_sections_parse_to_numbers(lossless_daemon, connect):
    c = connect(lossless_daemon)
    everything = c.stats()
    assert {"server", "pool", "sequences", "layers", "heads", "policy", "ipc", "quality"} <= set(everything)
    for section in ("pool", "sequences"):
        fields = everything[section]
        numeric = {k: v for k, v in fields.items() if isinstance(v, (int, float))}
        assert len(numeric) >= 8, fields
    pool = everything["pool"]
    # The pool object and the per-session staging objects share pool.bytes.
    assert pool["pool_bytes"] + pool["staging_bytes"] == 32 << 20
    assert pool["page_bytes"] == 16 << 10
    assert pool["pool_shm_name"] == lossless_daemon.shm_name
    assert 0 <= pool["pages_used"] <= pool["pages"]
    assert isinstance(everything["sequences"]["compression_vs_fp16"], (int, float))
    assert everything["server"]["protocol_version"] == 1
    assert everything["server"]["pid"] == lossless_daemon.proc.pid
    assert everything["policy"]["quant_method"] == "none"
    assert list(c.stats("POOL")) == ["pool"]  # One section, case-insensitive.
    assert c.stats_text("pool").startswith("# Pool\n")
    c.hello(1, 1, 8, dtype="float32")
    c.open(5)
    c.append(5, np.ones((1, 3, 1, 8), np.float32), np.ones((1, 3, 1, 8), np.float32))
    assert c.stats("sequences")["sequences"]["tokens"] >= 3
    # Request counters are updated just after the reply is sent: poll.
    def counted():
        requests = c.stats("ipc")["ipc"]
        return requests["append_requests_total"] >= 1 and requests["hello_requests_total"] >= 1

    assert wait_for(counted, timeout_s=2)
