# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kveval_recipes: the quality of the ready configurations in configs/ on SmolLM2-135M, each run
as written (one daemon per file, `kvctl --config FILE`), through kveval's pseudo-decode
(tools/kveval.py, docs/quality.md): b/e and memory the daemon holds, PPL / dPPL / KL / top-1
against configs/lossless.toml (the reference, batch element 0), greedy agreement, and whether the
daemon logged a "cannot compress" warning.

    python3 tools/kveval_recipes.py                  # every recipe, 2 segments of 2048 tokens
    python3 tools/kveval_recipes.py --tokens 768 --segments 1 --gen-tokens 32 \
        configs/kivi4-safe.toml

Queries are sent to the daemons whose config evicts with a scorer that reads them. A relative
budget.profile is resolved against the repository root. Exit 0 ok; 1 bad input; 2 a daemon
failed.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("TQDM_DISABLE", "1")
TOOLS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TOOLS)
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, TOOLS)
import kveval  # noqa: E402
import kveval_output  # noqa: E402
from kveval_rows import DaemonError, EvalError, Row  # noqa: E402

NOT_RECIPES = ("default.toml", "smollm2-135m.toml")


def recipe_files() -> list:
    return sorted(f for f in glob.glob(os.path.join(REPO, "configs", "*.toml"))
                  if os.path.basename(f) not in NOT_RECIPES)


def needs_queries(cfg: dict) -> bool:
    mode = cfg.get("budget", {}).get("mode", "none")
    policy = cfg.get("evict", {}).get("policy", "streaming")
    return mode in ("evict-only", "joint") and policy != "streaming"


def main(argv=None) -> int:
    import tomllib
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("configs", nargs="*", help="recipe files (default: configs/*.toml recipes)")
    p.add_argument("--text", default=kveval.DEFAULT_TEXT, help="a file or a kveval text label")
    p.add_argument("--tokens", type=int, default=2048, help="context length of each segment")
    p.add_argument("--segments", type=int, default=2)
    p.add_argument("--scored", type=int, default=128, help="scored positions per segment")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--gen-tokens", type=int, default=64)
    p.add_argument("--kvctl-bin", default=os.path.join(REPO, "build", "bin", "kvctl"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="write recipes.json and recipes.md here")
    args = p.parse_args(argv)
    files = [os.path.abspath(f) for f in (args.configs or recipe_files())]
    lossless = os.path.join(REPO, "configs", "lossless.toml")
    files = [lossless] + [f for f in files if f != lossless]  # The reference is row 0.
    rows, configs = [], {}
    for f in files:
        with open(f, "rb") as fh:
            cfg = tomllib.load(fh)
        settings = {}
        profile = cfg.get("budget", {}).get("profile", "")
        if profile and not os.path.isabs(profile):
            settings["budget.profile"] = os.path.join(REPO, profile)
        name = "uncompressed" if f == lossless else os.path.basename(f)[:-5]
        rows.append(Row(name, "kvctl", settings, send_q=needs_queries(cfg),
                        note=os.path.relpath(f, REPO)))
        configs[name] = f
    text = kveval.read_text("--text", args.text)
    import torch
    from kvctl.model import load_smollm2
    import kvctl
    torch.set_num_threads(args.threads)
    print("kveval_recipes: loading SmolLM2-135M ...", flush=True)
    model, tok = load_smollm2()
    kveval.prepare_inputs(args, tok, text)
    workdir = tempfile.mkdtemp(prefix="kveval-recipes-", dir="/tmp")
    ev = kveval.Evaluator(args, torch, model, tok, kvctl)
    daemons = [kveval.Daemon(args.kvctl_bin, workdir, r.name, r.settings, configs[r.name])
               for r in rows]
    t0 = time.perf_counter()
    try:
        for d in daemons:
            d.start()
        ev.run_kvctl(rows, daemons)
        results = ev.finish()
        for r in results:
            for k in kveval_output.ARRAYS:
                r.pop(k, None)
    finally:
        for d in daemons:
            d.stop()
    for r, d in zip(results, daemons):
        with open(d.log_path, errors="replace") as f:
            warned = [l.strip() for l in f if "cannot compress" in l]
        r["warning"] = warned[0] if warned else ""
        r["config"] = os.path.relpath(configs[r["row"]], REPO)
        r["row"] = os.path.basename(r["config"])
    cmd = " ".join(["python3 tools/kveval_recipes.py"] + (argv if argv is not None
                                                           else sys.argv[1:]))
    md = ["| recipe | payload b/e | reserved mem vs fp16 | tokens quantized | PPL "
          "| dPPL % [95 % CI] | KL | top-1 | onset | greedy (from) | first div | warns |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        greedy = ("-" if r["greedy_agree"] is None
                  else "%.3f (%d)" % (r["greedy_agree"], r["greedy_from"]))
        md.append("| `%s` | %.3f | %.3f | %d | %.3f | %+.2f [%+.2f, %+.2f] | %.4f | %.3f | %d "
                  "| %s | %s | %s |"
                  % (r["config"], r["bits_per_element"], r["memory_vs_fp16"],
                     r["tokens_quantized"], r["ppl"], r["dppl_pct"], r["dppl_lo"], r["dppl_hi"],
                     r["kl_mean"], r["top1_agree"], r["quant_onset_tokens"], greedy,
                     "-" if r["greedy_first_div"] is None else r["greedy_first_div"],
                     "yes" if r["warning"] else "no"))
    print("\n".join(md))
    print("kveval_recipes: %d segments of %d tokens of %s, %d scored each, %d generated after "
          "%d prompt tokens, %.0f s; command: %s"
          % (len(args.segment_starts), args.tokens, args.text, args.scored, args.gen_tokens,
             args.prompt_tokens, time.perf_counter() - t0, cmd))
    for r in results:
        if r["warning"]:
            print("kveval_recipes: %s warned: %s" % (r["row"], r["warning"]))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "recipes.json"), "w") as f:
            json.dump({"command": cmd, "tokens": args.tokens, "scored": args.scored,
                       "segments": args.segment_starts,
                       "text": args.text, "rows": results}, f, indent=1, default=str)
        with open(os.path.join(args.out, "recipes.md"), "w") as f:
            f.write("\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except EvalError as e:
        print("kveval_recipes: %s" % e, file=sys.stderr)
        sys.exit(1)
    except DaemonError as e:
        print("kveval_recipes: %s" % e, file=sys.stderr)
        sys.exit(2)
