"""The tree is the architecture (docs/design.md, "Architecture"): these rules keep it so.

- Only ``csrc/llama/`` includes ``llama.h``.
- A ``csrc/`` folder includes only from itself and the folders below it in ``CSRC_LAYERS``
  (no include arrow points back up), always by folder (``"engine/engine.h"``).
- No Python import circle in ``localspec`` or the chat, counting the imports inside functions
  too (a lazy import that closes a circle still ties the modules together).
- design.md's tree names every source folder the repository has, and no other.

Each checker is a function of the files it reads, so that the last tests can break each rule
once on made-up input and see it caught.
"""

from __future__ import annotations

import ast
import re
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Bottom to top: a folder may include from itself and from the folders before it.
CSRC_LAYERS = ("base", "kernels", "rpc", "llama", "sample", "draft", "engine", "train", "python")
_INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
_LLAMA_HEADERS = {"llama.h", "llama-cpp.h"}


def csrc_sources() -> dict[str, str]:
    """csrc/ files as {path relative to csrc/: text}."""
    return {p.relative_to(ROOT / "csrc").as_posix(): p.read_text()
            for p in sorted((ROOT / "csrc").rglob("*")) if p.suffix in {".h", ".cpp"}}


def include_violations(sources: Mapping[str, str]) -> list[str]:
    problems = []
    for path, text in sources.items():
        folder = path.split("/")[0] if "/" in path else ""
        if folder not in CSRC_LAYERS:
            problems.append(f"{path}: not in a concern folder ({', '.join(CSRC_LAYERS)})")
            continue
        for kind, header in _INCLUDE.findall(text):
            name = header.rsplit("/", 1)[-1]
            if name in _LLAMA_HEADERS and folder != "llama":
                problems.append(f"{path} includes {header}: only csrc/llama/ may")
            if kind != '"':
                continue
            target = header.split("/")[0] if "/" in header else ""
            if target not in CSRC_LAYERS:
                if f"{folder}/{header}" in sources or any(p.endswith("/" + header)
                                                          for p in sources):
                    problems.append(f'{path} includes "{header}": name its folder')
                continue
            if CSRC_LAYERS.index(target) > CSRC_LAYERS.index(folder):
                problems.append(f"{path} includes {header}: {target}/ is above {folder}/")
    return problems


def python_modules() -> dict[str, Path]:
    mods = {}
    for base, strip in (("localspec", ""), ("tui/localspec_tui", "tui/")):
        for p in sorted((ROOT / base).rglob("*.py")):
            rel = p.relative_to(ROOT).with_suffix("").as_posix().removeprefix(strip)
            mods[rel.removesuffix("/__init__").replace("/", ".")] = p
    return mods


def imported_modules(source: str, known: Iterable[str]) -> set[str]:
    """The known modules ``source`` imports anywhere (functions included), except under
    ``if TYPE_CHECKING:``; ``from pkg import mod`` counts as importing ``pkg.mod``."""
    known = set(known)
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & known
            found.update(subs)
            if len(subs) < len(node.names):
                found.add(node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return found & known


def import_circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan). An import of a parent
    package is not an edge: importing a submodule always runs its parents first."""
    edges = {m: {d for d in deps if d != m and not m.startswith(d + ".")}
             for m, deps in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return circles


def tracked_folders(source_only: bool) -> set[str]:
    """Folders of tracked files under csrc/, localspec/, tests/, tui/, benchmarks/ and docs/,
    with their parents; ``source_only``: only those holding .py, .h or .cpp files (data folders
    such as snapshots are not source folders)."""
    files = subprocess.run(["git", "ls-files", "csrc", "localspec", "tests", "tui", "benchmarks",
                            "docs"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    folders = {Path(f).parent for f in files
               if not source_only or Path(f).suffix in {".py", ".h", ".cpp"}}
    if not source_only:
        folders |= {parent for f in folders for parent in f.parents}
    return {f.as_posix() for f in folders} - {"."}


def design_tree_folders(design: str) -> set[str]:
    """The folders named in design.md's tree: the lines of the fenced block under
    "## Architecture" that end in a "/" entry (``csrc/engine/``), nested by indentation."""
    section = design.split("## Architecture", 1)[1].split("\n## ", 1)[0]
    block = section.split("```text", 1)[1].split("```", 1)[0]
    folders: set[str] = set()
    parents: list[tuple[int, str]] = []
    for line in block.splitlines():
        match = re.match(r"(\s*)(\S+/)(\s|$)", line)
        if not match:
            continue
        depth = len(match.group(1))
        while parents and parents[-1][0] >= depth:
            parents.pop()
        path = (parents[-1][1] if parents else "") + match.group(2)
        parents.append((depth, path))
        folders.add(path.rstrip("/"))
    return folders


# ---- the rules on the repository


def test_only_csrc_llama_includes_llama_h_and_no_include_points_up() -> None:
    assert include_violations(csrc_sources()) == []


def test_no_python_import_circle() -> None:
    mods = python_modules()
    graph = {m: imported_modules(p.read_text(), mods) for m, p in mods.items()}
    assert import_circles(graph) == []


def test_design_md_tree_names_every_source_folder() -> None:
    named = design_tree_folders((ROOT / "docs" / "design.md").read_text())
    missing = tracked_folders(source_only=True) - named
    assert sorted(missing) == [], "folders missing from docs/design.md's tree"
    unknown = named - tracked_folders(source_only=False)
    assert sorted(unknown) == [], "folders in docs/design.md's tree that the repository lacks"


# ---- each rule, broken once


def test_the_include_rules_catch_each_break() -> None:
    good = {"engine/engine.cpp": '#include "engine/engine.h"\n#include "draft/drafter.h"\n',
            "engine/engine.h": "", "draft/drafter.h": '#include "llama/llama_backend.h"\n',
            "llama/llama_backend.h": "", "llama/llama_backend.cpp": "#include <llama.h>\n"}
    assert include_violations(good) == []
    llama_h = {**good, "engine/engine.cpp": "#include <llama.h>\n"}
    assert any("only csrc/llama/" in p for p in include_violations(llama_h))
    upward = {**good, "draft/drafter.h": '#include "engine/engine.h"\n'}
    assert any("engine/ is above draft/" in p for p in include_violations(upward))
    bare = {**good, "engine/engine.cpp": '#include "drafter.h"\n'}
    assert any("name its folder" in p for p in include_violations(bare))
    stray = {**good, "stray.cpp": ""}
    assert any("not in a concern folder" in p for p in include_violations(stray))


def test_the_circle_check_catches_a_lazy_circle_and_not_a_type_checking_one() -> None:
    known = {"pkg.a", "pkg.b", "pkg"}
    lazy = "def f():\n    from pkg.b import x\n"
    guarded = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import y\n"
    back = "from pkg import a\n"
    assert import_circles({"pkg.a": imported_modules(lazy, known),
                           "pkg.b": imported_modules(back, known)}) == [["pkg.a", "pkg.b"]]
    assert import_circles({"pkg.a": imported_modules(lazy, known),
                           "pkg.b": imported_modules(guarded, known)}) == []
    # A submodule importing its own package is not a circle.
    assert import_circles({"pkg": {"pkg.a"}, "pkg.a": {"pkg"}}) == []


def test_the_tree_check_reads_nested_folders() -> None:
    design = ("## Architecture\n\n```text\ncsrc/\n  base/      errors\n  engine/    the step\n"
              "localspec/\n  runtime/   engine thread\n```\n\n## Next\n")
    assert design_tree_folders(design) == {"csrc", "csrc/base", "csrc/engine", "localspec",
                                           "localspec/runtime"}
