"""The training code's head (localspec/train/model.py) computes what the core's drafter
computes: one random head, the same target features and tokens, the same draft logits within
1e-3 and the same argmax, for the committed rows and for unrolled draft steps read off the
training-time unroll at two anchors. This is what catches a wrong RoPE layout, embedding
scale, norm placement, attention mask or d2t before it shows only as low acceptance."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from localspec import _core  # noqa: E402
from localspec.testing.synthetic import TinyConfig, write_model  # noqa: E402
from localspec.train.model import Eagle3Head, init_weights  # noqa: E402
from localspec.train.params import HeadShape  # noqa: E402
from localspec.train.train import numpy_weights  # noqa: E402
from localspec.train.write import write_head  # noqa: E402

TEXT = ("the quick brown fox jumps over the lazy dog. hello world, this is a tiny model for "
        "tests. once upon a time there was a small model")
UNROLL = 3


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    """A 48-wide target (the core's draft-vocabulary layer then computes in F32, as torch
    does), a random head with four query and two key heads and uneven norms, and real
    features."""
    tmp = tmp_path_factory.mktemp("parity")
    target = write_model(tmp / "t48.gguf", TinyConfig(n_embd=48, n_head=4, n_head_kv=2, n_ff=96,
                                                      n_layer=4, seed=11))
    collector = _core.FeatureCollector(str(target), [1, 2, 3], 256, 1)
    tokens = collector.tokenize(TEXT, True, False)
    features, _ = collector.collect(tokens)
    d2t = tuple(sorted(np.random.default_rng(0).choice(collector.n_vocab, 40, replace=False)))
    shape = HeadShape(n_embd=48, n_head=4, n_head_kv=2, head_dim=12, n_ff=96,
                      target_layers=(1, 2, 3), target_width=48, n_draft=40,
                      d2t=tuple(int(t) for t in d2t))
    head = Eagle3Head(shape)
    init_weights(head, 0)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        head.output.weight.mul_(30)  # peaky logits: distinct argmaxes
        for norm in (head.attn_norm, head.hidden_norm, head.ffn_norm, head.output_norm):
            norm.weight.add_(0.3 * torch.randn(48, generator=generator))
    path = write_head(tmp / "head.gguf", numpy_weights(head), shape, target, "f32")
    return target, path, head, tokens, features


def torch_rows(head: Eagle3Head, target: Path, tokens: list[int], features: np.ndarray,
               n: int) -> np.ndarray:
    """The training unroll over tokens[: n + UNROLL] with features known up to n - 2: its
    step-0 rows 0..n-2 and, for the anchor n - 2, steps 1..UNROLL (rows n-1 .. n-2+UNROLL)."""
    emb = torch.from_numpy(_core.token_embeddings(str(target), tokens[1:n + UNROLL]))[None]
    feats = torch.zeros(1, n + UNROLL - 1, features.shape[1])
    feats[0, :n - 1] = torch.from_numpy(features[:n - 1])
    with torch.no_grad():
        steps = head.unroll(emb, feats, UNROLL + 1)
    rows = [steps[0][0, :n - 1]] + [steps[j][0, n - 2 + j][None] for j in range(1, UNROLL + 1)]
    return torch.cat(rows).numpy()


@pytest.mark.parametrize("n", [24, 13])
def test_torch_head_matches_the_core(setup, n: int) -> None:
    target, path, head, tokens, features = setup
    core = _core.eagle3_head_logits(str(target), str(path), tokens[:n], features[:n],
                                             tokens[n:n + UNROLL], f32_cache=True)
    ours = torch_rows(head, target, tokens, features, n)
    assert core["logits"].shape == ours.shape == (n - 1 + UNROLL, 40)
    assert np.abs(core["logits"] - ours).max() < 1e-3
    assert (core["logits"].argmax(1) == ours.argmax(1)).all()
    assert core["d2t"] == list(head.shape.d2t)


def test_the_served_cache_agrees_too(setup) -> None:
    """With the F16 cache and flash attention the drafter runs with, the logits move by
    rounding only: the same argmax everywhere."""
    target, path, head, tokens, features = setup
    n = 24
    core = _core.eagle3_head_logits(str(target), str(path), tokens[:n], features[:n],
                                             tokens[n:n + UNROLL], f32_cache=False)
    ours = torch_rows(head, target, tokens, features, n)
    assert np.abs(core["logits"] - ours).max() < 5e-2
    assert (core["logits"].argmax(1) == ours.argmax(1)).all()
