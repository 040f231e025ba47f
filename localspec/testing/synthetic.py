"""Tiny synthetic GGUF models (llama architecture, byte-level BPE) for tests and benchmarks.

A target/draft pair is built so that their agreement and cost ratio are set by construction:
the draft is the target's first ``draft_layers`` blocks with the same embeddings and head; the
target's remaining blocks write into the residual stream scaled by ``divergence``. At
divergence 0 they compute the same function (the draft always agrees); the larger it is, the
more often they disagree. The cost ratio follows the layer counts.

Written with the ``gguf`` package, a base dependency (convert-head uses it too).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import gguf

SPECIAL_TOKENS = ("<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>")
# Qwen2.5-Coder's fill-in-the-middle tokens, in a vocabulary built with TinyConfig(fim=True).
FIM_TOKENS = ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|repo_name|>",
              "<|file_sep|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# A Hermes/Qwen-style template that renders tools, calls and results (localspec's own
# wording; the tool-call tests load tiny models with it: localspec.text.tool_calls).
TOOLS_CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nFunctions you may call, one signature a line:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nWrite each call as <tool_call>\\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for call in message.tool_calls %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' }}"
    "{{- (call.function.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response>"
    "<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
_CORPUS = (
    "the quick brown fox jumps over the lazy dog. speculative decoding drafts tokens and the "
    "target model verifies them in one batch. the cat sat on the mat and the dog sat on the log. "
    "hello world, this is a tiny model for tests. once upon a time there was a small model that "
    "wanted to be fast. def main(): return 42. the answer is the same as the target alone."
)


@dataclass(frozen=True)
class TinyConfig:
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_layer: int = 2
    n_merges: int = 120
    context_length: int = 4096
    head_scale: float = 3.0  # larger: peakier next-token distributions
    head_type: str = "F32"  # "Q8_0": store output.weight quantized, as real GGUFs often do
    extra_tokens: int = 0  # unused tokens after the merges: a large vocabulary, a large head
    fim: bool = False  # add FIM_TOKENS after the special tokens
    seed: int = 0


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(0xA1, 0xAC + 1))
        + list(range(0xAE, 0xFF + 1))
    )
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=False)}


def build_vocab(n_merges: int) -> tuple[list[str], list[str]]:
    """Byte tokens + greedy BPE merges learned on a small built-in corpus."""
    byte_map = _bytes_to_unicode()
    tokens = [byte_map[b] for b in range(256)]
    words = [
        [byte_map[b] for b in w.encode()] for w in re.findall(r" ?\w+| ?[^\w\s]+|\s+", _CORPUS)
    ]
    merges = learn_merges(words, n_merges)
    tokens += [a + b for a, b in merges]
    return tokens, [f"{a} {b}" for a, b in merges]


def learn_merges(words: list[list[str]], n_merges: int) -> list[tuple[str, str]]:
    """Greedy BPE training: merge the most frequent adjacent pair (ties: the larger pair) up to
    n_merges times; returns the merged pairs in order."""
    merges: list[tuple[str, str]] = []
    for _ in range(n_merges):
        pairs = Counter((w[i], w[i + 1]) for w in words for i in range(len(w) - 1))
        if not pairs:
            break
        (a, b), _count = max(pairs.items(), key=lambda item: (item[1], item[0]))
        merges.append((a, b))
        words = [_merge(w, a, b) for w in words]
    return merges


def _merge(word: list[str], a: str, b: str) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
            out.append(a + b)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out



Matrices = Callable[..., np.ndarray]


def random_matrices(seed: int) -> Matrices:
    """mat(rows, cols, scale=1.0): random F32 matrices scaled by 1/sqrt(cols), so that a
    product keeps unit variance; drawn from one seeded generator in call order."""
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale / np.sqrt(cols)).astype(np.float32)

    return mat


def embedding_and_head(mat: Matrices, cfg: TinyConfig, n_vocab: int) -> dict[str, np.ndarray]:
    """The token embedding, final norm and output head every tiny model starts with."""
    return {
        "token_embd.weight": mat(n_vocab, cfg.n_embd, np.sqrt(cfg.n_embd)),
        "output_norm.weight": np.ones(cfg.n_embd, dtype=np.float32),
        "output.weight": mat(n_vocab, cfg.n_embd, cfg.head_scale),
    }

def _weights(
    cfg: TinyConfig, n_vocab: int, n_layer: int, divergence: float, seed: int
) -> dict[str, np.ndarray]:
    """Random weights; blocks beyond cfg.n_layer are scaled by `divergence` on their outputs."""
    mat = random_matrices(seed)
    head_dim = cfg.n_embd // cfg.n_head
    w = embedding_and_head(mat, cfg, n_vocab)
    for i in range(n_layer):
        out_scale = 1.0 if i < cfg.n_layer else divergence
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = np.ones(cfg.n_embd, dtype=np.float32)
        w[p + "attn_q.weight"] = mat(cfg.n_head * head_dim, cfg.n_embd)
        w[p + "attn_k.weight"] = mat(cfg.n_head_kv * head_dim, cfg.n_embd)
        w[p + "attn_v.weight"] = mat(cfg.n_head_kv * head_dim, cfg.n_embd)
        w[p + "attn_output.weight"] = mat(cfg.n_embd, cfg.n_head * head_dim, out_scale)
        w[p + "ffn_norm.weight"] = np.ones(cfg.n_embd, dtype=np.float32)
        w[p + "ffn_gate.weight"] = mat(cfg.n_ff, cfg.n_embd)
        w[p + "ffn_up.weight"] = mat(cfg.n_ff, cfg.n_embd)
        w[p + "ffn_down.weight"] = mat(cfg.n_embd, cfg.n_ff, out_scale)
    return w


def vocab_tokens(cfg: TinyConfig) -> list[str]:
    """The vocabulary of every tiny model built with `cfg`: bytes, merges, unused, specials."""
    tokens, _merges = build_vocab(cfg.n_merges)
    return tokens + [f"<unused{i}>" for i in range(cfg.extra_tokens)] + list(special_tokens(cfg))


def special_tokens(cfg: TinyConfig) -> tuple[str, ...]:
    """The control tokens at the end of the vocabulary."""
    return SPECIAL_TOKENS + (FIM_TOKENS if cfg.fim else ())


def add_tokenizer(writer: gguf.GGUFWriter, cfg: TinyConfig,
                  chat_template: str = CHAT_TEMPLATE) -> None:
    """The byte-level BPE tokenizer keys and a chat template (ChatML unless told), for any
    architecture."""
    import gguf

    tokens = vocab_tokens(cfg)
    n_special = len(special_tokens(cfg))
    n_normal = len(tokens) - cfg.extra_tokens - n_special
    token_types = (
        [gguf.TokenType.NORMAL] * n_normal
        + [gguf.TokenType.UNUSED] * cfg.extra_tokens
        + [gguf.TokenType.CONTROL] * n_special
    )
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(build_vocab(cfg.n_merges)[1])
    writer.add_bos_token_id(tokens.index("<|bos|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_add_bos_token(True)
    writer.add_chat_template(chat_template)


def write_gguf(writer: gguf.GGUFWriter, tensors: dict[str, np.ndarray]) -> None:
    """Add F32 `tensors` and write the file (header, metadata, tensors)."""
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_model(
    path: str | Path,
    cfg: TinyConfig = TinyConfig(),
    *,
    extra_layers: int = 0,
    divergence: float = 0.0,
    name: str = "tiny-llama",
    chat_template: str = CHAT_TEMPLATE,
) -> Path:
    """Write a tiny llama-architecture GGUF with a chat template; returns its path."""
    import gguf  # test/bench dependency only

    path = Path(path)
    n_vocab = len(vocab_tokens(cfg))
    n_layer = cfg.n_layer + extra_layers

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_context_length(cfg.context_length)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(cfg.n_ff)
    writer.add_head_count(cfg.n_head)
    writer.add_head_count_kv(cfg.n_head_kv)
    writer.add_rope_dimension_count(cfg.n_embd // cfg.n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_tokenizer(writer, cfg, chat_template)
    weights = _weights(cfg, n_vocab, n_layer, divergence, cfg.seed)
    if cfg.head_type != "F32":
        qtype = gguf.GGMLQuantizationType[cfg.head_type]
        head = weights.pop("output.weight")
        writer.add_tensor("output.weight", gguf.quants.quantize(head, qtype), raw_dtype=qtype)
    write_gguf(writer, weights)
    return path


def write_pair(
    directory: str | Path,
    cfg: TinyConfig = TinyConfig(),
    *,
    extra_layers: int = 2,
    divergence: float = 0.3,
) -> tuple[Path, Path]:
    """A (target, draft) pair: the draft is the target without its last `extra_layers` blocks."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = write_model(
        directory / "tiny-target.gguf",
        cfg,
        extra_layers=extra_layers,
        divergence=divergence,
        name="tiny-target",
    )
    draft = write_model(directory / "tiny-draft.gguf", cfg, name="tiny-draft")
    return target, draft
