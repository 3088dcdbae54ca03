# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Starting a kvctl daemon process from Python and waiting until it serves: one implementation
for the test fixtures (python/tests/helpers.py) and the tools (kveval, tier_ttft: ManagedDaemon).

    proc = spawn_daemon("build/bin/kvctl", {"server.endpoint": ep}, "/tmp/d.log")
    wait_until_serving(proc, ep, timeout_s=10)   # raises DaemonStartError with the reason
"""

import os
import shutil
import signal
import subprocess
import time
from typing import Dict, Mapping, Optional

from .client import Client
from .protocol import Timeout


class DaemonStartError(Exception):
    """The daemon exited at startup or did not answer PING in time (the message says which)."""


def spawn_daemon(binary: str, settings: Mapping[str, object], log_path: str,
                 config_file: Optional[str] = None) -> subprocess.Popen:
    """Starts `binary [--config FILE] --set KEY=VALUE...`, stdout and stderr appended to
    log_path. The daemon gets SIGTERM when the thread that started it dies (util-linux `setpriv
    --pdeathsig`, where present): a killed evaluation or test run leaves no daemon holding its
    shm pool."""
    setpriv = shutil.which("setpriv")
    args = [setpriv, "--pdeathsig", "TERM", "--", binary] if setpriv else [binary]
    if config_file:
        args += ["--config", config_file]
    for key, value in settings.items():
        args += ["--set", "%s=%s" % (key, value)]
    with open(log_path, "ab") as log:
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)



def wait_until_serving(proc: subprocess.Popen, endpoint: str, timeout_s: float) -> None:
    """Returns once `endpoint` answers PING. Raises DaemonStartError when the process exits first
    or nothing answers within timeout_s (the process is left running: the caller stops it)."""
    deadline = time.monotonic() + timeout_s
    with Client(endpoint, timeout_ms=200) as probe:
        while True:
            if proc.poll() is not None:
                raise DaemonStartError("kvctl exited with %d at startup" % proc.returncode)
            try:
                probe.ping()
                return
            except Timeout:
                if time.monotonic() > deadline:
                    raise DaemonStartError("kvctl did not answer PING within %.0f s" % timeout_s)


class ManagedDaemon:
    """One kvctl process with a private endpoint (a socket in `workdir`) and shm name
    (/SHM_PREFIX-PID-NAME), its log in workdir/NAME.log, stopped with SIGTERM. `settings` override
    the defaults below (a 256MiB pool, no stats feed, a 10-minute lease, warn-level logs)."""

    def __init__(self, binary: str, workdir: str, name: str, settings: Dict[str, str],
                 config_file: Optional[str] = None, shm_prefix: str = "kvctl"):
        self.name = name
        self.binary = binary
        self.config_file = config_file
        self.endpoint = "ipc://" + os.path.join(workdir, name + ".sock")
        self.log_path = os.path.join(workdir, name + ".log")
        self.settings = {"server.endpoint": self.endpoint,
                         "pool.shm_name": "/%s-%d-%s" % (shm_prefix, os.getpid(), name),
                         "pool.bytes": "256MiB", "server.stats_endpoint": "",
                         "server.lease_ms": "600000", "server.log_level": "warn"}
        self.settings.update(settings)
        self.proc = None

    def start(self, timeout_s: float = 120) -> "ManagedDaemon":
        """Starts it and waits until it serves (a loaded machine may take a while); raises
        DaemonStartError naming the daemon and the end of its log, with the process stopped."""
        self.proc = spawn_daemon(self.binary, self.settings, self.log_path, self.config_file)
        try:
            wait_until_serving(self.proc, self.endpoint, timeout_s=timeout_s)
        except DaemonStartError as e:
            self.stop()
            raise DaemonStartError("%s (%s): %s" % (e, self.name, self.log_tail())) from None
        return self

    def log_tail(self, lines: int = 5) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return " | ".join(f.read().strip().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
