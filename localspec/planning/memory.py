"""What one model needs in memory, from its GGUF header (docs/design.md, "Memory plan"):
weights by layer, the output head's copy, KV cache elements per layer and recurrent state.
``localspec.planning.planner`` places two of them on a device.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from localspec.drafter_spec import DrafterSpec
from localspec.models.gguf_reader import GGUFInfo, read_gguf
from localspec.planning.recurrent_state import recurrent_layers, state_copies, state_elements

# KV cache element types: elements per block, bytes per block (ggml type traits).
KV_TYPES: dict[str, tuple[int, int]] = {
    "f32": (1, 4), "f16": (1, 2), "bf16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18),
    "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24), "iq4_nl": (32, 18),
}
KV_PAD = 256  # llama.cpp rounds the KV cache size up to a multiple of this
DEFAULT_UBATCH = 512
HEAD_UBATCH = 64  # rows per pass of an EAGLE-3 head's or MTP layers' context (the core)
_INPUT_PREFIXES = ("token_embd.", "position_embd.", "token_types.", "per_layer_token_embd.")
_LAYER_RE = re.compile(r"^blk\.(\d+)\.")
# Body matrices localspec's kernels hold in their own layouts (csrc/kernels/body_matmul.h): bytes
# per
# block in the file, bytes per block in localspec's copy (Q5_0 and Q4_0 widened to int8 as
# Q8_0; Q4_K with its scales unpacked, q4k_matmul.h). Q6_K's copy keeps the file's 210 bytes.
_PACKED_BLOCK_BYTES = {"Q5_0": (22, 34), "Q4_0": (18, 34), "Q4_K": (144, 148)}


def widened_types(*, exact: bool, fast_body: bool, repack: bool = True, rpc: bool = False,
                  gpu_backend: bool = False,
                  faster: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The body matrix types localspec's kernels hold in a larger layout, by the rule the core
    applies (csrc/engine/engine.cpp, BodyKernelClaim; csrc/llama/model.cpp): in exact mode every
    quantized matrix is theirs; in default mode the ``faster`` types (default: this CPU's,
    ``_core.faster_body_types()``) with ``fast_body``, unless ``repack`` is off (the file's
    layout) or a GPU backend's pinned host memory takes the CPU-held matrices first
    (``gpu_backend``); none with RPC workers."""
    if rpc:
        return ()
    if exact:
        return tuple(_PACKED_BLOCK_BYTES)
    if not fast_body or not repack or gpu_backend:
        return ()
    taken = _faster_body_types() if faster is None else faster
    return tuple(t for t in _PACKED_BLOCK_BYTES if t in taken)


def draft_widened_types(drafter: DrafterSpec, *, fast_body: bool, repack: bool = True,
                        gpu_backend: bool = False) -> tuple[str, ...]:
    """The same for the drafter's model: a draft model's matrices take default mode's faster
    kernels in both modes (csrc/engine/engine.cpp, configured_drafter), an EAGLE-3 head's
    none."""
    if drafter.path is None or drafter.kind == "eagle3":
        return ()
    return widened_types(exact=False, fast_body=fast_body, repack=repack,
                         gpu_backend=gpu_backend)


