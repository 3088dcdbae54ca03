# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""CTest entry point: runs the pytest suite, or exits 77 (CTest SKIP_RETURN_CODE) when numpy,
pyzmq or pytest is not installed (tools/setup.sh installs python/requirements.txt).

    python3 python/tests/run_pytest.py [pytest args...]
"""

import importlib.util
import os
import sys

missing = [m for m in ("numpy", "zmq", "pytest") if importlib.util.find_spec(m) is None]
if missing:
    print("kvctl python tests skipped: missing %s (pip install -r python/requirements.txt)"
          % ", ".join(missing))
    sys.exit(77)

import pytest  # noqa: E402

here = os.path.dirname(os.path.abspath(__file__))
sys.exit(pytest.main(["-q", "--rootdir", os.path.dirname(here), here] + sys.argv[1:]))
