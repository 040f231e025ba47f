"""Writes the FIM measurement set (``benchmarks/fim/cases.jsonl``) from this repository's code.

    python benchmarks/fim/make_cases.py

Each case cuts a source file in a function body: ``middle`` is 1-3 whole lines starting at the
line holding ``anchor``, ``prefix`` the ``PREFIX_LINES`` lines before them, ``suffix`` the
``SUFFIX_LINES`` lines after. The texts are stored, so the set stays the same when the files
change; ``source`` says where each came from (at the commit that wrote the file).
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).with_name("cases.jsonl")
PREFIX_LINES, SUFFIX_LINES = 40, 20
# (file, text on the first line of the middle, lines in the middle)
CUTS = [
    ("localspec/text/fim.py", "prefix_take = min(len(prefix_tokens)", 2),
    ("localspec/server/infill.py", "elapsed_ms = chunk.stats.generation_seconds", 3),
    ("localspec/server/prepare.py", "longest = max(len(engine.token_text(t)", 2),
    ("localspec/runtime/handle.py", "if not self._finished.wait(timeout):", 2),
    ("localspec/types.py", 'text = text.strip().lower()', 3),
    ("localspec/server/responses.py", "prompt = result.stats.prompt_tokens or prompt_tokens", 2),
    ("localspec/server/options.py", "if self.max_queue < 1:", 2),
    ("localspec/server/bridge.py", "self._loop.call_soon_threadsafe(self._events.put_nowait", 3),
    ("localspec/text/chat_template.py", "add_bos = not (info.bos_text", 2),
    ("localspec/server/errors.py", 'return ".".join(str(part) for part in loc', 1),
    ("localspec/testing/synthetic.py", "for b in range(256):", 3),
    ("localspec/commands/run.py", "data = sys.stdin.buffer.read()", 3),
    ("csrc/draft/ngram_drafter.cpp", "const int from = start + n;", 3),
    ("csrc/draft/ngram_drafter.cpp", "const int len = static_cast<int>(context.size());", 2),
    ("csrc/engine/speculative_step.cpp", "while (n < d.size() && u.start + n", 2),
    ("csrc/draft/combinators.cpp", "if (!drafter) drafter = make_(slot);", 1),
]


def cut(path: str, anchor: str, n_lines: int) -> dict[str, str]:
    lines = (ROOT / path).read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if anchor in line)
    return {
        "source": f"{path}:{first + 1}",
        "prefix": "".join(lines[max(0, first - PREFIX_LINES): first]),
        "middle": "".join(lines[first: first + n_lines]),
        "suffix": "".join(lines[first + n_lines: first + n_lines + SUFFIX_LINES]),
    }


def main() -> None:
    with OUT.open("w") as out:
        for i, (path, anchor, n_lines) in enumerate(CUTS):
            out.write(json.dumps({"id": f"fim-{i:02d}", **cut(path, anchor, n_lines)}) + "\n")
    print(f"{len(CUTS)} cases -> {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