@dataclass(frozen=True)
class ModelMemory:
    """The memory-relevant shape of one model, as read from its GGUF header."""

    name: str
    layer_bytes: tuple[int, ...]  # weights of each repeating layer (blk.N.*)
    input_bytes: int  # token embeddings: llama.cpp always keeps them in host memory
    output_bytes: int  # output head + norms; includes the embeddings again when tied
    kv_k_elems: tuple[int, ...]  # per layer: n_head_kv * head_dim_k (0 for layers without KV)
    kv_v_elems: tuple[int, ...]
    n_vocab: int
    n_embd: int
    n_ff: int = 0
    n_ctx_train: int = 0
    tied_bytes: int = 0  # the head reuses token_embd: bytes duplicated when the head is offloaded
    sliding_window: int = 0
    path: str | None = None
    file_bytes: int = 0  # size of the GGUF file (tensor data + header)
    # localspec's repacked copy of a Q8_0 or Q6_K head (csrc/kernels/q8_head.h,
    # csrc/kernels/q6k_head.h): made
    # when this model's head stays in host memory.
    head_copy_bytes: int = 0
    # An EAGLE-3 head: its context runs micro-batches of HEAD_UBATCH rows
    # (csrc/llama/head_context.cpp, HeadContext), and its KV cache is its one layer's.
    is_head: bool = False
    # MTP (NextN) layers after the trunk: their KV lives in the MTP context, not the target's
    # (their weights are counted with the target's; llama.cpp loads them only for MTP drafting).
    n_layer_nextn: int = 0
    is_mtp: bool = False  # the MTP context of a target (mtp_memory)
    # A recurrent or hybrid model: per layer, float32 values of one sequence's running state
    # (0 for attention layers), kept in state_copies copies (localspec/planning/recurrent_state.py).
    state_elems: tuple[int, ...] = ()
    state_copies: int = 1

    @property
    def n_layer(self) -> int:
        return len(self.layer_bytes)

    @property
    def file_weight_bytes(self) -> int:
        """Bytes of all tensors in the file (the tied head is stored once)."""
        return sum(self.layer_bytes) + self.input_bytes + self.output_bytes - self.tied_bytes

    def kv_bytes(self, layers: range | list[int], n_ctx: int, kv_type: str) -> int:
        """KV cache bytes of the given layers for a context of n_ctx tokens."""
        cells = -(-n_ctx // KV_PAD) * KV_PAD
        return cells * sum(
            row_bytes(self.kv_k_elems[i], kv_type) + row_bytes(self.kv_v_elems[i], kv_type)
            for i in layers
        )

    def state_bytes(self, layers: range, n_seq: int) -> int:
        """The running state of the given layers for n_seq sequences, snapshots included."""
        per_seq = sum(self.state_elems[i] for i in layers if i < len(self.state_elems))
        return 4 * per_seq * n_seq * self.state_copies

    def compute_bytes(self, with_logits: bool, n_ubatch: int = DEFAULT_UBATCH) -> int:
        """Estimated compute buffer: f32 activations of one micro-batch, plus logits rows."""
        rows = 4 * self.n_embd + 2 * self.n_ff + (self.n_vocab if with_logits else 0)
        return 4 * n_ubatch * rows

    @classmethod
    def from_gguf(cls, info: GGUFInfo, *, widened: tuple[str, ...] = ()) -> ModelMemory:
        """Group a GGUF file's tensor bytes into layers, input embeddings and output head;
        the layers' matrices of the ``widened`` types as localspec's body kernels hold them."""
        n_layer = info.n_layer
        layers = [0] * n_layer
        input_bytes = output_bytes = 0
        for tensor in info.tensors:
            match = _LAYER_RE.match(tensor.name)
            if match and int(match.group(1)) < n_layer:
                file_block, packed_block = (_PACKED_BLOCK_BYTES[tensor.type_name]
                                            if tensor.type_name in widened else (1, 1))
                nbytes = tensor.nbytes // file_block * packed_block
                layers[int(match.group(1))] += nbytes
            elif tensor.name.startswith(_INPUT_PREFIXES):
                input_bytes += tensor.nbytes
            else:
                output_bytes += tensor.nbytes
        embd = info.tensor("token_embd.weight")
        tied = embd.nbytes if embd is not None and info.tensor("output.weight") is None else 0
        head = info.tensor("output.weight") or embd
        head_copy = 0
        groups = -(-info.vocab_size // 8)  # the copies hold 8 vocabulary rows per group
        if head is not None and head.type_name == "Q8_0" and info.n_embd % 32 == 0:
            head_copy = groups * (info.n_embd // 32) * 272  # Q8Head::packed_bytes
        elif head is not None and head.type_name == "Q6_K" and info.n_embd % 256 == 0:
            head_copy = groups * (info.n_embd // 256) * 1680  # Q6KHead::packed_bytes
        if info.architecture == "eagle3" and info.tensor("output.weight") is not None:
            # The head's output layer, repacked for localspec's draft logits (DraftVocabHead).
            n_draft = info.tensor("output.weight").shape[1]  # type: ignore[union-attr]
            row = info.n_embd // 32 * 34 if info.n_embd % 32 == 0 else 4 * info.n_embd
            head_copy = n_draft * row
        recurrent = recurrent_layers(info)
        heads_kv = [0 if i in recurrent else h  # a recurrent layer has no KV cache
                    for i, h in enumerate((info.n_head_kv_per_layer() + [0] * n_layer)[:n_layer])]
        state = state_elements(info) if recurrent else 0
        n_nextn = info.arch_int("nextn_predict_layers")
        return cls(
            name=info.name,
            layer_bytes=tuple(layers),
            input_bytes=input_bytes,
            output_bytes=output_bytes + tied,
            kv_k_elems=tuple(h * info.head_dim_k for h in heads_kv),
            kv_v_elems=tuple(h * info.head_dim_v for h in heads_kv),
            n_vocab=info.vocab_size,
            n_embd=info.n_embd,
            n_ff=info.n_ff,
            n_ctx_train=info.n_ctx_train,
            tied_bytes=tied,
            sliding_window=info.arch_int("attention.sliding_window"),
            path=str(info.path),
            file_bytes=info.file_size,
            head_copy_bytes=head_copy,
            is_head=info.architecture == "eagle3",
            n_layer_nextn=n_nextn,
            state_elems=tuple(state if i in recurrent else 0 for i in range(n_layer)),
            state_copies=state_copies(info),
        )

    def without_nextn_kv(self) -> ModelMemory:
        """The target's own context: no KV for its MTP layers."""
        n = self.n_layer - self.n_layer_nextn
        zeros = (0,) * self.n_layer_nextn
        return replace(self, kv_k_elems=self.kv_k_elems[:n] + zeros,
                       kv_v_elems=self.kv_v_elems[:n] + zeros)

    def mtp_memory(self) -> ModelMemory:
        """The MTP context of this target (csrc MtpContext): the KV of its MTP layers and a
        compute buffer of HEAD_UBATCH rows; its weights are the target's."""
        n = self.n_layer - self.n_layer_nextn
        return replace(self, name="MTP layers", layer_bytes=(0,) * self.n_layer_nextn,
                       input_bytes=0, output_bytes=0, tied_bytes=0, file_bytes=0,
                       head_copy_bytes=0, kv_k_elems=self.kv_k_elems[n:],
                       kv_v_elems=self.kv_v_elems[n:], n_layer_nextn=0, is_mtp=True,
                       state_elems=())

def row_bytes(elems: int, kv_type: str) -> int:
    block, size = KV_TYPES[kv_type]
    return -(-elems // block) * size


def model_memory(path: str | os.PathLike[str], *, fast_head: bool = True,
                 widened: tuple[str, ...] = ()) -> ModelMemory:
    """Read a GGUF header (arrays skipped: fast) and describe its memory needs. localspec's
    output head copy counts only with ``fast_head`` (``--llama-head`` turns it off) and where
    this CPU can run that head; so do the body matrices of the ``widened`` types
    (widened_types()), whose kernel is the head's."""
    memory = ModelMemory.from_gguf(read_gguf(Path(path), read_arrays=False),
                                   widened=widened if _output_head_supported() else ())
    # A head's draft-vocabulary copy is always made; a model's output head copy only where
    # localspec's head runs.
    copy_made = memory.is_head or (fast_head and _output_head_supported())
    if memory.head_copy_bytes and not copy_made:
        memory = replace(memory, head_copy_bytes=0)
    return memory


def _faster_body_types() -> tuple[str, ...]:
    try:
        from localspec import _core
    except ImportError:
        return ()
    return tuple(_core.faster_body_types())


def _output_head_supported() -> bool:
    try:
        from localspec import _core
    except ImportError:
        return False
    return bool(_core.q8_head_supported())
