"""``localspec/_core.pyi`` says what the binding (csrc/python/) has: every name in the stubs
exists in the compiled module (and its ``testing`` submodule, stubbed as ``_Testing``), and every
public name of the module is in the stubs."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any

from localspec import _core

STUBS = Path(__file__).resolve().parents[2] / "localspec" / "_core.pyi"
ENUM_MEMBERS = {"name", "value"}  # what pybind11 gives every enum


def stub_members(body: list[ast.stmt]) -> dict[str, list[ast.stmt] | None]:
    """Public names defined in a stub body -> the body of a class, None for anything else."""
    names: dict[str, list[ast.stmt] | None] = {}
    for node in body:
        if isinstance(node, ast.ClassDef):
            names[node.name] = node.body
        elif isinstance(node, ast.FunctionDef):
            names[node.name] = None
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = None
        elif isinstance(node, ast.Assign):
            names.update({t.id: None for t in node.targets if isinstance(t, ast.Name)})
    return {n: b for n, b in names.items() if not n.startswith("_") or n == "_Testing"}


def public(value: object) -> set[str]:
    names = {name for name in dir(value) if not name.startswith("_")}
    return names - ENUM_MEMBERS if "__members__" in dir(value) else names


def compare(body: list[ast.stmt], runtime: Any, where: str) -> list[str]:
    stubs = stub_members(body)
    testing = stubs.pop("_Testing", None)
    problems = [f"{where}: {name} is not stubbed" for name in public(runtime) - set(stubs)]
    problems += [f"{where}: {name} is stubbed but missing" for name in set(stubs) - public(runtime)
                 if name != "ChunkCallback"]
    for name, inner in stubs.items():
        value = getattr(runtime, name, None)
        if name == "testing" and testing is not None:
            problems += compare(testing, value, f"{where}.testing")
        elif inner is not None and inspect.isclass(value):
            problems += [p for p in compare(inner, value, f"{where}.{name}")
                         if not p.endswith("__init__ is stubbed but missing")]
    return problems


def test_stubs_name_what_the_module_has() -> None:
    tree = ast.parse(STUBS.read_text(encoding="utf-8"))
    assert compare(tree.body, _core, "_core") == []
