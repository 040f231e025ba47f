"""An EAGLE-3 checkpoint's config.json, read the way llama.cpp's converter reads it.

Both published layouts: EAGLE's (``LlamaForCausalLMEagle3``/``Eagle3LlamaForCausalLM``, a
Llama config with ``draft_vocab_size``) and the speculators one (``Eagle3Speculator``, the
layer's config nested in ``transformer_layer_config``). llama.cpp reads a config whose
``model_type`` is ``llama`` through transformers' ``LlamaConfig``, which fills defaults
(context 2048, RoPE base 10000, RMS epsilon 1e-6, head_dim = hidden / heads); other configs as
the raw JSON. The same defaults apply here, so both converters write the same keys.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from localspec.errors import InvalidParameterError
from localspec.files import read_input_text
from localspec.heads.eagle3 import Eagle3Params, RopeScaling

_LLAMA_DEFAULTS: dict[str, Any] = {
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
}
_YARN_KEYS = (("extrapolation_factor", "ext_factor"), ("attention_factor", "attn_factor"),
              ("beta_fast", "beta_fast"), ("beta_slow", "beta_slow"))


def read_config(checkpoint: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the raw config.json, the layer's hyper-parameters with llama.cpp's defaults)."""
    path = checkpoint / "config.json"
    if not path.is_file():
        raise InvalidParameterError(
            f"'{checkpoint}' has no config.json; pass the directory of an EAGLE-3 checkpoint "
            "(config.json + model.safetensors)."
        )
    try:
        raw = json.loads(read_input_text(path, "config.json", limit=16 << 20))
    except ValueError as error:
        raise InvalidParameterError(f"'{path}' is not valid JSON ({error}).") from None
    if not isinstance(raw, dict):
        raise InvalidParameterError(f"'{path}' must hold a JSON object.")
    hparams = dict(raw)
    if "transformer_layer_config" in hparams:  # speculators
        layer = hparams["transformer_layer_config"]
        if not isinstance(layer, dict):
            raise InvalidParameterError(f"'{path}': transformer_layer_config must be an object.")
        hparams.update(layer)
    if raw.get("model_type") == "llama":
        try:
            hparams = _with_llama_defaults(hparams)
        except CONFIG_ERRORS as error:
            raise _config_error(error) from None
    if "draft_vocab_size" not in hparams or hparams.get("num_hidden_layers") != 1:
        raise InvalidParameterError(
            f"'{checkpoint}' is not an EAGLE-3 head: its config.json needs draft_vocab_size and "
            "num_hidden_layers = 1."
        )
    return raw, hparams


def _with_llama_defaults(hparams: dict[str, Any]) -> dict[str, Any]:
    out = {**_LLAMA_DEFAULTS, **hparams}
    out.setdefault("num_key_value_heads", out["num_attention_heads"])
    if out.get("head_dim") is None:
        out["head_dim"] = out["hidden_size"] // out["num_attention_heads"]
    rope = out.get("rope_parameters") or out.get("rope_scaling") or {}
    if "rope_theta" in rope:
        out["rope_theta"] = rope["rope_theta"]
    return out


def _rope(hparams: dict[str, Any]) -> dict[str, Any]:
    rope = dict(hparams.get("rope_parameters") or hparams.get("rope_scaling") or {})
    if "rope_type" not in rope and "type" in rope:
        rope["rope_type"] = rope["type"]
    if "rope_theta" not in rope and hparams.get("rope_theta") is not None:
        rope["rope_theta"] = hparams["rope_theta"]
    return rope


def rope_scaling(hparams: dict[str, Any]) -> RopeScaling | None:
    rope = _rope(hparams)
    kind, factor = str(rope.get("rope_type", "")).lower(), rope.get("factor")
    if kind in ("", "default", "llama3") or factor is None:
        return None
    if kind == "linear":
        return RopeScaling("linear", float(factor))
    if kind == "yarn":
        values = {**rope, "attention_factor": rope.get("attention_factor", rope.get("attn_factor"))}
        extra = {ours: float(values[theirs]) for theirs, ours in _YARN_KEYS
                 if values.get(theirs) is not None}
        original = int(rope["original_max_position_embeddings"])
        return RopeScaling("yarn", float(factor), original, extra)
    raise InvalidParameterError(
        f"The head's RoPE scaling '{kind}' is not supported by convert-head; use llama.cpp's "
        "convert_hf_to_gguf.py for this head."
    )


