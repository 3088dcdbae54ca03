#!/usr/bin/env python3
# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Fails when the repository cites math it does not contain.

    python3 tools/check_citations.py [ROOT]      # ROOT defaults to the repository of this script
    python3 tools/check_citations.py --self-test  # plants bad citations in a temporary tree

The section sign is reserved for docs/algorithms.md: every `§N` or `§N.M` in a text file of the
repository (code comments, tests, tools, docs) must name a heading `## §N ...` / `### §N.M ...`
of docs/algorithms.md. Citing the design brief the project grew from (its file name is built
below, so this script does not cite it) is an error too: that file is not in the repository.

Exit status 0 when every citation resolves, 1 with one line per bad citation
(`path:line: ...`) otherwise, 2 when docs/algorithms.md is missing or has duplicate sections.
"""
import os
import re
import sys
import tempfile

ALGORITHMS_DOC = os.path.join("docs", "algorithms.md")
BRIEF_NAME = "ALGORITHMS" + ".md"  # Split so that this file does not match itself.
SECTION_HEADING = re.compile(r"^#{2,6}\s+§(\d+(?:\.\d+)*)\s")
SECTION_REF = re.compile(r"§\s*(\d+(?:\.\d+)*)")
SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", "node_modules"}
MAX_BYTES = 2 << 20


def sections(root):
    """The section numbers of docs/algorithms.md; raises ValueError on a missing file or a
    section defined twice."""
    path = os.path.join(root, ALGORITHMS_DOC)
    if not os.path.isfile(path):
        raise ValueError(f"{ALGORITHMS_DOC}: not found under {root}")
    found = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            m = SECTION_HEADING.match(line)
            if not m:
                continue
            if m.group(1) in found:
                raise ValueError(f"{ALGORITHMS_DOC}:{n}: section §{m.group(1)} already defined "
                                 f"at line {found[m.group(1)]}")
            found[m.group(1)] = n
    if not found:
        raise ValueError(f"{ALGORITHMS_DOC}: no '## §N' headings")
    return set(found)


def text_files(root):
    """Relative paths of the repository's text files, skipping build trees and VCS data."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames
                             if d not in SKIP_DIRS and not d.startswith("build"))
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if os.path.islink(path) or os.path.getsize(path) > MAX_BYTES:
                continue
            yield os.path.relpath(path, root)


def check(root):
    """Returns (bad citation lines, citations checked)."""
    known = sections(root)
    errors, checked = [], 0
    for rel in text_files(root):
        try:
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                lines = f.read().split("\n")
        except (UnicodeDecodeError, OSError):
            continue  # Binary (images, arrays): nothing to cite.
        for n, line in enumerate(lines, 1):
            if BRIEF_NAME in line:
                errors.append(f"{rel}:{n}: cites {BRIEF_NAME}, which is not in the repository; "
                              f"cite {ALGORITHMS_DOC} §N instead")
            for m in SECTION_REF.finditer(line):
                checked += 1
                if m.group(1) not in known:
                    errors.append(f"{rel}:{n}: §{m.group(1)} is not a section of "
                                  f"{ALGORITHMS_DOC} (it has §{min_max(known)})")
    return errors, checked


def min_max(known):
    key = lambda s: tuple(int(x) for x in s.split("."))
    ordered = sorted(known, key=key)
    return f"{ordered[0]}..§{ordered[-1]}"


def self_test():
    """The check must fail on each kind of bad citation and pass on good ones."""
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "docs"))
        os.makedirs(os.path.join(root, "kernels"))
        s = "\u00a7"  # Written as an escape so that this file's own citations stay valid.
        with open(os.path.join(root, ALGORITHMS_DOC), "w", encoding="utf-8") as f:
            f.write(f"# Math\n\n## {s}1 One\n\n### {s}1.2 Two\n\nSee {s}1.\n")
        src = os.path.join(root, "kernels", "a.h")
        cases = [
            (f"// fine (docs/algorithms.md {s}1.2), {s}1\n", 0),
            (f"// missing section (docs/algorithms.md {s}1.3)\n", 1),
            (f"// bare and missing {s}7\n", 1),
            (f"// the brief ({BRIEF_NAME} {s}1)\n", 1),
        ]
        for text, want in cases:
            with open(src, "w", encoding="utf-8") as f:
                f.write(text)
            errors, checked = check(root)
            if len(errors) != want or checked == 0:
                print(f"self-test: {text.strip()!r}: got {len(errors)} errors {errors}, "
                      f"expected {want}", file=sys.stderr)
                return 1
        with open(os.path.join(root, ALGORITHMS_DOC), "a", encoding="utf-8") as f:
            f.write(f"\n## {s}1 Again\n")
        try:
            sections(root)
        except ValueError:
            pass
        else:
            print("self-test: a duplicate section was accepted", file=sys.stderr)
            return 1
    print("self-test: ok")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) > 2 or (len(argv) == 2 and argv[1].startswith("-")):
        print("usage: check_citations.py [ROOT] | --self-test", file=sys.stderr)
        return 1
    root = argv[1] if len(argv) == 2 else os.path.dirname(os.path.dirname(os.path.abspath(
        __file__)))
    try:
        errors, checked = check(root)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        return 1
    print(f"{checked} section citations resolve in {ALGORITHMS_DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
