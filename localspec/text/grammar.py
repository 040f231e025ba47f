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


def json_schema_to_gbnf(schema: Any) -> str:
    """A GBNF grammar (root rule ``root``) whose sentences are the JSON values ``schema``
    accepts. Raises InvalidParameterError naming what the subset does not cover."""
    if not isinstance(schema, dict):
        raise InvalidParameterError("The JSON Schema must be a JSON object.")
    converter = _Converter(schema)
    root = converter.visit(schema, "root")
    rules = [f"root ::= {root} ws"]
    rules += [f"{name} ::= {body}" for name, body in converter.rules.items()]
    return "\n".join(rules) + "\n" + _COMMON + _SCHEMA_COMMON


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


class _Converter:
    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.rules: dict[str, str] = {}
        self.refs: dict[str, str] = {}

    def rule(self, hint: str, body: str) -> str:
        base = re.sub(r"[^a-zA-Z0-9-]+", "-", hint).strip("-") or "r"
        name, n = f"s-{base}", 1
        while name in self.rules:
            n += 1
            name = f"s-{base}{n}"
        self.rules[name] = body
        return name

    def visit(self, schema: Any, hint: str) -> str:
        if schema is True or schema == {}:
            return "value"
        if not isinstance(schema, dict):
            raise InvalidParameterError(f"The JSON Schema at '{hint}' must be an object.")
        unknown = sorted(set(schema) - _IGNORED)
        if unknown:
            raise InvalidParameterError(
                f"The JSON Schema keyword '{unknown[0]}' (at '{hint}') cannot be enforced by a "
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
            low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
            count = f"{{{low},{'' if high is None else int(high)}}}"
            return f'"\\"" char{count} "\\""'
        if kind in _PRIMITIVES:
            return _PRIMITIVES[kind]
        if kind is None:
            return "value"
        raise InvalidParameterError(f"Unknown JSON Schema type {kind!r} at '{hint}'.")

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
        """Any non-empty ordered subset of ``pairs``, comma-separated."""
        tail = "".join(f' ( ", " {p} )?' for p in pairs[1:])
        first = f"{pairs[0]}{tail}"
        if len(pairs) == 1:
            return first
        rest = self.rule(f"{hint}-rest", self.optional_chain(pairs[1:], hint))
        return f"{first} | {rest}"

    def array(self, schema: dict[str, Any], hint: str) -> str:
        item = self.visit(schema.get("items", True), f"{hint}-item")
        low, high = int(schema.get("minItems", 0)), schema.get("maxItems")
        if high is not None and int(high) == 0:
            return '"[]"'
        more = f"{{{max(low - 1, 0)},{'' if high is None else int(high) - 1}}}"
        items = f'{item} ( ", " {item} ){more}'
        body = items if low > 0 else f"( {items} )?"
        return self.rule(hint, f'"[" {body} "]"')

    def ref(self, ref: Any) -> str:
        if ref in self.refs:
            return self.refs[ref]
        match = re.fullmatch(r"#/(\$defs|definitions)/([^/]+)", str(ref))
        target = self.root.get(match.group(1), {}).get(match.group(2)) if match else None
        if target is None:
            raise InvalidParameterError(f"The JSON Schema reference {ref!r} cannot be resolved.")
        name = self.rule(f"ref-{match.group(2)}", "")  # type: ignore[union-attr]
        self.refs[ref] = name
        self.rules[name] = self.visit(target, f"ref-{match.group(2)}")  # type: ignore[union-attr]
        return name
