"""Checking a client's GBNF grammar before llama.cpp sees it: its syntax, and what it would cost.

A grammar is client data. llama.cpp's parser (llama-grammar.cpp, the pinned release) recurses
once per nested group, expands every repetition into rules, echoes the whole text to stderr on
a syntax error, and accepts a repetition ``{3,1}`` whose optional count underflows (it then
generates rules until memory runs out). A grammar it accepts still costs every generation in
the batch: each alternative is a parse stack that every candidate token is matched against.
So localspec parses the grammar itself first, the way llama.cpp does, and refuses with one
sentence anything llama.cpp would refuse or that passes a limit (``GrammarLimits``): the text's
size, the nesting depth, the rules after llama.cpp's expansion, the alternatives, and the
elements those rules hold. A grammar this check accepts parses in llama.cpp without an error.

The check is plain Python over the text (no vocabulary beyond its size), bounded by the
limits: it stops at the first limit passed, so a hostile text costs at most a few milliseconds
per kilobyte.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

from localspec.errors import InvalidParameterError

# llama.cpp's MAX_REPETITION_THRESHOLD: a repetition count above it is refused (a minimum) or
# read as unbounded (a maximum); the rules a repetition multiplies may not pass it either.
LLAMA_REPETITION_THRESHOLD = 2000


@dataclass(frozen=True)
class GrammarLimits:
    """What one request's grammar may cost (``localspec serve --max-grammar-*``)."""

    max_bytes: int = 256 * 1024  # the grammar's text, UTF-8
    max_depth: int = 64  # nested parenthesised groups
    max_rules: int = 4096  # rules after llama.cpp expands groups and repetitions
    max_alternatives: int = 1024  # '|' branches over all rules (each one more parse stack)
    max_elements: int = 200_000  # symbols in all rules after expansion
    # Seconds one mask of the whole vocabulary may take in the grammar's first state (timed by
    # Engine.check_grammar on the preparing thread): a step pays it for a row whose best tokens
    # the grammar forbids, and every generation sharing the step waits for it.
    max_mask_seconds: float = 0.25

    def validate(self) -> None:
        if isinstance(self.max_mask_seconds, bool) or not isinstance(
                self.max_mask_seconds, (int, float)) or not self.max_mask_seconds > 0:
            raise InvalidParameterError(f"The grammar limit max_mask_seconds="
                                        f"{self.max_mask_seconds!r} is invalid: it must be > 0.")
        for name in ("max_bytes", "max_depth", "max_rules", "max_alternatives", "max_elements"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidParameterError(
                    f"The grammar limit {name}={value!r} is invalid: it must be an integer >= 1.")


DEFAULT_LIMITS = GrammarLimits()


@dataclass(frozen=True)
class GrammarShape:
    """What an accepted grammar holds after llama.cpp's expansion (estimates of its cost)."""

    rules: int
    alternatives: int
    elements: int
    depth: int
    # The ``<text>`` token references, as written (brackets included): llama.cpp tokenizes each
    # and refuses (echoing the whole grammar to stderr) unless it is exactly one token, which
    # only a caller with the vocabulary can check first (Engine.check_grammar).
    token_texts: tuple[str, ...] = ()


class GrammarError(InvalidParameterError):
    """A grammar llama.cpp would refuse, or one past a limit; ``param`` names the field."""

    def __init__(self, message: str, param: str = "grammar") -> None:
        super().__init__(message)
        self.param = param


def check_grammar(text: str, n_vocab: int, limits: GrammarLimits = DEFAULT_LIMITS,
                  param: str = "grammar") -> GrammarShape:
    """Raise GrammarError (one sentence, quoting at most a few characters of the text) unless
    ``text`` is a GBNF grammar that llama.cpp parses and that stays within ``limits``.
    ``n_vocab``: token references ``<[id]>`` must name a token below it."""
    if not isinstance(text, str):
        raise GrammarError("The grammar must be a string of GBNF rules.", param)
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_bytes:
        raise GrammarError(f"The grammar is {size} bytes, more than this server's limit of "
                           f"{limits.max_bytes} (--max-grammar-bytes).", param)
    return _Parser(text, n_vocab, limits, param).parse()


_DIGITS = frozenset("0123456789")


# Grammars an engine checked lately (by digest, with the vocabulary's size): Engine.submit skips
# a second check of a text the server's preparation already passed. Bounded, least recently
# used first out.
_CHECKED: OrderedDict[bytes, float] = OrderedDict()  # digest -> seconds of its first mask
_CHECKED_LOCK = threading.Lock()
_CHECKED_MAX = 256


def _digest(text: str, n_vocab: int) -> bytes:
    data = text.encode("utf-8", "surrogatepass")
    return hashlib.blake2b(data, digest_size=16, salt=n_vocab.to_bytes(16, "little")).digest()


def remember_checked(text: str, n_vocab: int, mask_seconds: float = 0.0) -> None:
    key = _digest(text, n_vocab)
    with _CHECKED_LOCK:
        _CHECKED[key] = mask_seconds
        _CHECKED.move_to_end(key)
        while len(_CHECKED) > _CHECKED_MAX:
            _CHECKED.popitem(last=False)


def was_checked(text: str, n_vocab: int) -> bool:
    return checked_mask_seconds(text, n_vocab) is not None


def checked_mask_seconds(text: str, n_vocab: int) -> float | None:
    """The first-mask seconds of a grammar checked lately, or None when it was not."""
    key = _digest(text, n_vocab)
    with _CHECKED_LOCK:
        if key in _CHECKED:
            _CHECKED.move_to_end(key)
            return _CHECKED[key]
        return None


def _is_word(c: str) -> bool:
    return len(c) == 1 and c.isascii() and (c.isalnum() or c in "-_")


class _Parser:
    """llama_grammar_parser's grammar, walked the same way, counting what it would build."""

    def __init__(self, text: str, n_vocab: int, limits: GrammarLimits, param: str) -> None:
        self.src = text
        self.n_vocab = n_vocab
        self.limits = limits
        self.param = param
        self.symbols: dict[str, bool] = {}  # rule name -> defined
        self.generated = 0  # rules llama.cpp synthesizes (groups, repetitions)
        self.alternatives = 0
        self.elements = 0
        self.depth = 0
        self.deepest = 0
        self.token_texts: list[str] = []

    # ---- errors and limits

    def fail(self, what: str, pos: int) -> GrammarError:
        line = self.src.count("\n", 0, pos) + 1
        column = pos - (self.src.rfind("\n", 0, pos) + 1) + 1
        near = self.src[pos:pos + 24].split("\n", 1)[0]
        where = f" at line {line}, column {column}" + (f" (near {near!r})" if near else "")
        return GrammarError(f"The grammar is invalid: {what}{where}.", self.param)

    def over(self, what: str, limit: int, flag: str) -> GrammarError:
        return GrammarError(f"The grammar is too costly: it has more than {limit} {what} "
                            f"(this server's --{flag}).", self.param)

    def count(self, rules: int = 0, alternatives: int = 0, elements: int = 0) -> None:
        self.generated += rules
        self.alternatives += alternatives
        self.elements += elements
        n_rules = len(self.symbols) + self.generated
        if n_rules > self.limits.max_rules:
            raise self.over("rules after expansion", self.limits.max_rules, "max-grammar-rules")
        if self.alternatives > self.limits.max_alternatives:
            raise self.over("alternatives", self.limits.max_alternatives,
                            "max-grammar-alternatives")
        if self.elements > self.limits.max_elements:
            raise self.over("symbols after expansion", self.limits.max_elements,
                            "max-grammar-rules")

    # ---- lexing, as llama-grammar.cpp's parse_space / parse_name / parse_char

    def at(self, pos: int) -> str:
        return self.src[pos] if pos < len(self.src) else ""

    def space(self, pos: int, newline_ok: bool) -> int:
        while True:
            c = self.at(pos)
            if c == "#":
                while self.at(pos) not in ("", "\r", "\n"):
                    pos += 1
            elif c in (" ", "\t") or (newline_ok and c in ("\r", "\n")):
                pos += 1
            else:
                return pos

    def name(self, pos: int) -> int:
        end = pos
        while _is_word(self.at(end)):
            end += 1
        if end == pos:
            raise self.fail("a rule name is expected", pos)
        return end

    def integer(self, pos: int) -> tuple[int, int]:
        end = pos
        while self.at(end) in _DIGITS:
            end += 1
        if end == pos:
            raise self.fail("an integer is expected", pos)
        if end - pos > 12:
            raise self.fail("the number is too large", pos)
        return int(self.src[pos:end]), end

    def char(self, pos: int, literal: bool = False) -> tuple[int, int]:
        """One character of a literal or class; a literal may not hold NUL (llama.cpp matches
        pieces as C strings), a class may name it in a range."""
        c = self.at(pos)
        if c == "":
            raise self.fail("the text ends inside a literal or character class", pos)
        if c != "\\":
            if c == "\0" or 0xD800 <= ord(c) <= 0xDFFF:
                raise self.fail("a NUL byte or an unpaired surrogate is not a character", pos)
            return ord(c), pos + 1
        escape = self.at(pos + 1)
        sizes = {"x": 2, "u": 4, "U": 8}
        if escape in sizes:
            digits = self.src[pos + 2:pos + 2 + sizes[escape]]
            if len(digits) != sizes[escape] or any(d not in "0123456789abcdefABCDEF"
                                                    for d in digits):
                raise self.fail(f"\\{escape} needs {sizes[escape]} hex digits", pos)
            value = int(digits, 16)
            if (literal and value == 0) or value > 0x10FFFF or 0xD800 <= value <= 0xDFFF:
                raise self.fail("the escape is not a character llama.cpp can match", pos)
            return value, pos + 2 + sizes[escape]
        simple = {"t": 9, "r": 13, "n": 10, "\\": 92, '"': 34, "[": 91, "]": 93, "-": 45}
        if escape not in simple:
            raise self.fail("unknown escape", pos)
        return simple[escape], pos + 2

    def token(self, pos: int) -> int:
        """``<[id]>`` or ``<text>`` (llama.cpp's parse_token); pos is at '<'."""
        start = pos
        pos += 1
        if self.at(pos) == "[":
            value, pos = self.integer(pos + 1)
            if self.at(pos) != "]" or self.at(pos + 1) != ">":
                raise self.fail("a token reference is written <[ID]>", start)
            if value >= self.n_vocab:
                raise self.fail(f"token {value} is outside the vocabulary (0..{self.n_vocab - 1})",
                                start)
            return pos + 2
        end = self.src.find(">", pos)
        if end < 0:
            raise self.fail("a token reference is not closed with '>'", start)
        if "\0" in self.src[pos:end]:
            raise self.fail("a token reference holds a NUL byte", start)
        self.token_texts.append(self.src[start:end + 1])
        return end + 1

    # ---- the grammar, as parse_rule / parse_alternates / parse_sequence

    def parse(self) -> GrammarShape:
        pos = self.space(0, True)
        while pos < len(self.src):
            pos = self.rule(pos)
        undefined = [name for name, defined in self.symbols.items() if not defined]
        if undefined:
            raise GrammarError(f"The grammar is invalid: rule '{undefined[0][:40]}' is used but "
                               "never defined.", self.param)
        if "root" not in self.symbols:
            raise GrammarError("The grammar is invalid: it has no 'root' rule.", self.param)
        return GrammarShape(len(self.symbols) + self.generated, self.alternatives, self.elements,
                            self.deepest, tuple(self.token_texts))

    def rule(self, pos: int) -> int:
        end = self.name(pos)
        name = self.src[pos:end]
        if self.symbols.get(name):
            # llama.cpp lets a later definition replace an earlier one; refusing it is clearer.
            raise self.fail(f"rule '{name[:40]}' is defined twice", pos)
        self.symbols[name] = True
        self.count()
        pos = self.space(end, False)
        if self.src[pos:pos + 3] != "::=":
            raise self.fail("'::=' is expected after the rule name", pos)
        pos = self.alternates(self.space(pos + 3, True), nested=False)
        if self.at(pos) == "\r":
            pos += 2 if self.at(pos + 1) == "\n" else 1
        elif self.at(pos) == "\n":
            pos += 1
        elif pos < len(self.src):
            raise self.fail("a new line or the end is expected", pos)
        return self.space(pos, True)

    def alternates(self, pos: int, nested: bool) -> int:
        # Alternatives are counted as branches: each '|' is one (a rule or group of one
        # alternative branches nowhere).
        pos = self.sequence(pos, nested)
        while self.at(pos) == "|":
            self.count(alternatives=1, elements=1)
            pos = self.sequence(self.space(pos + 1, True), nested)
        self.count(elements=1)  # the rule's end
        return pos

    def sequence(self, pos: int, nested: bool) -> int:
        last_size = 0  # elements of the last symbol, 0: none yet (a repetition needs one)
        prev_rules = 1  # llama.cpp's n_prev_rules
        while True:
            c = self.at(pos)
            symbols_before = len(self.symbols) + self.generated
            if c == '"':
                pos += 1
                size = 0
                while self.at(pos) != '"':
                    _, pos = self.char(pos, literal=True)
                    size += 1
                last_size, prev_rules = size, 1
                self.count(elements=size)
                pos = self.space(pos + 1, nested)
            elif c == "[":
                pos += 1
                if self.at(pos) == "^":
                    pos += 1
                size = 0
                while self.at(pos) != "]":
                    _, pos = self.char(pos)
                    size += 1
                    if self.at(pos) == "-" and self.at(pos + 1) not in ("]", ""):
                        _, pos = self.char(pos + 1)
                        size += 1
                    elif self.at(pos) == "-" and self.at(pos + 1) == "":
                        raise self.fail("the text ends inside a character class", pos)
                last_size, prev_rules = max(size, 1), 1
                self.count(elements=last_size)
                pos = self.space(pos + 1, nested)
            elif c in ("<", "!"):
                if c == "!":
                    pos += 1
                    if self.at(pos) != "<":
                        raise self.fail("'!' must be followed by a token reference", pos)
                pos = self.space(self.token(pos), nested)
                last_size, prev_rules = 1, 1
                self.count(elements=1)
            elif c and _is_word(c):
                end = self.name(pos)
                self.symbols.setdefault(self.src[pos:end], False)
                self.count(elements=1)
                pos = self.space(end, nested)
                last_size, prev_rules = 1, 1
            elif c == "(":
                if self.depth >= self.limits.max_depth:
                    raise self.over("levels of nested groups", self.limits.max_depth,
                                    "max-grammar-depth")
                self.depth += 1
                self.deepest = max(self.deepest, self.depth)
                self.count(rules=1)
                pos = self.alternates(self.space(pos + 1, True), nested=True)
                self.depth -= 1
                prev_rules = max(1, len(self.symbols) + self.generated - symbols_before)
                last_size = 1
                self.count(elements=1)
                if self.at(pos) != ")":
                    raise self.fail("')' is expected", pos)
                pos = self.space(pos + 1, nested)
            elif c == ".":
                last_size, prev_rules = 1, 1
                self.count(elements=1)
                pos = self.space(pos + 1, nested)
            elif c in ("*", "+", "?", "{"):
                if last_size == 0:
                    raise self.fail(f"'{c}' must follow something to repeat", pos)
                at = pos
                if c == "{":
                    low, high, pos = self.braces(self.space(pos + 1, nested), nested)
                else:
                    low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
                    pos = self.space(pos + 1, nested)
                prev_rules = self.repeat(last_size, prev_rules, low, high, at)
                last_size = 1
            else:
                return pos

    def braces(self, pos: int, nested: bool) -> tuple[int, int | None, int]:
        low, pos = self.integer(pos)
        pos = self.space(pos, nested)
        high: int | None = low
        if self.at(pos) == ",":
            pos = self.space(pos + 1, nested)
            high = None
            if self.at(pos) in _DIGITS:
                high, pos = self.integer(pos)
                pos = self.space(pos, nested)
        if self.at(pos) != "}":
            raise self.fail("'}' is expected", pos)
        return low, high, self.space(pos + 1, nested)

    def repeat(self, size: int, prev_rules: int, low: int, high: int | None, at: int) -> int:
        """llama.cpp's handle_repetitions, counted: S{m,n} is m copies of S in the rule and
        n - m nested optional rules of S (one recursive rule when unbounded)."""
        if low > LLAMA_REPETITION_THRESHOLD:
            raise self.fail(f"a repetition minimum above {LLAMA_REPETITION_THRESHOLD}", at)
        if high is not None and high > LLAMA_REPETITION_THRESHOLD:
            high = None  # llama.cpp reads a larger maximum as unbounded
        if high is not None and high < low:
            raise self.fail(f"the repetition {{{low},{high}}} has its minimum above its maximum",
                            at)
        total = high if high else (low if low > 0 else 1)
        if prev_rules * total > LLAMA_REPETITION_THRESHOLD:
            raise self.fail("a repetition multiplies more rules than llama.cpp allows "
                            f"({LLAMA_REPETITION_THRESHOLD})", at)
        optional = 1 if high is None else high - low
        copies = (low - 1) if low > 0 else -1
        # The optional rules' alternatives are not counted: a parse holds one or two of them at a
        # time (go on, or stop), where a flat list of n alternatives holds n stacks at once.
        self.count(rules=optional,
                   elements=copies * size + optional * (size + 3) + (1 if optional else 0))
        return prev_rules * total
