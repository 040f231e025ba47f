"""Fill-in-the-middle prompt building (localspec.text.fim) with a character tokenizer."""

from __future__ import annotations

from localspec.text.fim import (
    CHUNK_SEPARATOR,
    FIM_WINDOW,
    ExtraChunk,
    FimTokens,
    build_fim_prompt,
    find_fim_tokens,
)

PRE, SUF, MID, REPO, SEP, BOS = 1001, 1002, 1003, 1004, 1005, 1006
QWEN = FimTokens(PRE, SUF, MID, REPO, SEP)


def chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_qwen_layout_with_extra_chunks_and_typed_prompt() -> None:
    built = build_fim_prompt(
        QWEN, chars, prefix="def f(", suffix=")\n", prompt="x",
        extra=[ExtraChunk("a.py", "A"), ExtraChunk("b.py", "B")], bos=[BOS],
        n_ctx=4096, n_predict=64,
    )
    assert built.tokens == [
        BOS, REPO, *chars("myproject\n"),
        SEP, *chars("a.py\n"), *chars("A"), SEP, *chars("b.py\n"), *chars("B"),
        SEP, *chars("filename\n"),
        PRE, *chars("def f("), *chars("x"), SUF, *chars(")\n"), MID,
    ]
    assert (built.prefix_dropped, built.suffix_dropped, built.extra_dropped) == (0, 0, 0)


def test_a_vocabulary_without_repo_or_file_separator_uses_plain_separators() -> None:
    built = build_fim_prompt(FimTokens(PRE, SUF, MID), chars, prefix="p", suffix="s",
                             extra=[ExtraChunk("a.py", "A")], n_ctx=4096, n_predict=8)
    assert built.tokens == [*chars(CHUNK_SEPARATOR), *chars("A"), PRE, *chars("p"), SUF,
                            *chars("s"), MID]


def test_long_prefix_and_suffix_are_trimmed_at_their_far_ends() -> None:
    prefix, suffix = "a" * 5000 + "NEAR", "near" + "z" * 5000
    built = build_fim_prompt(QWEN, chars, prefix=prefix, suffix=suffix, prompt="ty",
                             n_ctx=8192, n_predict=128)
    window = FIM_WINDOW
    start = built.tokens.index(PRE)
    kept_prefix = built.tokens[start + 1: built.tokens.index(SUF)]
    kept_suffix = built.tokens[built.tokens.index(SUF) + 1: -1]
    assert kept_prefix == chars(prefix[-(3 * window // 4):] + "ty")
    assert kept_suffix == chars(suffix[: window // 4 - 2 - 2])
    assert built.prefix_dropped == len(prefix) - 3 * window // 4
    assert len(built.tokens) <= 8192 - 128


def test_extra_context_keeps_its_end_within_what_the_context_has_left() -> None:
    extra = [ExtraChunk("old.py", "o" * 3000), ExtraChunk("new.py", "recent")]
    built = build_fim_prompt(QWEN, chars, prefix="p", suffix="s", extra=extra,
                             n_ctx=1024, n_predict=100)
    # the window is min(2048, 1024 / 2, 1024 - 400) = 512; the extra gets 1024 - 512 - 800 = 0
    built = build_fim_prompt(QWEN, chars, prefix="p", suffix="s", extra=extra,
                             n_ctx=1024, n_predict=400)
    assert built.tokens[0] == PRE and built.extra_dropped > 0
    roomy = build_fim_prompt(QWEN, chars, prefix="p", suffix="s", extra=extra,
                             n_ctx=4096, n_predict=100)
    before = roomy.tokens[: roomy.tokens.index(PRE)]
    assert len(before) == 4096 - 2048 - 200
    assert before[-len(chars("recent") + [SEP] + chars("filename\n")):] == [
        *chars("recent"), SEP, *chars("filename\n")]


def test_fim_tokens_are_found_by_their_text() -> None:
    vocab = ["a", "<|fim_suffix|>", "<|fim_prefix|>", "<|fim_middle|>", "<|file_sep|>"]
    assert find_fim_tokens(len(vocab), vocab.__getitem__) == FimTokens(2, 1, 3, None, 4)
    assert find_fim_tokens(2, ["a", "<|fim_prefix|>"].__getitem__) is None
