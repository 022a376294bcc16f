"""Chat templates rendered with jinja2 equal transformers' rendering; the sandbox holds."""

from __future__ import annotations

import datetime

import jinja2
import pytest

from toolkit.models import apply_chat_template, load_tokenizer

CHATS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "Und 3+3? Ünïcödé ✓"}],
]


class FakeTokenizer:
    def __init__(self, template, special=None):
        self.chat_template = template
        self.special_tokens_map = special or {"bos_token": "<s>", "eos_token": "</s>"}


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("chat", range(len(CHATS)))
def test_equals_transformers_rendering(embedded_path, chat, add_generation_prompt):
    tok = load_tokenizer(embedded_path)
    want = tok.apply_chat_template(CHATS[chat], tokenize=False, add_generation_prompt=add_generation_prompt)
    assert apply_chat_template(tok, CHATS[chat], add_generation_prompt) == want
    assert want.endswith("<|im_start|>assistant\n") == add_generation_prompt


def test_helpers_and_special_tokens():
    tpl = ("{{ bos_token }}{% for m in messages %}{{ m | tojson }}{% endfor %}"
           "{% if add_generation_prompt %}{{ strftime_now('%Y') }}{% endif %}{{ extra }}")
    out = apply_chat_template(FakeTokenizer(tpl), [{"role": "user", "content": "é"}], extra="!")
    assert out == '<s>{"role": "user", "content": "é"}' + str(datetime.date.today().year) + "!"


def test_raise_exception_and_sandbox():
    strict = FakeTokenizer("{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}ok")
    assert apply_chat_template(strict, [{"role": "user", "content": ""}]) == "ok"
    with pytest.raises(jinja2.exceptions.TemplateError, match="user first"):
        apply_chat_template(strict, [{"role": "assistant", "content": ""}])
    mutating = FakeTokenizer("{{ messages.append(1) }}")
    with pytest.raises(jinja2.exceptions.SecurityError):
        apply_chat_template(mutating, [{"role": "user", "content": ""}])
    escaping = FakeTokenizer("{{ ''.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(jinja2.exceptions.SecurityError):
        apply_chat_template(escaping, [{"role": "user", "content": ""}])


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="no chat_template"):
        apply_chat_template(FakeTokenizer(None), [{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match=r"messages\[1\].*'role'"):
        apply_chat_template(FakeTokenizer("x"), [{"role": "user", "content": "x"}, {"content": "y"}])
    named = FakeTokenizer({"default": "D", "tool_use": "T"})
    assert apply_chat_template(named, [{"role": "user"}]) == "D"
    assert apply_chat_template(named, [{"role": "user"}], chat_template_name="tool_use") == "T"
    with pytest.raises(ValueError, match="tool_use"):
        apply_chat_template(named, [{"role": "user"}], chat_template_name="rag")
