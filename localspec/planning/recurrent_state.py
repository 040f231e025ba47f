"""The memory of a recurrent or hybrid model's running state, for the memory plan.

llama.cpp keeps, per sequence and per recurrent layer, a convolution state (R) and a
recurrent state (S) in float32 (``llama_memory_recurrent``; sizes from ``llama_hparams``
``n_embd_r`` / ``n_embd_s``). For the architectures whose graphs keep snapshots of it
(``n_rs_seq``), the core asks for ``ROLLBACK_DEPTH`` of them so that speculation can roll back
(docs/design.md, "The speculative step"): 1 + 15 copies of the state per sequence.
"""

from __future__ import annotations

from localspec.models.gguf_reader import GGUFInfo

# llama.cpp's llm_arch_supports_rs_rollback (src/llama-arch.cpp in the pinned sdist): the
# architectures whose recurrent state it can roll back through snapshots.
ROLLBACK_ARCHITECTURES = frozenset({
    "kimi-k3", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "glm5-next", "nemotron_h",
    "nemotron_h_moe", "lfm2", "lfm2moe", "bailingmoe3",
})
# The snapshots the core asks for: its kRollbackDepth, which the memory plan reads without
# loading the core (tests/core/test_hybrid.py checks that the two agree).
ROLLBACK_DEPTH = 15
_RECURRENT_TENSORS = (".ssm_", ".shortconv.", ".time_mix_")


def recurrent_layers(info: GGUFInfo) -> set[int]:
    """The blocks that keep a recurrent state: those with state-space, short-convolution or
    RWKV time-mix tensors."""
    layers = set()
    for tensor in info.tensors:
        if tensor.name.startswith("blk.") and any(t in tensor.name for t in _RECURRENT_TENSORS):
            layers.add(int(tensor.name.split(".")[1]))
    return layers


def state_elements(info: GGUFInfo) -> int:
    """Float32 values of one sequence's state in one recurrent layer (R + S)."""
    l_cache = info.arch_int("shortconv.l_cache")
    if l_cache:  # LFM2: the last l_cache - 1 inputs of its convolution
        return info.n_embd * (l_cache - 1)
    head_size = info.arch_int("wkv.head_size")
    if head_size:  # RWKV: token shift and the wkv state
        return (info.arch_int("token_shift_count", 2) or 2) * info.n_embd + info.n_embd * head_size
    d_conv = info.arch_int("ssm.conv_kernel")
    d_inner = info.arch_int("ssm.inner_size")
    d_state = info.arch_int("ssm.state_size")
    n_group = info.arch_int("ssm.group_count")
    conv = max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state)
    return conv + d_state * d_inner


def state_copies(info: GGUFInfo) -> int:
    """Copies of the state per sequence: the state and, where llama.cpp keeps them, the
    snapshots a rollback goes back to."""
    return 1 + ROLLBACK_DEPTH if info.architecture in ROLLBACK_ARCHITECTURES else 1
