"""Tiny Hugging Face checkpoints written with numpy + safetensors, for the converter tests.

- ``write_hf_target``: a Llama model directory (config.json, a Llama-2 style tokenizer.json
  with byte fallback, tokenizer_config.json, model.safetensors) that llama.cpp's
  convert_hf_to_gguf.py turns into the target GGUF;
- ``write_eagle3_checkpoint``: an EAGLE-3 head for it in either published layout: EAGLE's
  (``midlayer.*``, ``LlamaForCausalLMEagle3``) or the speculators one (``layers.0.*``,
  ``Eagle3Speculator`` with a nested ``transformer_layer_config``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localspec.synthetic import learn_merges

_CORPUS = "the quick brown fox jumps over the lazy dog. the cat sat on the mat, the dog sat."
_SPACE = "\u2581"


@dataclass(frozen=True)
class HFTarget:
    n_embd: int = 64
    n_layer: int = 6
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_merges: int = 40


def _tokenizer_vocab(n_merges: int) -> tuple[list[str], list[str]]:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    text = _SPACE + _CORPUS.replace(" ", _SPACE)
    chars = sorted(set(text))
    tokens += chars
    words = [list(_SPACE + w) for w in _CORPUS.split(" ")]
    merges = learn_merges(words, n_merges)
    tokens += [a + b for a, b in merges]
    return tokens, [f"{a} {b}" for a, b in merges]


def _special(i: int, text: str) -> dict[str, object]:
    return {"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


def _tokenizer_json(tokens: list[str], merges: list[str]) -> dict[str, object]:
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [_special(i, t) for i, t in enumerate(tokens[:3])],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": _SPACE},
            {"type": "Replace", "pattern": {"String": " "}, "content": _SPACE}]},
        "pre_tokenizer": None, "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": _SPACE}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges},
    }


def _save(path: Path, tensors: dict[str, np.ndarray]) -> None:
    from safetensors.numpy import save_file

    save_file(tensors, str(path))


def write_hf_target(directory: Path, cfg: HFTarget = HFTarget(), seed: int = 0) -> int:
    """Write the target model directory; returns its vocabulary size."""
    directory.mkdir(parents=True, exist_ok=True)
    tokens, merges = _tokenizer_vocab(cfg.n_merges)
    n_vocab = len(tokens)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": cfg.n_embd, "intermediate_size": cfg.n_ff,
        "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.n_head_kv, "vocab_size": n_vocab,
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
        "torch_dtype": "float16",
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    (directory / "tokenizer.json").write_text(json.dumps(_tokenizer_json(tokens, merges)))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False,
        "model_max_length": 2048}))
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float16)

    head_dim = cfg.n_embd // cfg.n_head
    w = {"model.embed_tokens.weight": mat(n_vocab, cfg.n_embd),
         "model.norm.weight": np.ones(cfg.n_embd, np.float16),
         "lm_head.weight": mat(n_vocab, cfg.n_embd)}
    for i in range(cfg.n_layer):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = np.ones(cfg.n_embd, np.float16)
        w[p + "post_attention_layernorm.weight"] = np.ones(cfg.n_embd, np.float16)
        w[p + "self_attn.q_proj.weight"] = mat(cfg.n_head * head_dim, cfg.n_embd)
        w[p + "self_attn.k_proj.weight"] = mat(cfg.n_head_kv * head_dim, cfg.n_embd)
        w[p + "self_attn.v_proj.weight"] = mat(cfg.n_head_kv * head_dim, cfg.n_embd)
        w[p + "self_attn.o_proj.weight"] = mat(cfg.n_embd, cfg.n_head * head_dim)
        w[p + "mlp.gate_proj.weight"] = mat(cfg.n_ff, cfg.n_embd)
        w[p + "mlp.up_proj.weight"] = mat(cfg.n_ff, cfg.n_embd)
        w[p + "mlp.down_proj.weight"] = mat(cfg.n_embd, cfg.n_ff)
    _save(directory / "model.safetensors", w)
    return n_vocab


@dataclass(frozen=True)
class Eagle3Spec:
    layout: str = "eagle"  # "eagle" (midlayer.*) or "speculators" (layers.0.*)
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 96
    draft_vocab: int = 128
    dtype: str = "float16"  # "float16", "bfloat16" or "float32"
    aux_layer_ids: tuple[int, ...] | None = None
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    rope_scaling: tuple[tuple[str, object], ...] = ()  # e.g. (("rope_type", "llama3"), ...)
    seed: int = 1


def _head_tensors(spec: Eagle3Spec, n_embd_tgt: int, n_vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(spec.seed)
    head_dim = spec.n_embd // spec.n_head

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    layer = {
        "input_layernorm.weight": norm(spec.n_embd),
        "hidden_norm.weight": norm(spec.n_embd),
        "post_attention_layernorm.weight": norm(spec.n_embd),
        "self_attn.q_proj.weight": mat(spec.n_head * head_dim, 2 * spec.n_embd),
        "self_attn.k_proj.weight": mat(spec.n_head_kv * head_dim, 2 * spec.n_embd),
        "self_attn.v_proj.weight": mat(spec.n_head_kv * head_dim, 2 * spec.n_embd),
        "self_attn.o_proj.weight": mat(spec.n_embd, spec.n_head * head_dim),
        "mlp.gate_proj.weight": mat(spec.n_ff, spec.n_embd),
        "mlp.up_proj.weight": mat(spec.n_ff, spec.n_embd),
        "mlp.down_proj.weight": mat(spec.n_embd, spec.n_ff),
    }
    prefix = "midlayer." if spec.layout == "eagle" else "layers.0."
    w = {prefix + k: v for k, v in layer.items()}
    w["norm.weight"] = norm(spec.n_embd)
    w["fc.weight"] = mat(spec.n_embd, 3 * n_embd_tgt)
    w["lm_head.weight"] = mat(spec.draft_vocab, spec.n_embd)
    if spec.norm_before_fc:
        w["input_norm.weight"] = norm(3 * n_embd_tgt)
    return w


def _cast(array: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "float32":
        return array
    if dtype == "float16":
        return array.astype(np.float16)
    bits = array.astype(np.float32).view(np.uint32)  # bfloat16: the top half, rounded
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def write_eagle3_checkpoint(
    directory: Path, target: HFTarget, n_vocab: int, spec: Eagle3Spec = Eagle3Spec()
) -> None:
    """Write an EAGLE-3 head checkpoint for the target described by `target`/`n_vocab`."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(spec.seed + 100)
    chosen = np.sort(rng.choice(n_vocab, size=spec.draft_vocab, replace=False))
    d2t = (chosen - np.arange(spec.draft_vocab)).astype(np.int64)  # offsets, as published
    t2d = np.zeros(n_vocab, dtype=bool)
    t2d[chosen] = True
    weights = _head_tensors(spec, target.n_embd, n_vocab)
    floats = {k: _cast(v, spec.dtype) for k, v in weights.items()}
    tensors = {**floats, "d2t": d2t, "t2d": t2d}
    if spec.dtype == "bfloat16":
        _save_with_bf16(directory / "model.safetensors", tensors)
    else:
        _save(directory / "model.safetensors", tensors)
    config = _head_config(spec, target, n_vocab)
    (directory / "config.json").write_text(json.dumps(config, indent=2))


