"""A client's grammar is checked by localspec before llama.cpp parses it (localspec.text.
grammar_check): what llama.cpp would refuse, run away on or crash on gets one sentence, what
passes a limit says which, and what the check accepts llama.cpp accepts too."""

from __future__ import annotations

import time

import pytest

from localspec.errors import InvalidParameterError
from localspec.runtime.engine import Engine
from localspec.text.grammar import JSON_OBJECT_GBNF, json_schema_to_gbnf
from localspec.text.grammar_check import (
    GrammarError,
    GrammarLimits,
    check_grammar,
    remember_checked,
    was_checked,
)
from localspec.types import GenerationParams

N_VOCAB = 1000

VALID = [
    'root ::= "yes" | "no"',
    "root ::= [a-m] [a-z ]*\n",
    'root ::= item ("," item)*\nitem ::= [0-9]+ # a comment\n',
    'root ::= "a"{2,5} "b"{3} "c"{1,} "d"?',
    'root ::= [^"\\\\\\x00-\\x1F] "\\u00e9\\t\\n\\r\\"\\[\\]\\-" .',
    'root ::= (\n  "x"\n  | "y"\n)\r\n',
    'root ::= <[5]> !<[6]> "z"',
    'root ::= ("a"{50}){50}',
    JSON_OBJECT_GBNF,
    json_schema_to_gbnf({"type": "object", "properties": {"n": {"type": "integer"},
                                                            "s": {"type": "string",
                                                                  "maxLength": 30}},
                         "required": ["n"]}),
]

# (grammar, a fragment of the sentence). The first ones make llama.cpp's parser run away or
# crash; the rest it would refuse after echoing the whole text to stderr.
INVALID = [
    ('root ::= "a"{3,1}', "minimum above its maximum"),
    ("root ::= " + "(" * 100 + '"a"' + ")" * 100, "levels of nested groups"),
    ("root ::= <[99999999]>", "outside the vocabulary"),
    ('root ::= "\\x00"', "not a character"),
    ('root ::= "a\0b"', "NUL"),
    ('root ::= "a"{2001}', "minimum above 2000"),
    ('root ::= ("a"{1,100}){100}', "multiplies more rules"),
    ("root ::= (", "')' is expected"),
    ("root ::= x", "rule 'x' is used but never defined"),
    ('rule ::= "a"', "no 'root' rule"),
    ('root := "a"', "'::=' is expected"),
    ('root ::= "abc', "ends inside"),
    ("root ::= [a-", "ends inside"),
    ('root ::= "\\q"', "unknown escape"),
    ('root ::= "\\x4"', "hex digits"),
    ("root ::= *", "must follow something"),
    ('root ::= "a" )', "a new line or the end is expected"),
    ('root ::= "a"\nroot ::= "b"', "defined twice"),
    ("root ::= <[5]", "<[ID]>"),
]


@pytest.mark.parametrize("grammar", VALID)
def test_valid_grammars_pass(grammar: str) -> None:
    check_grammar(grammar, N_VOCAB)


@pytest.mark.parametrize(("grammar", "fragment"), INVALID)
def test_invalid_grammars_get_one_sentence(grammar: str, fragment: str) -> None:
    with pytest.raises(GrammarError, match="grammar is") as raised:
        check_grammar(grammar, N_VOCAB)
    message = str(raised.value)
    assert fragment in message
    assert message.count("\n") == 0 and len(message) < 300  # one sentence, no echo
    assert raised.value.param == "grammar"


@pytest.mark.parametrize(("limit", "grammar", "flag"), [
    ("max_bytes", 'root ::= "' + "a" * 5000 + '"', "--max-grammar-bytes"),
    ("max_alternatives", "root ::= " + " | ".join(f'"w{i}"' for i in range(300)),
     "--max-grammar-alternatives"),
    ("max_rules", "root ::= " + " ".join(f'("a{i}")' for i in range(300)), "--max-grammar-rules"),
    ("max_depth", "root ::= " + "(" * 20 + '"a"' + ")" * 20, "--max-grammar-depth"),
])
def test_each_limit_names_its_flag(limit: str, grammar: str, flag: str) -> None:
    small = GrammarLimits(**{limit: 100 if limit != "max_depth" else 10})
    check_grammar(grammar, N_VOCAB)  # within the defaults
    with pytest.raises(GrammarError, match=flag):
        check_grammar(grammar, N_VOCAB, small)


