"""GBNF grammars for structured output: any JSON object, or JSON that follows a JSON Schema.

llama.cpp's grammar engine (through the core) enforces the grammar token by token. The JSON
Schema subset converted here: ``type`` (object, array, string, number, integer, boolean, null,
or a list of them), ``properties`` (in the order given; ``required`` ones always present, the
others optional), ``additionalProperties: false`` (implied: only the listed properties are
generated), ``items``, ``minItems``/``maxItems``, ``minLength``/``maxLength``, ``enum``,
``const``, ``anyOf``/``oneOf``, ``$ref`` to ``#/$defs/...`` or ``#/definitions/...``.
Annotations (``title``, ``description``, ``default``, ``examples``, ``format``) are ignored.
Constraints the grammar cannot enforce (``pattern``, numeric bounds, ...) are refused with an
error, so a reply is always valid against the schema.

A schema's JSON has one layout: ``{"key": value, "key": value}`` and ``[a, b]`` (a space after
``:`` and ``,``, none elsewhere; whitespace only inside values of no given type and at the end).
The layout is the one models write unprompted, and it makes every key, colon and comma of the
schema text that the grammar forces, which speculation drafts for free (docs/design.md,
"Grammar-forced drafting"). ``json_object`` mode keeps JSON's free whitespace.
"""

from __future__ import annotations

import json
import re
from typing import Any

from localspec.errors import InvalidParameterError

_COMMON = r"""
value ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ( "," ws string ":" ws value )* )? "}" ws
array ::= "[" ws ( value ( "," ws value )* )? "]" ws
string ::= "\"" char* "\"" ws
char ::= [^"\\\x7F\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
number ::= integer ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )? ws
integer ::= "-"? ( "0" | [1-9] [0-9]{0,15} )
ws ::= | " " | "\n" [ \t]{0,20}
"""

# Any JSON object (OpenAI's response_format {"type": "json_object"}).
JSON_OBJECT_GBNF = "root ::= object\n" + _COMMON

_IGNORED = {"title", "description", "default", "examples", "format", "$schema", "$id",
            "$comment", "additionalProperties", "required", "properties", "items", "type",
            "enum", "const", "anyOf", "oneOf", "$ref", "$defs", "definitions", "minItems",
            "maxItems", "minLength", "maxLength", "strict", "name"}
# The schema's values, without trailing whitespace (the layout above).
_PRIMITIVES = {
    "string": "str",
    "number": "num",
    "integer": "integer",
    "boolean": '("true" | "false")',
    "null": '"null"',
}
_SCHEMA_COMMON = r"""
str ::= "\"" char* "\""
num ::= integer ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
"""
# The rules every converted schema may use (JSON values of no given type, strings, numbers).
SCHEMA_COMMON_RULES = _COMMON + _SCHEMA_COMMON


def json_schema_to_gbnf(schema: Any) -> str:
    """A GBNF grammar (root rule ``root``) whose sentences are the JSON values ``schema``
    accepts. Raises InvalidParameterError naming what the subset does not cover."""
    if not isinstance(schema, dict):
        raise InvalidParameterError("The JSON Schema must be a JSON object.")
    converter = _Converter(schema)
    root = converter.visit(schema, "root")
    rules = [f"root ::= {root} ws"]
    rules += [f"{name} ::= {body}" for name, body in converter.rules.items()]
    return "\n".join(rules) + "\n" + SCHEMA_COMMON_RULES


