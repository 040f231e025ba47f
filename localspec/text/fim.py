"""Fill-in-the-middle prompts from a model's own FIM tokens (llama.cpp server's ``/infill`` layout).

The prompt, in tokens (Qwen2.5-Coder's repo-level pattern, arXiv 2409.12186)::

    [BOS] <|repo_name|>myproject\\n <|file_sep|>NAME\\n TEXT ... <|file_sep|>filename\\n
    <|fim_prefix|>PREFIX PROMPT <|fim_suffix|>SUFFIX <|fim_middle|>

The extra chunks (``input_extra``) come first, each after a file separator with its file name;
a model without ``<|file_sep|>`` gets a plain-text separator between chunks instead, one without
``<|repo_name|>`` no repository line. The user's text is tokenized without parsing special tokens:
a ``<|fim_prefix|>`` typed in a file is text, never a control token.

Trimming (as llama.cpp's server does, with a window of ``FIM_WINDOW`` tokens in place of its
batch size, or half the context when that is less): the prefix keeps its last 3/4 of the window,
the suffix its first quarter less the prompt and two tokens; the extra chunks keep their end, in
what the context has left after the window and twice the tokens to generate. The extra context's
budget does not depend on the prefix and suffix, so its tokens stay put from one keystroke to
the next and the cached prompt is reused. Nothing is refused for
being long; what is dropped is the far part of the file and the oldest extra context. (One
difference: llama.cpp puts a BOS after the extra context, localspec at the very start; the
Qwen2.5-Coder vocabularies add none.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from localspec.errors import InvalidParameterError
from localspec.types import EngineInfo

FIM_WINDOW = 2048  # llama.cpp's default batch size: the prefix + suffix + prompt budget
REPO_NAME = "myproject"  # llama.cpp's fixed names: a prompt it builds, we build the same
CURRENT_FILE = "filename"
CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"  # between extra chunks when there is no <|file_sep|>
# The spellings of each FIM token in the vocabularies llama.cpp knows (Qwen2.5-Coder and
# CodeGemma, StarCoder, DeepSeek-Coder, Code Llama), first found wins.
_SPELLINGS: dict[str, tuple[str, ...]] = {
    "prefix": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
               "▁<PRE>"),
    "suffix": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
               "▁<SUF>"),
    "middle": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
               "▁<MID>"),
    "repo": ("<|repo_name|>", "<reponame>"),
    "file_sep": ("<|file_sep|>", "<|file_separator|>", "<file_sep>", "<filename>"),
}
_REQUIRED = ("prefix", "suffix", "middle")


@dataclass(frozen=True)
class FimTokens:
    """A vocabulary's FIM token ids; ``repo`` and ``file_sep`` are optional (None)."""

    prefix: int
    suffix: int
    middle: int
    repo: int | None = None
    file_sep: int | None = None


@dataclass(frozen=True)
class ExtraChunk:
    """One ``input_extra`` entry: a file's name and some of its text."""

    filename: str
    text: str


@dataclass(frozen=True)
class FimInput:
    """What a fill-in-the-middle request asks (``/infill``'s fields, ``run --fim-*``): the text
    before the gap, the text after it, text typed after the prefix, and other files' text."""

    prefix: str
    suffix: str
    prompt: str = ""
    extra: tuple[ExtraChunk, ...] = ()

    def text_bytes(self) -> int:
        texts = [self.prefix, self.suffix, self.prompt,
                 *(c.text + c.filename for c in self.extra)]
        return sum(len(t.encode("utf-8")) for t in texts)


class Vocabulary(Protocol):
    """What building a prompt needs of a model (localspec.runtime.engine.Engine has it)."""

    @property
    def info(self) -> EngineInfo: ...

    def tokenize(self, text: str, add_special: bool = True,
                 parse_special: bool = True) -> list[int]: ...

    def token_text(self, token: int) -> str: ...


@dataclass(frozen=True)
class FimPrompt:
    tokens: list[int]
    prefix_dropped: int  # tokens trimmed off the prefix's start
    suffix_dropped: int  # tokens trimmed off the suffix's end
    extra_dropped: int  # tokens trimmed off the extra context's start


def find_fim_tokens(n_vocab: int, token_text: Callable[[int], str]) -> FimTokens | None:
    """The FIM tokens of a vocabulary, by their text; None when prefix, suffix or middle is
    missing (the model was not trained to fill in the middle)."""
    wanted = {spelling: role for role, spellings in _SPELLINGS.items() for spelling in spellings}
    found: dict[str, dict[str, int]] = {}
    for token in range(n_vocab):
        text = token_text(token)
        role = wanted.get(text)
        if role is not None:
            found.setdefault(role, {}).setdefault(text, token)
    ids: dict[str, int | None] = {}
    for role, spellings in _SPELLINGS.items():
        by_text = found.get(role, {})
        ids[role] = next((by_text[s] for s in spellings if s in by_text), None)
    if any(ids[role] is None for role in _REQUIRED):
        return None
    return FimTokens(ids["prefix"], ids["suffix"], ids["middle"],  # type: ignore[arg-type]
                     ids["repo"], ids["file_sep"])


