#!/usr/bin/env python3
# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Runs every command of a CMake compile database (compile_commands.json) with -fsyntax-only, JOBS
at a time, and fails when any fails: a semantic check (tools/thread_safety.sh's -Wthread-safety)
without code generation or linking. Each command's output is printed after it, in database order.

    python3 tools/syntax_check.py BUILD/compile_commands.json [--jobs N] [--skip REGEX]
"""

import argparse
import concurrent.futures
import json
import os
import re
import shlex
import subprocess
import sys


def syntax_only(entry):
    """The entry's command with its output removed and -fsyntax-only added."""
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    out, skip_next = [], False
    for a in args:
        if skip_next:
            skip_next = False
        elif a == "-o":
            skip_next = True
        elif a != "-c":
            out.append(a)
    return out[:1] + ["-fsyntax-only"] + out[1:]


def run(entry):
    p = subprocess.run(syntax_only(entry), cwd=entry["directory"], capture_output=True, text=True)
    return entry["file"], p.returncode, p.stdout + p.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("database")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--skip", help="regular expression of files not to check")
    args = ap.parse_args()
    with open(args.database) as f:
        entries = json.load(f)
    if args.skip:
        entries = [e for e in entries if not re.search(args.skip, e["file"])]
    if not entries:
        print("syntax_check: no translation units in %s" % args.database)
        return 1
    failed = 0
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for path, rc, output in pool.map(run, entries):
            if output:
                print("== %s\n%s" % (path, output), end="" if output.endswith("\n") else "\n")
            if rc != 0:
                failed += 1
                print("syntax_check: FAILED (%d): %s" % (rc, path))
    print("syntax_check: %d translation units, %d failed" % (len(entries), failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
