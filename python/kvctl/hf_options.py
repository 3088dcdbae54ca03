# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""What kvctl.hf_cache.KvctlCache reads from its arguments and the model's config, checked: the
mode options, whether fused decode is available, the attention implementation switch, the
client of each batch element, and the decoder's geometry (one per daemon sequence) with each
layer's sliding window. Internal to kvctl.hf_cache; every error names the argument or config
field, the value and what was expected.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple

# The attention implementation KvctlCache registers with transformers and sets on the model.
ATTN_IMPLEMENTATION = "kvctl"

# Layer types a cache layer of KvctlCache stands in for (as DynamicCache(config=...) builds
# them: chunked layers are kept like sliding ones).
_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")


class Geometry(NamedTuple):
    """The decoder's shape, the same for every layer (the daemon sequence has one geometry);
    windows[l] is layer l's sliding window, None for full attention."""

    n_layers: int
    kv_heads: int
    q_heads: int
    head_dim: int
    windows: List[Optional[int]]


def read_geometry(config) -> Geometry:
    """The geometry of the config's text decoder; sliding layers chosen exactly as
    DynamicCache(config=...) chooses them (its layers are the reference a lossless KvctlCache
    reproduces)."""
    text = config.get_text_config(decoder=True)
    n_layers = text.num_hidden_layers
    q_heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // q_heads
    window = getattr(text, "sliding_window", None) or getattr(text, "attention_chunk_size", None)
    shared = getattr(text, "num_kv_shared_layers", 0) or 0
    if shared:
        raise ValueError("KvctlCache: num_kv_shared_layers is %d, expected 0 (layers reading "
                         "another layer's K/V are not supported)" % shared)
    types = getattr(text, "layer_types", None) or (
        ["sliding_attention" if window else "full_attention"] * n_layers)
    if len(types) != n_layers:
        raise ValueError("KvctlCache: layer_types has %d entries, expected num_hidden_layers = %d"
                         % (len(types), n_layers))
    for i, kind in enumerate(types):
        if kind not in _LAYER_TYPES:
            raise ValueError("KvctlCache: layer_types[%d] is %r, expected one of %s"
                             % (i, kind, ", ".join(_LAYER_TYPES)))
    windows = [window if kind != "full_attention" else None for kind in types]
    return Geometry(n_layers, text.num_key_value_heads, q_heads, head_dim, windows)


def check_options(refetch: str, attention: str, fused_min_tokens: int) -> None:
    """KvctlCache's mode arguments, each named with the values it takes."""
    if refetch not in ("auto", "always"):
        raise ValueError("refetch: got %r, expected \"auto\" or \"always\"" % (refetch,))
    if attention not in ("auto", "dense", "fused"):
        raise ValueError("attention: got %r, expected \"auto\", \"dense\" or \"fused\""
                         % (attention,))
    if isinstance(fused_min_tokens, bool) or not isinstance(fused_min_tokens, int) \
            or fused_min_tokens < 1:
        raise ValueError("fused_min_tokens: got %r, expected an integer >= 1"
                         % (fused_min_tokens,))


def fused_available(attention: str, model, windows: List[Optional[int]]) -> bool:
    """Whether decode steps may attend fused: "fused" demands the model, the torch extension
    and no sliding layers (an error saying what is missing), "auto" takes the extension when it
    loads and no layer slides (the fused kernel attends to every held row, not a window)."""
    sliding = [i for i, w in enumerate(windows) if w]
    if sliding:
        if attention == "fused":
            raise ValueError("attention=\"fused\": layers %s are sliding-window layers, which "
                             "fused decode does not restrict; use attention=\"dense\"" % sliding)
        return False
    if attention == "fused":
        if model is None:
            raise ValueError("attention=\"fused\": needs the model (its attention calls the "
                             "fused kernel)")
        from . import torch_ops
        try:
            torch_ops.load()
        except RuntimeError as e:
            raise RuntimeError("attention=\"fused\": %s" % e) from None
        return True
    if attention == "auto" and model is not None:
        from . import torch_ops
        return torch_ops.available()
    return False


def take_attention(model, config):
    """Sets the model's attention implementation to ours; returns the config to read the
    geometry from (the model's, else the one given)."""
    if model is not None:
        config = model.config
        if config._attn_implementation != ATTN_IMPLEMENTATION:
            model.set_attn_implementation(ATTN_IMPLEMENTATION)
    if config is None:
        raise ValueError("KvctlCache: give the model (or config=)")
    return config


def per_element(client, model_name, send_q, model) -> Tuple[list, List[str], List[bool]]:
    """The client, HELLO model name and send_q flag of each batch element, from arguments that
    give one for all or one per element."""
    send_qs = ([bool(send_q)] * len(client) if isinstance(client, (list, tuple))
               else [bool(send_q)]) if isinstance(send_q, bool) else list(send_q)
    if any(send_qs) and model is None:
        raise ValueError("send_q: needs the model (queries come from its attention)")
    clients = list(client) if isinstance(client, (list, tuple)) else [client]
    if not clients:
        raise ValueError("client: got an empty list, expected one per batch element")
    names = ([model_name] * len(clients) if isinstance(model_name, str)
             else list(model_name))
    if len(names) != len(clients):
        raise ValueError("model_name: got %d names for %d clients" % (len(names),
                                                                      len(clients)))
    if len(send_qs) != len(clients):
        raise ValueError("send_q: got %d flags for %d clients" % (len(send_qs), len(clients)))
    return clients, names, send_qs
