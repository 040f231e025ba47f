"""Short descriptions of what is loaded, for the status bar and the welcome line."""

from __future__ import annotations

from pathlib import Path

from localspec.loading import EAGLE3_PREFIX, HYBRID_PREFIX, draft_model_path
from localspec.model_kind import ModelKind
from localspec.types import EngineInfo

from .widgets.status import ModelLine

KEYS = "Enter sends · F1 help · F2 speculation · F5 colours · Esc stops · Ctrl+Q quits"

KEYWORD_DRAFTERS = ("ngram", "none")


def drafter_label(info: EngineInfo) -> str:
    if info.drafter in KEYWORD_DRAFTERS:
        return info.drafter
    if info.drafter.startswith(HYBRID_PREFIX):
        return "ngram+" + Path(draft_model_path(info.drafter)).stem
    if info.drafter.startswith(EAGLE3_PREFIX):
        return "ngram+eagle3 " + Path(draft_model_path(info.drafter)).stem
    return Path(info.drafter).stem


def pair_label(info: EngineInfo) -> str:
    return f"{info.target_name} + {drafter_label(info)}"


def welcome_lines(info: EngineInfo, model: ModelLine, kind: ModelKind,
                  pair: str | None) -> list[str]:
    """The chat's first lines: the model (base or instruct), the drafter and the keys; for a
    base model, what to pull for an instruct one."""
    kind = kind.with_template_hint(info.chat_template is not None)
    label = f" ({kind.label})" if kind.label else ""
    lines = [f"{info.target_name}{label} drafted by {drafter_label(info)}. {KEYS}."]
    if kind.advice():
        lines.append(f"{pair or info.target_name} is {kind.advice()}.")
    return lines


def memory_summary(info: EngineInfo) -> str:
    """One line from the memory planner (docs/design.md, "Memory plan"), e.g. ``mem CPU 312.4 MiB``.

    Falls back to the files' sizes when the planner cannot read the models.
    """
    draft = None if info.drafter in KEYWORD_DRAFTERS else draft_model_path(info.drafter)
    try:
        from localspec.planner import format_bytes, plan_from_files

        fast_head = "localspec" in info.verify_head or "localspec" in info.draft_head
        plan = plan_from_files(info.target_path, draft, info.n_ctx, fast_head=fast_head)
    except Exception:  # the summary is decoration: never fail the chat over it
        return _file_sizes(info.target_path, draft)
    text = f"mem {plan.device.name} {format_bytes(plan.device_bytes)}"
    if plan.host_bytes:
        text += f" + host {format_bytes(plan.host_bytes)}"
    target = plan.target
    if plan.device.kind != "cpu" and target.layers_on_device < target.n_layer:
        text += f" ({target.layers_on_device}/{target.n_layer} layers)"
    return text


def _file_sizes(target: str, draft: str | None) -> str:
    total = 0
    for path in (target, draft):
        if path is not None and Path(path).is_file():
            total += Path(path).stat().st_size
    return f"weights {total / (1 << 20):.1f} MiB" if total else "mem ?"
