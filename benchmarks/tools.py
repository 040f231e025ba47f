"""Tool calls on the real pair (issue 49's measured goal for tools), through the server.

The set: benchmarks/data/tool_defs.json (4 coding-assistant tools) and
benchmarks/data/tool_requests.jsonl (24 requests; "tool": the tool a person would expect,
null where none is needed). Every request goes through `localspec serve`'s app in this
process (the openai client's HTTP path, on loopback), greedy:

- tool_choice "required", speculative (the pair's drafter, with forced drafting in front):
  the share of replies whose calls parse and validate against their tool's schema, and how
  often the expected tool was called;
- the same requests with "speculative": false (plain decoding under the same grammar): the
  outputs must be identical; tokens/s of the calls in both arms, and their ratio;
- tool_choice "auto": how many replies the model chose to answer with a call, and with the
  expected tool.

    LOCALSPEC_CACHE_DIR=/work/pair-cache2 python benchmarks/tools.py [--pair qwen2.5-coder-1.5b]
        [--limit N] [--max-tokens 96] [--arms required,plain,auto] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from localspec.models.registry import resolve_pair
from localspec.runtime.engine import Engine
from localspec.server import create_app
from localspec.server.background import BackgroundServer
from localspec.server.options import ServerOptions
from localspec.text.schema_check import schema_violation

DATA = Path(__file__).parent / "data"


def load_set(limit: int | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    tools = json.loads((DATA / "tool_defs.json").read_text())
    lines = (DATA / "tool_requests.jsonl").read_text().splitlines()
    requests = [json.loads(line) for line in lines if line.strip()]
    return tools, requests[:limit] if limit else requests


def ask(base: str, model: str, tools: list[dict[str, Any]], request: dict[str, Any],
        choice: str, max_tokens: int, speculative: bool) -> dict[str, Any]:
    body = {"model": model, "temperature": 0, "max_tokens": max_tokens, "tools": tools,
            "tool_choice": choice, "parallel_tool_calls": False, "speculative": speculative,
            "messages": [{"role": "system", "content": "You are a coding assistant with "
                          "tools for the user's repository."},
                         {"role": "user", "content": request["prompt"]}]}
    started = time.monotonic()
    answer = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=1800)
    answer.raise_for_status()
    reply: dict[str, Any] = answer.json()
    reply["wall_seconds"] = time.monotonic() - started
    return reply


def judge(reply: dict[str, Any], schemas: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Whether the reply's calls parse and validate, and which tool it called."""
    message = reply["choices"][0]["message"]
    calls = message.get("tool_calls") or []
    problems = []
    for call in calls:
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        if name not in schemas:
            problems.append(f"unknown tool {name!r}")
        elif (problem := schema_violation(arguments, schemas[name])) is not None:
            problems.append(f"{name}: {problem}")
    stats = reply["localspec"]
    return {
        "called": [c["function"]["name"] for c in calls],
        "valid": bool(calls) and not problems,
        "problems": problems,
        "finish_reason": reply["choices"][0]["finish_reason"],
        "tokens": reply["usage"]["completion_tokens"],
        "tokens_per_second": stats["tokens_per_second"],
        "forced_drafted": stats["drafted_by_kind"].get("forced", 0),
        "forced_accepted": stats["accepted_by_kind"].get("forced", 0),
        "text": json.dumps(message, sort_keys=True, ensure_ascii=False),
    }


def run_arm(base: str, model: str, tools: list[dict[str, Any]], requests: list[dict[str, Any]],
            arm: str, max_tokens: int) -> list[dict[str, Any]]:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    choice = "auto" if arm == "auto" else "required"
    rows = []
    for i, request in enumerate(requests):
        reply = ask(base, model, tools, request, choice, max_tokens, speculative=arm != "plain")
        row = {"prompt": request["prompt"], "expected": request["tool"], **judge(reply, schemas)}
        rows.append(row)
        print(f"[{arm} {i + 1}/{len(requests)}] {row['called'] or '(text)'} "
              f"valid={row['valid']} {row['tokens']} tokens {row['tokens_per_second']:.1f}/s "
              f"forced {row['forced_accepted']}/{row['forced_drafted']}", file=sys.stderr)
    return rows


def summary(arms: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for arm, rows in arms.items():
        n = len(rows)
        called = [r for r in rows if r["called"]]
        expected = [r for r in rows if r["expected"] is not None]
        out[arm] = {
            "requests": n,
            "replies_with_calls": len(called),
            "calls_parse_and_validate": sum(r["valid"] for r in rows),
            "valid_percent": 100.0 * sum(r["valid"] for r in rows) / n if n else 0.0,
            "expected_tool_called": sum(r["expected"] in r["called"] for r in expected),
            "with_an_expected_tool": len(expected),
            "median_tokens_per_second": statistics.median(r["tokens_per_second"] for r in rows)
            if rows else 0.0,
            "tokens_per_second_total": sum(r["tokens"] for r in rows) / sum(
                r["tokens"] / r["tokens_per_second"] for r in rows if r["tokens_per_second"])
            if rows else 0.0,
            "forced_accepted": sum(r["forced_accepted"] for r in rows),
            "forced_drafted": sum(r["forced_drafted"] for r in rows),
        }
    if "required" in arms and "plain" in arms:
        same = [_answer(a) == _answer(b)
                for a, b in zip(arms["required"], arms["plain"], strict=True)]
        out["speculative_equals_plain"] = sum(same)
        ratios = [a["tokens_per_second"] / b["tokens_per_second"]
                  for a, b in zip(arms["required"], arms["plain"], strict=True)
                  if b["tokens_per_second"]]
        out["speedup_median"] = statistics.median(ratios) if ratios else None
        out["speedup_worst"] = min(ratios) if ratios else None
    return out


def _answer(row: dict[str, Any]) -> tuple[str | None, list[tuple[str, str]]]:
    """A reply's content and calls, without the calls' random ids."""
    message = json.loads(row["text"])
    return message.get("content"), [(c["function"]["name"], c["function"]["arguments"])
                                    for c in message.get("tool_calls") or []]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="qwen2.5-coder-1.5b")
    parser.add_argument("--limit", type=int, default=None, help="only the first N requests")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--arms", default="required,plain,auto")
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--json", type=Path, default=None, help="write every row here")
    args = parser.parse_args()

    tools, requests = load_set(args.limit)
    pair = resolve_pair(args.pair, download=False)
    engine = Engine.load(pair.target, pair.drafter, n_ctx=args.ctx)
    arms: dict[str, list[dict[str, Any]]] = {}
    try:
        app = create_app(engine, ServerOptions(), chat_template=pair.chat_template)
        with BackgroundServer(app) as server:
            model = app.state.localspec.model_name
            for arm in args.arms.split(","):
                arms[arm] = run_arm(server.base_url, model, tools, requests, arm,
                                    args.max_tokens)
    finally:
        engine.close()
    result = summary(arms)
    print(json.dumps(result, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps({"summary": result, "rows": arms}, indent=2))


if __name__ == "__main__":
    main()