def test_the_issues_costly_grammars_are_refused_fast() -> None:
    """20,000 alternatives froze the other streams for minutes; 200,000 nested parentheses
    crashed the server: each is refused within milliseconds."""
    for grammar in ("root ::= " + " | ".join(f'"a{i}"' for i in range(20_000)),
                    "root ::= " + "(" * 200_000 + '"a"' + ")" * 200_000,
                    "root ::= " + "(" * 60 + '"a"' + ")" * 60 + ' "b"{3,1}'):
        started = time.perf_counter()
        with pytest.raises(GrammarError):
            check_grammar(grammar, N_VOCAB, GrammarLimits(max_bytes=10 * 1024 * 1024))
        assert time.perf_counter() - started < 1.0


def test_limits_are_validated() -> None:
    with pytest.raises(InvalidParameterError, match="max_rules"):
        GrammarLimits(max_rules=0).validate()


def test_the_checked_cache_is_per_vocabulary() -> None:
    remember_checked('root ::= "cached"', 10)
    assert was_checked('root ::= "cached"', 10)
    assert not was_checked('root ::= "cached"', 11)
    assert not was_checked('root ::= "other"', 10)


# ---- against llama.cpp's own parser, on a real (tiny) model


@pytest.fixture(scope="module")
def engine(tiny_model_path) -> Engine:  # type: ignore[no-untyped-def]
    with Engine.load(tiny_model_path, draft="none", n_ctx=256) as loaded:
        yield loaded


@pytest.mark.parametrize("grammar", VALID)
def test_what_the_check_accepts_llama_cpp_accepts(engine: Engine, grammar: str) -> None:
    engine.check_grammar(grammar)


# The plain syntax errors of INVALID (not the limits, not what would run away or crash, and
# not a rule defined twice, which llama.cpp takes as a redefinition).
SYNTAX_ERRORS = [grammar for grammar, fragment in INVALID
                 if fragment in {"')' is expected", "rule 'x' is used but never defined",
                                 "'::=' is expected", "ends inside", "unknown escape",
                                 "hex digits", "must follow something",
                                 "a new line or the end is expected", "<[ID]>"}]


@pytest.mark.parametrize("grammar", SYNTAX_ERRORS)
def test_what_the_check_refuses_llama_cpp_refuses_too(engine: Engine, grammar: str) -> None:
    """llama.cpp refuses the syntax errors as well: the check is not stricter than GBNF."""
    assert len(SYNTAX_ERRORS) == 10
    with pytest.raises(InvalidParameterError):
        engine._core.check_grammar(grammar)


def test_the_engine_refuses_before_the_core(engine: Engine) -> None:
    """Engine.submit checks a grammar it has not seen: the runaway repetition never reaches
    llama.cpp (whose parser would generate rules until memory runs out)."""
    with pytest.raises(GrammarError, match="minimum above its maximum"):
        engine.generate("hi", GenerationParams(max_tokens=4, grammar='root ::= "a"{3,1}'))


def test_a_text_token_reference_must_be_one_token(engine: Engine) -> None:
    """llama.cpp refuses it too, but only after echoing the whole grammar to stderr."""
    special = engine.token_text(engine.info.n_vocab - 1)  # the tiny model's <|im_end|>
    engine.check_grammar(f'root ::= "a" {special}')
    with pytest.raises(GrammarError, match="is not exactly one token"):
        engine.check_grammar('root ::= <two words here>')


def test_a_grammar_whose_vocabulary_check_is_too_slow_is_refused(engine: Engine) -> None:
    """The mask of the whole vocabulary in the grammar's first state is timed when the grammar
    is checked: every generation sharing a step waits for it (--max-grammar-mask-seconds)."""
    words = "root ::= " + " | ".join(f'"w{i}"' for i in range(200))
    engine.check_grammar(words)  # cheap on the tiny vocabulary
    with pytest.raises(GrammarError, match="--max-grammar-mask-seconds"):
        engine.check_grammar(words, GrammarLimits(max_mask_seconds=1e-9))
