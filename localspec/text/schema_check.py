"""Checking a JSON text against a JSON Schema, for the subset localspec.text.grammar converts (the
bench checks every structured output with it; a reply the grammar shaped must always pass).

Covered: ``type`` (or a list of types), ``properties`` (no other keys: the grammar writes only
the listed ones), ``required``, ``items``, ``minItems``/``maxItems``, ``minLength``/
``maxLength``, ``enum``, ``const``, ``anyOf``/``oneOf``, ``$ref`` to ``#/$defs/...`` or
``#/definitions/...``.
"""

from __future__ import annotations

import json
from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "boolean": (bool,),
    "null": (type(None),), "integer": (int,), "number": (int, float),
}


def schema_violation(text: str, schema: dict[str, Any]) -> str | None:
    """None when ``text`` is one JSON value that ``schema`` accepts; else what is wrong."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        return f"not JSON ({error.msg} at column {error.colno})"
    return _violation(value, schema, schema, "$")


def _is_type(value: Any, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _TYPES.get(kind, (object,)))


def _violation(value: Any, schema: Any, root: dict[str, Any], at: str) -> str | None:
    if schema is True or not isinstance(schema, dict) or not schema:
        return None
    if "$ref" in schema:
        _, group, name = str(schema["$ref"]).split("/", 2)
        return _violation(value, root[group][name], root, at)
    if "const" in schema and value != schema["const"]:
        return f"{at} is not {schema['const']!r}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{at} is not one of {schema['enum']!r}"
    for key in ("anyOf", "oneOf"):
        if key in schema and all(_violation(value, s, root, at) for s in schema[key]):
            return f"{at} matches none of {key}"
    kinds = schema.get("type")
    if kinds is not None:
        kinds = kinds if isinstance(kinds, list) else [kinds]
        if not any(_is_type(value, k) for k in kinds):
            return f"{at} is not of type {'/'.join(kinds)}"
    if isinstance(value, dict):
        return _object_violation(value, schema, root, at)
    if isinstance(value, list):
        return _array_violation(value, schema, root, at)
    if isinstance(value, str) and not schema.get("minLength", 0) <= len(value) <= schema.get(
            "maxLength", len(value)):
        return f"{at} has a length out of bounds"
    return None


def _object_violation(value: dict[str, Any], schema: dict[str, Any], root: dict[str, Any],
                      at: str) -> str | None:
    props: dict[str, Any] = schema.get("properties") or {}
    missing = [k for k in schema.get("required", []) if k not in value]
    if missing:
        return f"{at} lacks {missing[0]!r}"
    extra = [k for k in value if props and k not in props]
    if extra:
        return f"{at} has an unknown key {extra[0]!r}"
    for key, sub in props.items():
        if key in value:
            problem = _violation(value[key], sub, root, f"{at}.{key}")
            if problem:
                return problem
    return None


def _array_violation(value: list[Any], schema: dict[str, Any], root: dict[str, Any],
                     at: str) -> str | None:
    if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)):
        return f"{at} has a number of items out of bounds"
    for i, item in enumerate(value):
        problem = _violation(item, schema.get("items", True), root, f"{at}[{i}]")
        if problem:
            return problem
    return None
