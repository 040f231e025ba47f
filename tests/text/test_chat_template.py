"""Chat template rendering (transformers-compatible Jinja2) and history trimming."""

from __future__ import annotations

import pytest

from localspec.text.chat_template import (
    CHATML_TEMPLATE,
    ChatTemplateError,
    fit_history,
    render_chat,
)

LLAMA3_LIKE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
    "{{ message['content'] | trim }}{{ '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)

# Gemma-style: folds the system prompt into the first user turn and insists on alternation.
ALTERNATING = """{{ bos_token }}{% if messages[0]['role'] == 'system' %}
    {% set first = messages[0]['content'] + '\n\n' %}
    {% set loop_messages = messages[1:] %}
{% else %}
    {% set first = '' %}
    {% set loop_messages = messages %}
{% endif %}
{% for message in loop_messages %}
    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {% endif %}
    {% set role = 'model' if message['role'] == 'assistant' else message['role'] %}
<start_of_turn>{{ role }}
{{ (first if loop.first else '') + message['content'] | trim }}<end_of_turn>
{% endfor %}
{% if add_generation_prompt %}
<start_of_turn>model
{% endif %}"""

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Name a colour."},
]


def render(template: str, messages: list[dict], **kwargs: bool) -> str:
    return render_chat(template, messages, bos_token="<s>", eos_token="</s>", **kwargs)


def test_chatml_fallback_multi_turn_with_system() -> None:
    text = render("", CONVERSATION)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nName a colour.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_add_generation_prompt_false_leaves_the_turn_closed() -> None:
    text = render(LLAMA3_LIKE, CONVERSATION[:2], add_generation_prompt=False)
    assert text.startswith("<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>")
    assert text.endswith("Hi<|eot_id|>")


def test_trim_and_lstrip_blocks_like_transformers() -> None:
    text = render(ALTERNATING, CONVERSATION)
    assert text == (
        "<s><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nName a colour.<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_raise_exception_becomes_a_clear_error() -> None:
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        render(ALTERNATING, bad)


def test_tojson_keeps_unicode_and_strftime_now_exists() -> None:
    template = "{{ messages[0] | tojson }}|{{ strftime_now('%Y') | length }}"
    text = render(template, [{"role": "user", "content": "café"}])
    assert text == '{"role": "user", "content": "café"}|4'


def test_loop_controls_extension_is_enabled() -> None:
    template = (
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{{ m.role }}{% endfor %}"
    )
    assert render(template, CONVERSATION) == "system"


def test_sandbox_blocks_attribute_escapes() -> None:
    with pytest.raises(ChatTemplateError):
        render("{{ ''.__class__.__mro__[1].__subclasses__() }}", CONVERSATION)


def test_invalid_template_syntax() -> None:
    with pytest.raises(ChatTemplateError, match="not valid Jinja2"):
        render("{% for m in messages %}", CONVERSATION)


def word_count(messages: list[dict]) -> int:
    return sum(len(m["content"].split()) + 1 for m in messages)


def test_fit_history_keeps_everything_that_fits() -> None:
    kept, dropped = fit_history(CONVERSATION, word_count, 100)
    assert kept == CONVERSATION and dropped == 0


def test_fit_history_drops_oldest_turns_but_keeps_system_and_last() -> None:
    history = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "one two three"},
        {"role": "assistant", "content": "four five six"},
        {"role": "user", "content": "seven"},
        {"role": "assistant", "content": "eight"},
        {"role": "user", "content": "nine"},
    ]
    kept, dropped = fit_history(history, word_count, 8)
    # The first user turn goes, and its orphaned assistant reply with it.
    assert dropped == 2
    assert [m["content"] for m in kept] == ["s", "seven", "eight", "nine"]
    assert kept[1]["role"] == "user"


def test_fit_history_never_drops_system_or_last_message() -> None:
    history = [
        {"role": "system", "content": "a b c d e f"},
        {"role": "user", "content": "g"},
        {"role": "assistant", "content": "h"},
        {"role": "user", "content": "i j k l m"},
    ]
    kept, dropped = fit_history(history, word_count, 3)
    assert dropped == 2
    assert [m["role"] for m in kept] == ["system", "user"]
    assert kept[-1]["content"] == "i j k l m"


# ---- a template is data from a model file or a user: its work is bounded


@pytest.mark.parametrize(("template", "fragment"), [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
     "runs too long"),
    ("{{ 'x' * 1000000000 }}", "repeats a value"),
    ("{{ [1] * 1000000000 }}", "repeats a value"),
    ("{% for i in range(1000000000) %}{% endfor %}", "Range too big"),
    ("{{ 2 ** 100000000 }}", "too large a power"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "failed to render"),
])
def test_a_runaway_template_is_stopped_with_one_sentence(template: str, fragment: str) -> None:
    import time

    started = time.perf_counter()
    with pytest.raises(ChatTemplateError, match=fragment):
        render_chat(template, [{"role": "user", "content": "hi"}], bos_token="", eos_token="")
    assert time.perf_counter() - started < 10


def test_the_budget_leaves_real_conversations_alone() -> None:
    import sys

    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"}
                for i in range(2000)]
    before = sys.gettrace()
    text = render_chat(CHATML_TEMPLATE, messages, bos_token="", eos_token="")
    assert text.count("<|im_start|>") == 2001
    assert sys.gettrace() is before  # the render's tracer is gone
