"""Which characters of a reply came from accepted draft tokens and which from the target.

The engine reports provenance per token; the transcript shows characters. The tracker keeps
the reply's tokens and maps each run of same-provenance tokens to a character span by
detokenizing prefixes of the reply (the engine's ``detokenize`` is safe from any thread), so a
token split across chunk boundaries or a multi-token character still lands in the right place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from localspec.types import Provenance

Span = tuple[int, int, Provenance]  # [start, end) in the reply's text


@dataclass
class ProvenanceTracker:
    detokenize: Callable[[Sequence[int]], str]
    tokens: list[int] = field(default_factory=list)
    _covered: int = 0  # characters of detokenized text already assigned to a span

    def add(self, tokens: Sequence[int], provenance: Sequence[Provenance]) -> list[Span]:
        """Record one chunk's tokens; return the new spans (in detokenized-text offsets)."""
        spans: list[Span] = []
        for run_tokens, kind in _runs(tokens, provenance):
            self.tokens.extend(run_tokens)
            try:
                end = len(self.detokenize(self.tokens))
            except Exception:  # a partial UTF-8 sequence the binding refuses: defer to next run
                continue
            if end > self._covered:
                spans.append((self._covered, end, kind))
                self._covered = end
        return spans

    def leading_offset(self, shown_text: str) -> int:
        """Characters the displayed text dropped at its start (e.g. a stripped leading space)."""
        try:
            full = self.detokenize(self.tokens)
        except Exception:
            return 0
        if full.startswith(shown_text):
            return 0
        stripped = full.lstrip()
        return len(full) - len(stripped) if stripped.startswith(shown_text.lstrip()) else 0


def _runs(
    tokens: Sequence[int], provenance: Sequence[Provenance]
) -> list[tuple[list[int], Provenance]]:
    runs: list[tuple[list[int], Provenance]] = []
    for token, kind in zip(tokens, provenance, strict=False):
        if runs and runs[-1][1] == kind:
            runs[-1][0].append(token)
        else:
            runs.append(([token], kind))
    return runs


def merge_spans(spans: list[Span], new: Sequence[Span]) -> None:
    """Append ``new`` to ``spans`` in place, joining neighbours of the same provenance."""
    for span in new:
        if spans and spans[-1][2] == span[2] and spans[-1][1] == span[0]:
            spans[-1] = (spans[-1][0], span[1], span[2])
        else:
            spans.append(span)