def model_fim_prompt(model: Vocabulary, request: FimInput, n_predict: int, *,
                     fim: FimTokens | None = None, param: str = "prefix") -> FimPrompt:
    """The FIM prompt of ``request`` for ``model`` (its FIM tokens: ``fim``, else looked up in
    its vocabulary); raises InvalidParameterError naming ``param`` when it has none."""
    fim = fim or find_fim_tokens(model.info.n_vocab, model.token_text)
    if fim is None:
        raise missing_fim_error(param)

    def plain(text: str) -> list[int]:  # user text: no BOS, special tokens' spellings as text
        return model.tokenize(text, add_special=False, parse_special=False) if text else []

    return build_fim_prompt(
        fim, plain, prefix=request.prefix, suffix=request.suffix, prompt=request.prompt,
        extra=request.extra, bos=special_prefix(model), n_ctx=model.info.n_ctx,
        n_predict=n_predict,
    )


def special_prefix(model: Vocabulary) -> list[int]:
    """The tokens the model adds in front of every prompt (usually just BOS, maybe nothing)."""
    with_special = model.tokenize("a", add_special=True, parse_special=False)
    plain = model.tokenize("a", add_special=False, parse_special=False)
    if plain and with_special[-len(plain) :] == plain:
        return with_special[: len(with_special) - len(plain)]
    return with_special[:1] if len(with_special) > len(plain) else []


def missing_fim_error(param: str) -> InvalidParameterError:
    error = InvalidParameterError(
        "This model has no fill-in-the-middle tokens (<|fim_prefix|>, <|fim_suffix|>, "
        "<|fim_middle|> or another family's spelling), so it cannot complete between a prefix "
        "and a suffix; serve a FIM-trained model such as Qwen2.5-Coder.")
    error.param = param  # type: ignore[attr-defined]
    return error


def build_fim_prompt(
    fim: FimTokens,
    tokenize: Callable[[str], list[int]],
    *,
    prefix: str,
    suffix: str,
    prompt: str = "",
    extra: Sequence[ExtraChunk] = (),
    bos: Sequence[int] = (),
    n_ctx: int,
    n_predict: int,
) -> FimPrompt:
    """The prompt tokens (module docstring). ``tokenize``: text to tokens, no specials added or
    parsed; ``bos``: what the model puts first (its BOS, or nothing); ``n_predict``: the tokens
    the request may generate."""
    window = max(8, min(FIM_WINDOW, n_ctx // 2, n_ctx - n_predict))
    prefix_tokens, suffix_tokens = tokenize(prefix), tokenize(suffix)
    prompt_tokens = tokenize(prompt) if prompt else []
    extra_tokens = _extra_tokens(fim, tokenize, extra)

    prefix_take = min(len(prefix_tokens), 3 * (window // 4))
    suffix_take = min(len(suffix_tokens), max(0, window // 4 - (2 + len(prompt_tokens))))
    extra_take = min(len(extra_tokens), max(0, n_ctx - window - 2 * n_predict))

    kept_prefix = prefix_tokens[len(prefix_tokens) - prefix_take:]
    kept_extra = extra_tokens[len(extra_tokens) - extra_take:]
    tokens = [
        *bos, *kept_extra,
        fim.prefix, *kept_prefix, *prompt_tokens,
        fim.suffix, *suffix_tokens[:suffix_take],
        fim.middle,
    ]
    return FimPrompt(tokens, len(prefix_tokens) - prefix_take, len(suffix_tokens) - suffix_take,
                     len(extra_tokens) - extra_take)


def _extra_tokens(
    fim: FimTokens, tokenize: Callable[[str], list[int]], extra: Sequence[ExtraChunk]
) -> list[int]:
    out: list[int] = []
    if fim.repo is not None:
        out += [fim.repo, *tokenize(REPO_NAME + "\n")]
    for chunk in extra:
        if fim.file_sep is not None:
            out += [fim.file_sep, *tokenize(chunk.filename + "\n")]
        else:
            out += tokenize(CHUNK_SEPARATOR)
        out += tokenize(chunk.text)
    if fim.file_sep is not None:
        out += [fim.file_sep, *tokenize(CURRENT_FILE + "\n")]
    return out