def load_json_schema(text: str, source: str) -> dict[str, Any]:
    """Parse a JSON Schema (bare, or OpenAI's {"name", "schema", "strict"} wrapper)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidParameterError(f"{source} is not valid JSON ({error}).") from None
    if isinstance(data, dict) and isinstance(data.get("schema"), dict) and "name" in data:
        data = data["schema"]
    if not isinstance(data, dict):
        raise InvalidParameterError(f"{source} must hold a JSON Schema object.")
    return data


def _literal(value: Any, after: str = "") -> str:
    """A GBNF string literal matching the compact JSON text of ``value``, then ``after``."""
    text = json.dumps(value, ensure_ascii=False) + after
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def json_schema_rules(schema: Any, prefix: str) -> tuple[str, dict[str, str]]:
    """The GBNF expression for the values ``schema`` accepts (in the layout above, without
    trailing whitespace) and the rules it needs, named ``prefix...``; a grammar holding them
    adds ``SCHEMA_COMMON_RULES`` once. For grammars that embed several schemas (tool calls)."""
    if not isinstance(schema, dict):
        raise InvalidParameterError("The JSON Schema must be a JSON object.")
    converter = _Converter(schema, prefix)
    return converter.visit(schema, "root"), converter.rules


class _Converter:
    def __init__(self, root: dict[str, Any], prefix: str = "s-") -> None:
        self.root = root
        self.prefix = prefix
        self.rules: dict[str, str] = {}
        self.refs: dict[str, str] = {}
        self.depth = 0

    def rule(self, hint: str, body: str) -> str:
        base = re.sub(r"[^a-zA-Z0-9-]+", "-", hint).strip("-") or "r"
        name, n = f"{self.prefix}{base}", 1
        while name in self.rules:
            n += 1
            name = f"{self.prefix}{base}{n}"
        self.rules[name] = body
        return name

    def visit(self, schema: Any, hint: str) -> str:
        if schema is True or schema == {}:
            return "value"
        if not isinstance(schema, dict):
            raise InvalidParameterError(f"The JSON Schema at '{_short(hint)}' must be an object.")
        self.depth += 1
        try:
            if self.depth > MAX_SCHEMA_DEPTH:
                raise InvalidParameterError(
                    f"The JSON Schema nests deeper than {MAX_SCHEMA_DEPTH} levels; flatten it.")
            _check_keywords(schema, hint)
            return self.convert(schema, hint)
        finally:
            self.depth -= 1

    def convert(self, schema: dict[str, Any], hint: str) -> str:
        unknown = sorted(set(schema) - _IGNORED)
        if unknown:
            raise InvalidParameterError(
                f"The JSON Schema keyword '{_short(unknown[0])}' (at '{_short(hint)}') cannot be "
                "enforced by a "
                "grammar; remove it or describe the constraint in the prompt."
            )
        if "$ref" in schema:
            return self.ref(schema["$ref"])
        if "const" in schema:
            return _literal(schema["const"])
        if "enum" in schema:
            return "(" + " | ".join(_literal(v) for v in schema["enum"]) + ")"
        for key in ("anyOf", "oneOf"):
            if key in schema:
                options = [self.visit(s, f"{hint}-{i}") for i, s in enumerate(schema[key])]
                return "(" + " | ".join(options) + ")"
        return self.typed(schema, hint)

    def typed(self, schema: dict[str, Any], hint: str) -> str:
        kind = schema.get("type")
        if isinstance(kind, list):
            return "(" + " | ".join(self.typed({**schema, "type": k}, hint) for k in kind) + ")"
        if kind is None:
            kind = "object" if "properties" in schema else "array" if "items" in schema else None
        if kind == "object":
            return self.object(schema, hint)
        if kind == "array":
            return self.array(schema, hint)
        if kind == "string" and ("minLength" in schema or "maxLength" in schema):
            low, high = schema.get("minLength", 0), schema.get("maxLength")
            count = f"{{{low},{'' if high is None else high}}}"
            return f'"\\"" char{count} "\\""'
        if kind in _PRIMITIVES:
            return _PRIMITIVES[kind]
        if kind is None:
            return "value"
        raise InvalidParameterError(f"Unknown JSON Schema type {_short(repr(kind))} at "
                                    f"'{_short(hint)}'.")

    def object(self, schema: dict[str, Any], hint: str) -> str:
        props: dict[str, Any] = schema.get("properties") or {}
        if not props:
            return "object"
        required = set(schema.get("required", []))
        pairs = {
            key: f'{_literal(key, ": ")} {self.visit(sub, f"{hint}-{key}")}'
            for key, sub in props.items()
        }
        fixed = [pairs[k] for k in props if k in required]
        optional = [pairs[k] for k in props if k not in required]
        if fixed:
            body = ' ", " '.join(fixed)
            body += "".join(f' ( ", " {pair} )?' for pair in optional)
        else:
            body = f"( {self.optional_chain(optional, hint)} )?"
        return self.rule(hint, f'"{{" {body} "}}"')

    def optional_chain(self, pairs: list[str], hint: str) -> str:
        """Any non-empty ordered subset of ``pairs``, comma-separated, in rules of a constant
        size each (written out, the chain grew quadratically: 900 optional properties made a
        grammar llama.cpp took ~50 s over):
            tail_k ::= ( ", " p_k )? tail_k+1      (any ordered subset of p_k.., each after ", ")
            start_k ::= p_k tail_k+1 | start_k+1   (a non-empty one, from its first pair)"""
        tail = ""  # tail_n: nothing
        tails = [""] * len(pairs)
        for k in range(len(pairs) - 1, 0, -1):
            tail = self.rule(f"{hint}-tail", f'( ", " {pairs[k]} )?' + (f" {tail}" if tail else ""))
            tails[k - 1] = tail
        start = f"{pairs[-1]}"
        for k in range(len(pairs) - 2, -1, -1):
            choice = f"{pairs[k]} {tails[k]} | {start}"
            start = self.rule(f"{hint}-from", choice) if k > 0 else choice
        return start

    def array(self, schema: dict[str, Any], hint: str) -> str:
        item = self.visit(schema.get("items", True), f"{hint}-item")
        low, high = schema.get("minItems", 0), schema.get("maxItems")
        if high == 0:
            return '"[]"'
        more = f"{{{max(low - 1, 0)},{'' if high is None else high - 1}}}"
        items = f'{item} ( ", " {item} ){more}'
        body = items if low > 0 else f"( {items} )?"
        return self.rule(hint, f'"[" {body} "]"')

    def ref(self, ref: Any) -> str:
        if ref in self.refs:
            return self.refs[ref]
        match = re.fullmatch(r"#/(\$defs|definitions)/([^/]+)", str(ref))
        target = self.root.get(match.group(1), {}).get(match.group(2)) if match else None
        if target is None:
            raise InvalidParameterError(
                f"The JSON Schema reference {_short(repr(ref))} cannot be resolved.")
        name = self.rule(f"ref-{match.group(2)}", "")  # type: ignore[union-attr]
        self.refs[ref] = name
        self.rules[name] = self.visit(target, f"ref-{match.group(2)}")  # type: ignore[union-attr]
        return name


MAX_SCHEMA_DEPTH = 64  # nested schemas (objects in arrays in ...); deeper is refused
MAX_LENGTH = 2000  # llama.cpp repeats at most 2000 times (grammar_check.LLAMA_REPETITION_THRESHOLD)
_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}


def _short(text: str, limit: int = 60) -> str:
    """Client text quoted in an error: at most ``limit`` characters."""
    return text if len(text) <= limit else text[:limit] + "..."


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_LENGTH


def _check_keywords(schema: dict[str, Any], hint: str) -> None:
    """The supported keywords' values have the types and ranges JSON Schema's meta-schema
    gives them, and together they can be satisfied; else one sentence naming the keyword."""
    where = f" (at '{_short(hint)}')"

    def bad(keyword: str, rule: str) -> InvalidParameterError:
        return InvalidParameterError(f"The JSON Schema keyword '{keyword}'{where} {rule}.")

    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not kinds or not all(isinstance(k, str) and k in _TYPES for k in kinds):
            raise bad("type", f"must be one of {', '.join(sorted(_TYPES))}, or a non-empty "
                      "list of them")
    for keyword in ("minLength", "maxLength", "minItems", "maxItems"):
        if keyword in schema and not _is_count(schema[keyword]):
            raise bad(keyword, f"must be an integer from 0 to {MAX_LENGTH}")
    for low, high in (("minLength", "maxLength"), ("minItems", "maxItems")):
        if schema.get(low, 0) > schema.get(high, MAX_LENGTH):
            raise bad(low, f"is larger than {high}: no value can satisfy both")
    if "properties" in schema and not (
            isinstance(schema["properties"], dict)
            and all(isinstance(v, (dict, bool)) for v in schema["properties"].values())):
        raise bad("properties", "must be an object of schemas")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise bad("required", "must be a list of property names")
    missing = [r for r in required if r not in (schema.get("properties") or {})]
    if missing and schema.get("properties"):
        raise bad("required", f"names '{_short(missing[0])}', which is not among the "
                  "properties (only listed properties are generated)")
    if "items" in schema and not isinstance(schema["items"], (dict, bool)):
        raise bad("items", "must be one schema (tuple forms are not supported)")
    if "enum" in schema and not (isinstance(schema["enum"], list) and schema["enum"]):
        raise bad("enum", "must be a non-empty list of values")
    for keyword in ("anyOf", "oneOf"):
        if keyword in schema and not (isinstance(schema[keyword], list) and schema[keyword]):
            raise bad(keyword, "must be a non-empty list of schemas")
    if "$ref" in schema and not isinstance(schema["$ref"], str):
        raise bad("$ref", "must be a string")
    for keyword in ("$defs", "definitions"):
        if keyword in schema and not isinstance(schema[keyword], dict):
            raise bad(keyword, "must be an object of schemas")
