# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""python/README.md runs as written: every fenced `python` block is executed against a real
daemon started with the README's own command for it, and fails the test if it raises.

Which daemon: the last ```sh block above the python block, in the same `##` section, that has a
`build/bin/kvctl ...` line; a section without one uses the README's first such command (the
"Start a daemon" one). Its `--set KEY=VALUE` arguments are applied on top of the suite's private
endpoints, shm name and 32 MiB pool (helpers.Daemon), and the block reads the endpoint from
KVCTL_SERVER_ENDPOINT as the README says. A block right after `<!-- readme-test: real-model -->`
needs SmolLM2 and runs in the real-model group (KVCTL_HF_TESTS=1, `-k test_hf`), with the model
loaded once per pytest session (the `smollm2` fixture stands in for load_smollm2()).
"""

import os
import re
import shlex
from typing import List, NamedTuple

import pytest

import kvctl.model
from helpers import PYTHON_DIR

README = os.path.join(PYTHON_DIR, "README.md")
REAL_MODEL_MARK = "<!-- readme-test: real-model -->"
DAEMON_COMMAND = "build/bin/kvctl"


class Block(NamedTuple):
    line: int              # 1-based line of the block's first code line.
    code: str
    section: str           # The `## ` heading above it.
    daemon_settings: dict  # --set KEY=VALUE of the daemon command it runs against.
    real_model: bool


def daemon_settings(command_block: str, where: str) -> dict:
    """The --set KEY=VALUE pairs of the `build/bin/kvctl` command (continued lines joined) in an
    sh block."""
    joined = command_block.replace("\\\n", " ")
    line = next(l for l in joined.splitlines() if l.startswith(DAEMON_COMMAND))
    args = shlex.split(line)[1:]
    if len(args) % 2 or any(flag != "--set" for flag in args[::2]):
        raise AssertionError("%s: %r: this test only knows `--set KEY=VALUE` arguments"
                             % (where, line))
    return dict(arg.split("=", 1) for arg in args[1::2])


def readme_blocks(path: str = README) -> List[Block]:
    lines = open(path, encoding="utf-8").read().splitlines()
    blocks, section, default, section_daemon = [], "", None, None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section, section_daemon = line[3:].strip(), None
        fence = re.fullmatch(r"```(\w*)", line)
        if not fence:
            i += 1
            continue
        end = lines.index("```", i + 1)
        code = "\n".join(lines[i + 1:end])
        where = "%s:%d" % (os.path.relpath(path), i + 1)
        if fence.group(1) == "sh" and any(l.startswith(DAEMON_COMMAND)
                                          for l in code.splitlines()):
            section_daemon = daemon_settings(code, where)
            if default is None:
                default = section_daemon
        elif fence.group(1) == "python":
            if default is None:
                raise AssertionError("%s: a python block before any `%s` command"
                                     % (where, DAEMON_COMMAND))
            previous = next((l for l in reversed(lines[:i]) if l.strip()), "")
            blocks.append(Block(i + 2, code, section,
                                section_daemon if section_daemon is not None else default,
                                previous.strip() == REAL_MODEL_MARK))
        i = end + 1
    return blocks


BLOCKS = readme_blocks()
CLIENT_BLOCKS = [b for b in BLOCKS if not b.real_model]
MODEL_BLOCKS = [b for b in BLOCKS if b.real_model]


def block_id(block: Block) -> str:
    return "line%d" % block.line


def run_block(block: Block, daemon, monkeypatch) -> None:
    """Executes the block as a script of its own (fresh globals), with tracebacks that name the
    README's lines."""
    monkeypatch.setenv("KVCTL_SERVER_ENDPOINT", daemon.endpoint)
    code = compile("\n" * (block.line - 1) + block.code, README, "exec")
    exec(code, {"__name__": "__main__"})


def assert_daemon_freed_everything(daemon, connect) -> None:
    """The README says leaving the `with` block ends the session: nothing stays open."""
    seqs = connect(daemon).stats("sequences")["sequences"]
    assert (seqs["sessions"], seqs["sequences"]) == (0, 0), seqs


def test_readme_has_the_blocks_this_test_runs():
    sections = {b.section for b in BLOCKS}
    assert len(CLIENT_BLOCKS) >= 2 and len(MODEL_BLOCKS) >= 1, BLOCKS
    assert {"A session, step by step", "HF transformers: `KvctlCache`"} <= sections, sections
    evicting = [b for b in CLIENT_BLOCKS if b.daemon_settings.get("evict.policy") == "snapkv"]
    assert evicting and "q=q" in evicting[0].code, "the queries example lost its daemon or Q"
    assert all(b.daemon_settings == {} for b in MODEL_BLOCKS), MODEL_BLOCKS


@pytest.mark.parametrize("block", CLIENT_BLOCKS, ids=block_id)
def test_readme_client_block_runs(block, daemon_factory, connect, monkeypatch, capsys):
    daemon = daemon_factory(**{k.replace(".", "__"): v for k, v in block.daemon_settings.items()})
    run_block(block, daemon, monkeypatch)
    assert capsys.readouterr().out.strip(), "the block printed nothing"
    assert_daemon_freed_everything(daemon, connect)


@pytest.mark.parametrize("block", MODEL_BLOCKS, ids=block_id)
def test_hf_readme_real_model_block_runs(block, daemon_factory, connect, monkeypatch, request,
                                         capsys):
    if os.environ.get("KVCTL_HF_TESTS") != "1":
        pytest.skip("real-model README blocks run with KVCTL_HF_TESTS=1 (ctest -R 'hf cache')")
    model_and_tokenizer = request.getfixturevalue("smollm2")
    monkeypatch.setattr(kvctl.model, "load_smollm2", lambda: model_and_tokenizer)
    daemon = daemon_factory(**{k.replace(".", "__"): v for k, v in block.daemon_settings.items()})
    try:
        run_block(block, daemon, monkeypatch)
    finally:
        # KvctlCache switched the shared model to its attention; later tests expect the default.
        model_and_tokenizer[0].set_attn_implementation("sdpa")
    assert capsys.readouterr().out.strip(), "the block printed nothing"
    assert_daemon_freed_everything(daemon, connect)
