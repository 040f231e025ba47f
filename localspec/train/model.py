"""The EAGLE-3 head in torch, computing exactly what the core computes (llama.cpp's eagle3
graph, src/models/eagle3.cpp, run the way csrc/draft/eagle3_drafter.cpp runs it):

- g = fc(features): the target's three tapped layer inputs, concatenated (no norm first);
- x = [rms(token_embd[token]) * attn_norm, rms(g) * attn_norm_2]: the token embedding row as
  stored (llama.cpp's get_rows, no sqrt(n_embd) scale even for Gemma), then the state;
- attention over x (standard RoPE: NORM mode, pairs (2i, 2i+1), as the GGUF stores q and k),
  plus the raw g as residual; then RMSNorm, a SiLU-gated FFN and the residual again: the
  pre-norm state, which the next draft step takes as its g;
- logits = output(rms(prenorm) * output_norm), over the draft vocabulary.

The training-time unroll (``unroll``): step 0 reads the target's features at every position;
step j reads, at position s, the pre-norm state step j-1 produced at s-1, and attends to the
committed entries up to its anchor s-j and to the anchor's own entries of steps 1..j, as the
drafter's head memory holds them at draft step j. Only this module and train.py import torch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own convention
from torch import nn

from localspec.train.params import HeadShape


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """ggml's NORM RoPE over [B, heads, T, d]: each pair (2i, 2i+1) rotated by
    position * base^(-2i/d)."""
    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)
    angles = positions.to(torch.float32)[:, None] * inv[None, :]  # [T, d/2]
    cos, sin = angles.cos(), angles.sin()
    pairs = x.reshape(*x.shape[:-1], d // 2, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).reshape(x.shape)


def shift(x: torch.Tensor, by: int) -> torch.Tensor:
    """x moved `by` positions later along dim -2 (zeros in front): row s holds row s - by."""
    if by == 0:
        return x
    pad = torch.zeros_like(x[..., :by, :])
    return torch.cat((pad, x[..., :-by, :]), dim=-2)


class Eagle3Head(nn.Module):
    def __init__(self, shape: HeadShape) -> None:
        super().__init__()
        self.shape = shape
        e, hd = shape.n_embd, shape.head_dim
        self.fc = nn.Linear(shape.feature_width, e, bias=False)
        self.attn_norm = RMSNorm(e, shape.rms_eps)
        self.hidden_norm = RMSNorm(e, shape.rms_eps)
        self.q = nn.Linear(2 * e, shape.n_head * hd, bias=False)
        self.k = nn.Linear(2 * e, shape.n_head_kv * hd, bias=False)
        self.v = nn.Linear(2 * e, shape.n_head_kv * hd, bias=False)
        self.o = nn.Linear(shape.n_head * hd, e, bias=False)
        self.ffn_norm = RMSNorm(e, shape.rms_eps)
        self.gate = nn.Linear(e, shape.n_ff, bias=False)
        self.up = nn.Linear(e, shape.n_ff, bias=False)
        self.down = nn.Linear(shape.n_ff, e, bias=False)
        self.output_norm = RMSNorm(e, shape.rms_eps)
        self.output = nn.Linear(e, shape.n_draft, bias=False)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, n, self.shape.head_dim).transpose(1, 2)  # [B, n, T, d]

    def _kv(self, x: torch.Tensor, layer: nn.Linear,
            positions: torch.Tensor | None) -> torch.Tensor:
        out = self._heads(layer(x), self.shape.n_head_kv)
        if positions is not None:
            out = rope(out, positions, self.shape.rope_base)
        return out.repeat_interleave(self.shape.n_head // self.shape.n_head_kv, dim=1)

    def _attend(self, q: torch.Tensor, keys: list[torch.Tensor],
                values: list[torch.Tensor]) -> torch.Tensor:
        """Step j = len(keys) - 1: query s sees step-0 keys s' <= s - j and, of each step
        i = 1..j, the key at s - (j - i) (the same anchor's entries)."""
        j, t = len(keys) - 1, q.shape[-2]
        scale = self.shape.head_dim ** -0.5
        scores = torch.matmul(q, keys[0].transpose(-1, -2)) * scale  # [B, H, T, T]
        rows = torch.arange(t, device=q.device)
        allowed = rows[None, :] <= rows[:, None] - j
        scores = scores.masked_fill(~allowed, float("-inf"))
        extra = [(q * shift(keys[i], j - i)).sum(-1, keepdim=True) * scale for i in range(1, j + 1)]
        weights = torch.softmax(torch.cat([scores, *extra], dim=-1), dim=-1)
        out = torch.matmul(weights[..., :t], values[0])
        for i in range(1, j + 1):
            out = out + weights[..., t + i - 1:t + i] * shift(values[i], j - i)
        return out

    def step(self, emb: torch.Tensor, state: torch.Tensor, keys: list[torch.Tensor],
             values: list[torch.Tensor]) -> torch.Tensor:
        """One unroll step over all positions; appends its keys and values; returns the
        pre-norm state [B, T, E]."""
        x = torch.cat((self.attn_norm(emb), self.hidden_norm(state)), dim=-1)
        positions = torch.arange(x.shape[1], device=x.device)
        q = rope(self._heads(self.q(x), self.shape.n_head), positions, self.shape.rope_base)
        keys.append(self._kv(x, self.k, positions))
        values.append(self._kv(x, self.v, None))
        attn = self._attend(q, keys, values).transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
        h = self.o(attn) + state
        y = self.ffn_norm(h)
        return self.down(F.silu(self.gate(y)) * self.up(y)) + h

    def logits(self, prenorm: torch.Tensor) -> torch.Tensor:
        return self.output(self.output_norm(prenorm))

    def unroll(self, emb: torch.Tensor, features: torch.Tensor, depth: int) -> list[torch.Tensor]:
        """Draft logits of steps 0 .. depth-1. emb[:, s] is the embedding of the token after
        position s, features[:, s] the target's features at s; step j's row s is the draft
        anchored at s - j."""
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        state = self.fc(features)
        out = []
        for j in range(depth):
            prenorm = self.step(emb, state if j == 0 else shift(state, 1), keys, values)
            out.append(self.logits(prenorm))
            state = prenorm
        return out


def init_weights(head: Eagle3Head, seed: int) -> None:
    """Small random matrices (std 1/sqrt(fan_in), the output layer 10x smaller), unit norms."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in head.named_parameters():
            if param.ndim == 2:
                scale = param.shape[1] ** -0.5 * (0.1 if name.startswith("output") else 1.0)
                param.copy_(torch.randn(param.shape, generator=generator) * scale)
