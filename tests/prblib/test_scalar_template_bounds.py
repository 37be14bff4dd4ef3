"""A scalar RM's chat template is the submitter's code: it is rendered in the same bounded sandbox
as judges' (prblib.chat.render_chat: steps, output size, time), never by transformers'
unbounded apply_chat_template on the worker (issue 29, fault 12, hostile review)."""

import time
from types import SimpleNamespace

import pytest

from prblib.errors import ModelError
from prblib.rewards.scalar import ScalarRewardModel

QWEN_LIKE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
             "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _rm(template: str) -> ScalarRewardModel:
    rm = object.__new__(ScalarRewardModel)  # only what _render reads
    rm.uses_chat_template = True
    rm.tokenizer = SimpleNamespace(chat_template=template, special_tokens_map={"eos_token": "<|im_end|>"})
    return rm


def test_a_plain_template_renders_the_exchange():
    assert _rm(QWEN_LIKE)._render("Which?", "This one.") == (
        "<|im_start|>user\nWhich?<|im_end|>\n<|im_start|>assistant\nThis one.<|im_end|>\n")


@pytest.mark.parametrize("template, reasons", [  # the step bound, or the time bound on a loaded machine
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
     ("it takes more than 2,000,000 steps (loop iterations and calls)", "it takes more than 5 s")),
    ("{{ 'x' * 60000000 }}", ("a value is too long (1 x 60000000 > 2,000,000)",)),
])
def test_a_template_that_would_hang_or_fill_memory_is_stopped_with_one_line(template, reasons):
    started = time.monotonic()
    with pytest.raises(ModelError) as caught:
        _rm(template)._render("Which?", "This one.")
    assert str(caught.value) in {f"the chat template was stopped: {reason}" for reason in reasons}
    assert time.monotonic() - started < 15  # bounded by steps or MAX_SECONDS (5 s), on a loaded machine
