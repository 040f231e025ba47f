"""A client's JSON Schema is client data: malformed keyword values and unsatisfiable schemas
get one sentence (never a 500 or a traceback, never a grammar that matches nothing or the
wrong thing), and no schema makes a grammar that grows faster than the schema."""

from __future__ import annotations

import json
import re

import pytest

from localspec.errors import InvalidParameterError
from localspec.text.grammar import MAX_SCHEMA_DEPTH, json_schema_to_gbnf, load_json_schema
from localspec.text.grammar_check import GrammarError, check_grammar

MALFORMED = [
    ({"type": "string", "minLength": "abc"}, "'minLength'"),
    ({"type": {}}, "'type'"),
    ({"type": "text"}, "'type'"),
    ({"properties": {"a": {}}, "required": 5}, "'required'"),
    ({"enum": 5}, "'enum'"),
    ({"enum": {"a": 1}}, "'enum'"),
    ({"type": "string", "maxLength": float("inf")}, "'maxLength'"),
    ({"type": "string", "maxLength": True}, "'maxLength'"),
    ({"type": "array", "minItems": -1}, "'minItems'"),
    ({"type": "array", "items": [{"type": "integer"}]}, "'items'"),
    ({"properties": [1, 2]}, "'properties'"),
    ({"$ref": 5}, "'$ref'"),
    ({"$defs": [], "$ref": "#/$defs/a"}, "'$defs'"),
]
UNSATISFIABLE = [
    ({"enum": []}, "'enum'"),
    ({"type": []}, "'type'"),
    ({"anyOf": []}, "'anyOf'"),
    ({"oneOf": []}, "'oneOf'"),
    ({"type": "string", "minLength": 10, "maxLength": 2}, "larger than maxLength"),
    ({"type": "array", "minItems": 3, "maxItems": 1}, "larger than maxItems"),
    ({"type": "object", "properties": {"a": {}}, "required": ["b"]}, "not among the properties"),
    ({"type": "string", "maxLength": 5000}, "from 0 to 2000"),  # llama.cpp would not enforce it
]


@pytest.mark.parametrize(("schema", "fragment"), MALFORMED + UNSATISFIABLE)
def test_a_bad_schema_gets_one_sentence(schema: dict, fragment: str) -> None:
    with pytest.raises(InvalidParameterError) as raised:
        json_schema_to_gbnf(schema)
    message = str(raised.value)
    assert fragment in message and "\n" not in message and len(message) < 300


def test_a_nested_object_names_where() -> None:
    schema = {"type": "object", "properties": {"inner": {"type": "string", "minLength": "x"}}}
    with pytest.raises(InvalidParameterError, match="at 'root-inner'"):
        json_schema_to_gbnf(schema)


def test_deep_nesting_is_refused_not_a_recursion_error() -> None:
    schema: dict = {"type": "integer"}
    for _ in range(5000):
        schema = {"type": "array", "items": schema}
    with pytest.raises(InvalidParameterError, match=f"deeper than {MAX_SCHEMA_DEPTH}"):
        json_schema_to_gbnf(schema)


def test_infinity_from_a_file_is_refused() -> None:
    schema = load_json_schema('{"type": "string", "maxLength": Infinity}', "--json-schema s")
    with pytest.raises(InvalidParameterError, match="maxLength"):
        json_schema_to_gbnf(schema)


def optional_object(n: int) -> dict:
    return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}


def test_optional_properties_grow_the_grammar_linearly() -> None:
    """900 optional properties took llama.cpp ~50 s: the chain was written out quadratically."""
    small, large = (len(json_schema_to_gbnf(optional_object(n))) for n in (100, 400))
    assert large < 4.5 * small  # quadratic growth would give ~16x
    check_grammar(json_schema_to_gbnf(optional_object(900)), 1000)


def rule_regex(grammar: str, name: str) -> str:
    """A regular expression for rule ``name`` of a grammar made of literals, rule references,
    groups, '?' and '|' only (what the optional chain is made of); ``integer`` stands for 0."""
    rules = dict(line.split(" ::= ", 1) for line in grammar.splitlines() if " ::= " in line)
    tokens = re.findall(r'"(?:\\.|[^"\\])*"|[\w-]+|[()?|]', rules[name])
    out = []
    for token in tokens:
        if token.startswith('"'):
            out.append(re.escape(re.sub(r"\\(.)", r"\1", token[1:-1])))
        elif token == "integer":
            out.append("0")
        elif token[0].isalnum() or token[0] == "-":
            out.append(f"(?:{rule_regex(grammar, token)})")
        else:
            out.append("(?:" if token == "(" else token)
    return "".join(out)


@pytest.mark.parametrize("present", [[], ["p0"], ["p2"], ["p1", "p3"], ["p0", "p1", "p2", "p3"]])
def test_the_optional_chain_allows_exactly_the_ordered_subsets(present: list[str]) -> None:
    """The rules' language is unchanged by the linear chain: any ordered subset of the
    optional properties, and no other order."""
    pattern = rule_regex(json_schema_to_gbnf(optional_object(4)), "s-root")
    assert re.fullmatch(pattern, "{" + ", ".join(f'"{p}": 0' for p in present) + "}")
    if len(present) >= 2:
        reordered = "{" + ", ".join(f'"{p}": 0' for p in reversed(present)) + "}"
        assert not re.fullmatch(pattern, reordered)


def test_the_issues_large_choices_pass_the_limits_as_one_sentence() -> None:
    for schema in ({"enum": list(range(100_000))},
                   {"anyOf": [{"const": i} for i in range(2000)]}):
        with pytest.raises(GrammarError, match="too costly|bytes"):
            check_grammar(json_schema_to_gbnf(schema), 1000)


def test_a_valid_schema_still_converts() -> None:
    schema = json.loads('{"type": "object", "properties": {"a": {"type": "string", '
                        '"minLength": 1, "maxLength": 8}, "b": {"type": "array", "items": '
                        '{"enum": ["x", "y"]}, "maxItems": 2}}, "required": ["a"]}')
    check_grammar(json_schema_to_gbnf(schema), 1000)