def _head_config(spec: Eagle3Spec, target: HFTarget, n_vocab: int) -> dict[str, object]:
    layer: dict[str, object] = {
        "model_type": "llama", "hidden_size": spec.n_embd, "intermediate_size": spec.n_ff,
        "num_hidden_layers": 1, "num_attention_heads": spec.n_head,
        "num_key_value_heads": spec.n_head_kv, "vocab_size": n_vocab, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 2048, "rope_theta": 10000.0, "hidden_act": "silu",
    }
    if spec.rope_scaling:
        layer["rope_scaling"] = dict(spec.rope_scaling)
    extra: dict[str, object] = {"draft_vocab_size": spec.draft_vocab}
    if spec.aux_layer_ids is not None:
        extra["eagle_aux_hidden_state_layer_ids"] = list(spec.aux_layer_ids)
    if spec.norm_before_fc:
        extra["norm_before_fc"] = True
    if spec.layout == "eagle":
        return {"architectures": ["LlamaForCausalLMEagle3"], **layer, **extra,
                "torch_dtype": spec.dtype}
    return {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
            "transformer_layer_config": layer, "target_hidden_size": target.n_embd,
            "norm_before_residual": spec.norm_before_residual, **extra,
            "torch_dtype": spec.dtype}


def _save_with_bf16(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """safetensors' numpy API has no bfloat16: write the file by hand (the format is a JSON
    header of dtype/shape/offsets followed by the raw bytes)."""
    header: dict[str, object] = {}
    blobs: list[bytes] = []
    offset = 0
    for name, array in tensors.items():
        dtype = {np.dtype(np.uint16): "BF16", np.dtype(np.int64): "I64",
                 np.dtype(bool): "BOOL"}[array.dtype]
        blob = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + b"".join(blobs))
