# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Helpers shared by the tests (a plain module: pytest puts python/tests on sys.path): the
daemon process, synthetic KV data, polling."""

import glob
import itertools
import os
import signal
import subprocess
import time

import numpy as np
import pytest

import kvctl
from kvctl.process import DaemonStartError, spawn_daemon, wait_until_serving

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(PYTHON_DIR)


def wait_for(predicate, timeout_s: float, interval_s: float = 0.05):
    """Polls predicate() until it returns a truthy value (returned) or the timeout passes; then
    returns the last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval_s)


def random_kv(layers, tokens, heads, head_dim, seed=0, dtype=np.float32):
    """K and V [layers, tokens, heads, head_dim]: Gaussian rows with per-channel scales and an
    outlier channel, like real keys."""
    rng = np.random.default_rng(seed)
    scale = rng.uniform(0.5, 2.0, size=(layers, 1, heads, head_dim)).astype(np.float32)
    scale[..., 3] *= 8.0
    k = (rng.standard_normal((layers, tokens, heads, head_dim), dtype=np.float32) * scale)
    v = rng.standard_normal((layers, tokens, heads, head_dim), dtype=np.float32)
    return k.astype(dtype), v.astype(dtype)


def relative_mse(got, want) -> float:
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    return float(np.sum((got - want) ** 2) / np.sum(want ** 2))


_names = itertools.count()


def kvctl_binary() -> str:
    return os.environ.get("KVCTL_BIN") or os.path.join(REPO, "build", "bin", "kvctl")


class Daemon:
    """One kvctl process. settings are config keys passed as --set KEY=VALUE."""

    def __init__(self, workdir: str, settings: dict, name: str = ""):
        n = next(_names)
        self.name = name or "d%d" % n
        self.workdir = workdir
        self.socket_path = os.path.join(workdir, "%s.sock" % self.name)
        self.endpoint = "ipc://" + self.socket_path
        self.stats_socket_path = os.path.join(workdir, "%s-stats.sock" % self.name)
        self.shm_name = "/kvpy-%d-%d" % (os.getpid(), n)
        self.log_path = os.path.join(workdir, "%s.log" % self.name)
        self.settings = {
            "server.endpoint": self.endpoint,
            # Its own stats socket: a daemon refuses a path another live daemon publishes on.
            "server.stats_endpoint": "ipc://" + self.stats_socket_path,
            "pool.shm_name": self.shm_name,
            "pool.bytes": "32MiB",
            "pool.page_bytes": "16KiB",
            # Sessions keep their slot until their lease ends: enough slots for every test
            # session of a shared daemon.
            "pool.staging_slots": 24,
            "pool.staging_bytes_per_session": "512KiB",
            "server.lease_ms": 10000,
            "server.log_level": "info",
        }
        self.settings.update(settings)
        self.proc = None

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def start(self, timeout_s: float = 10.0) -> "Daemon":
        binary = kvctl_binary()
        if not os.access(binary, os.X_OK):
            pytest.fail("kvctl binary not found at %s: build it (cmake --build build --target "
                        "kvctl) or set KVCTL_BIN" % binary, pytrace=False)
        self.proc = spawn_daemon(binary, self.settings, self.log_path)
        try:
            wait_until_serving(self.proc, self.endpoint, timeout_s)
        except DaemonStartError as e:
            self.kill()
            pytest.fail("%s:\n%s" % (e, self.log()), pytrace=False)
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM; asserts a clean exit (0) and that the socket file and the shm are gone."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail("kvctl did not stop within 15 s of SIGTERM:\n%s" % self.log(),
                        pytrace=False)
        assert rc == 0, "kvctl exited with %d after SIGTERM:\n%s" % (rc, self.log())
        assert not os.path.exists(self.socket_path), "socket file left: " + self.socket_path
        if self.settings["server.stats_endpoint"] == "ipc://" + self.stats_socket_path:
            assert not os.path.exists(self.stats_socket_path), \
                "stats socket file left: " + self.stats_socket_path
        shm = "/dev/shm/" + self.shm_name.lstrip("/")
        assert not os.path.exists(shm), "shm object left: " + shm
        assert not self.staging_objects(), "staging objects left: %s" % self.staging_objects()

    def staging_objects(self):
        """Paths of the per-session staging objects of this daemon's pool in /dev/shm."""
        return glob.glob("/dev/shm/" + self.shm_name.lstrip("/") + "-stg-*")

    def crash(self) -> None:
        """SIGKILL, leaving what a dead daemon leaves (socket files, the shm object): the next
        start() must cope with them by itself."""
        proc, self.proc = self.proc, None
        proc.kill()
        proc.wait()

    def kill(self) -> None:
        """SIGKILL (if still running) and removal of what a dead daemon leaves behind."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        for path in (self.socket_path, self.stats_socket_path,
                     "/dev/shm/" + self.shm_name.lstrip("/")):
            if os.path.exists(path):
                os.unlink(path)
        for path in self.staging_objects():
            os.unlink(path)
