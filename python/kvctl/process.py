# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Starting a kvctl daemon process from Python and waiting until it serves: one implementation
for the test fixtures (python/tests/helpers.py) and tools/kveval.

    proc = spawn_daemon("build/bin/kvctl", {"server.endpoint": ep}, "/tmp/d.log")
    wait_until_serving(proc, ep, timeout_s=10)   # raises DaemonStartError with the reason
"""

import shutil
import subprocess
import time
from typing import Mapping, Optional

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