def llama3_rope_factors(hparams: dict[str, Any]) -> np.ndarray | None:
    """The rope_freqs tensor llama.cpp writes for "llama3" RoPE scaling (float32 math)."""
    rope = _rope(hparams)
    if str(rope.get("rope_type", "")).lower() != "llama3":
        return None
    f32 = np.float32
    base = rope.get("rope_theta", 10000.0)
    dim = hparams.get("head_dim") or hparams["hidden_size"] // hparams["num_attention_heads"]
    freqs = f32(1.0) / np.power(f32(base), np.arange(0, dim, 2, dtype=f32) / f32(dim))
    factor = rope.get("factor", 8.0)
    low, high = rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old_ctx = rope.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    out = []
    for freq in freqs:
        wavelen = f32(2 * math.pi) / freq
        if wavelen < f32(high_wavelen):
            out.append(f32(1))
        elif wavelen > f32(low_wavelen):
            out.append(f32(factor))
        else:
            smooth = (f32(old_ctx) / wavelen - f32(low)) / f32(high - low)
            out.append(f32(1) / ((f32(1) - smooth) / f32(factor) + smooth))
    return np.array(out, dtype=f32)


def head_params(
    raw: dict[str, Any], hparams: dict[str, Any], target_n_layer: int, target_n_embd: int,
    target_vocab: int
) -> Eagle3Params:
    """The GGUF hyper-parameters; target facts come from the target GGUF. A config.json whose
    values are missing or of the wrong type is one sentence."""
    try:
        return _head_params(raw, hparams, target_n_layer, target_n_embd, target_vocab)
    except CONFIG_ERRORS as error:
        raise _config_error(error) from None


# What reading a config.json's values as numbers raises when they are missing or malformed.
CONFIG_ERRORS = (KeyError, TypeError, ValueError, ZeroDivisionError, OverflowError)


def _config_error(error: Exception) -> InvalidParameterError:
    what = f"'{str(error.args[0])[:80]}' is missing" if isinstance(error, KeyError) else (
        f"a value has the wrong type or range ({type(error).__name__})")
    return InvalidParameterError(f"The checkpoint's config.json is not an EAGLE-3 head's: {what}.")


def _head_params(
    raw: dict[str, Any], hparams: dict[str, Any], target_n_layer: int, target_n_embd: int,
    target_vocab: int
) -> Eagle3Params:
    layers = raw.get("eagle_aux_hidden_state_layer_ids") or [
        2, target_n_layer // 2, target_n_layer - 3
    ]
    n_embd, n_head = int(hparams["hidden_size"]), int(hparams["num_attention_heads"])
    head_dim = hparams.get("head_dim")
    rope = _rope(hparams)
    return Eagle3Params(
        n_embd=n_embd,
        n_ff=int(hparams["intermediate_size"]),
        n_head=n_head,
        n_head_kv=int(hparams.get("num_key_value_heads", n_head)),
        context_length=int(hparams["max_position_embeddings"]),
        rms_eps=float(hparams["rms_norm_eps"]),
        rope_freq_base=rope.get("rope_theta"),
        rope_dim=int(head_dim) if head_dim is not None else n_embd // n_head,
        vocab_size=int(hparams.get("vocab_size", target_vocab)),
        target_layers=tuple(int(i) for i in layers),
        target_hidden_size=int(raw.get("target_hidden_size") or target_n_embd),
        head_dim=int(head_dim) if head_dim is not None else None,
        norm_before_residual=bool(raw.get("norm_before_residual", False)),
        norm_before_fc=bool(raw.get("norm_before_fc", False)),
        rope_scaling=rope_scaling(hparams),
    )
