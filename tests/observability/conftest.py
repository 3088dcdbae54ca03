# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Fixtures shared by the observability and operations tests: a scratch directory and a real
kvctl daemon started in it (tests/observability/obs_helpers.py)."""
import shutil

import pytest

from obs_helpers import Daemon, make_workdir


@pytest.fixture
def workdir():
    d = make_workdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def daemon(workdir):
    d = Daemon(workdir).start()
    yield d
    d.close()
