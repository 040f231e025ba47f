"""Short descriptions of what is loaded, for the status bar and the welcome line."""

from __future__ import annotations

from pathlib import Path

from localspec.models.kind import ModelKind
from localspec.types import EngineInfo

from .widgets.status import ModelLine

KEYS = "Enter sends · F1 help · F2 speculation · F5 colours · Esc stops · Ctrl+Q quits"



def drafter_label(info: EngineInfo) -> str:
    spec = info.drafter_spec
    if spec.path is None:
        return "ngram+mtp" if spec.kind == "mtp" else spec.kind
    stem = Path(spec.path).stem
    labels = {"model": stem, "hybrid": "ngram+" + stem, "eagle3": "ngram+eagle3 " + stem}
    return labels[spec.kind]


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
    draft = info.drafter_spec.path
    try:
        from localspec.planning.planner import format_bytes, plan_from_files

        fast_head = "localspec" in info.verify_head or "localspec" in info.draft_head
        plan = plan_from_files(info.target_path, draft, info.n_ctx, fast_head=fast_head,
                               mtp=info.drafter_spec.kind == "mtp")
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
