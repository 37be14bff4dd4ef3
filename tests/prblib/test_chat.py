"""Chat templates: rendered as transformers renders them, within bounds; a template refusing a
system message gets it folded into the first user turn, and the folder check says so."""

import json
import time

import pytest

from prblib.errors import ModelError
from prblib.chat import ChatTemplateError, PROBE, fold_system, render_chat, render_for_model, system_role_supported
from tests.prblib.test_llm import save_tiny_causal_lm

GEMMA = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
         "{% endif %}{% for message in messages %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
         "{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + "
         "message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}"
         "{{'<start_of_turn>model\n'}}{% endif %}")
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
MISTRAL_V1 = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
              "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
              "{{ message['content'] + eos_token }}{% else %}"
              "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")
MESSAGES = [{"role": "system", "content": "You compare two answers."}, {"role": "user", "content": "A or B?"}]


@pytest.mark.parametrize("template,supported", [(GEMMA, False), (MISTRAL_V1, False), (CHATML, True)])
def test_a_template_refusing_the_system_role_gets_it_folded_into_the_first_user_turn(template, supported):
    special = {"bos_token": "<bos>", "eos_token": "</s>"}
    assert system_role_supported(template, special) is supported
    text = render_for_model(template, MESSAGES, special_tokens=special)
    assert "You compare two answers.\n\nA or B?" in text if not supported else "You compare two answers." in text
    with pytest.raises(ChatTemplateError) if not supported else _nothing():
        render_chat(template, MESSAGES, special_tokens=special)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_gemma_folded_renders_exactly_what_transformers_renders(tmp_path):
    from transformers import AutoTokenizer

    from tests.prblib.test_llm import bert_tokenizer_folder

    tokenizer = AutoTokenizer.from_pretrained(bert_tokenizer_folder(), local_files_only=True)
    for template, messages in ((GEMMA, fold_system(MESSAGES)), (CHATML, MESSAGES)):
        tokenizer.chat_template = template
        expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        special = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
        assert render_chat(template, messages, special_tokens=special) == expected
    tokenizer.chat_template = GEMMA
    with pytest.raises(Exception, match="System role not supported"):  # what transformers itself does
        tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)


def test_fold_system():
    assert fold_system(MESSAGES) == [{"role": "user", "content": "You compare two answers.\n\nA or B?"}]
    assert fold_system([{"role": "system", "content": "S"}]) == [{"role": "user", "content": "S"}]
    assert fold_system([{"role": "user", "content": "U"}]) == [{"role": "user", "content": "U"}]


@pytest.mark.parametrize("template,message", [
    ("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
     "the chat template was stopped: it takes more than 2,000,000 steps (loop iterations and calls)"),
    ("{% set prbench_counted = range %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
     "{% endfor %}", "the chat template was stopped: it takes more than 2,000,000 steps (loop iterations and calls)"),
    ("{{ 'x' * 100000000 }}", "the chat template was stopped: a value is too long (1 x 100000000 > 2,000,000)"),
    ("{% set ns = namespace(x='ab') %}{% for i in range(100) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}{{ ns.x }}",
     "the chat template was stopped: a value is too long (2097152 > 2,000,000 characters or items)"),
    ("{% set ns = namespace(x='ab') %}{% for i in range(100) %}{% set ns.x = ns.x + ns.x %}{% endfor %}{{ ns.x }}",
     "the chat template was stopped: a value is too long (2097152 > 2,000,000)"),
    ("{{ ('x' * 1000000)|replace('x', 'y' * 1000000) }}",
     "the chat template was stopped: a value is too long (about 1000003000002 > 2,000,000 characters)"),  # chat's own bound, no longer the prompt templates' 4,000,000
    ("{% for i in range(3000) %}{{ 'y' * 1000 }}{% endfor %}",
     "the chat template was stopped: its text is longer than 2,000,000 characters"),
    ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
     "the chat template failed: RecursionError: maximum recursion depth exceeded"),
    ("{{ messages[5]['content'] }}", "the chat template failed: UndefinedError: list object has no element 5"),
    ("{{ raise_exception('Conversation roles must alternate') }}",
     "the chat template refused the messages: Conversation roles must alternate"),
    ("{% for m in messages %}", "the chat template does not parse (line 1: Unexpected end of template. Jinja was "
                                "looking for the following tags: 'endfor' or 'else'. The innermost block that needs "
                                "to be closed is 'for'.)"),
])
def test_templates_past_the_bounds_are_one_line_within_seconds(template, message):
    started = time.monotonic()
    with pytest.raises(ChatTemplateError) as caught:
        render_chat(template, PROBE)
    assert str(caught.value) == message
    assert time.monotonic() - started < 6


def test_exponential_macro_recursion_stops_at_the_time_limit():
    started = time.monotonic()
    with pytest.raises(ChatTemplateError, match=r"^the chat template was stopped: it takes more than 0.5 s$"):
        render_chat("{% macro f(n) %}{% if n > 0 %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(40) }}",
                    PROBE, seconds=0.5)
    assert time.monotonic() - started < 2


# -- a local judge folder -------------------------------------------------------------------------------

def judge_folder(tmp_path, template: str):
    folder = save_tiny_causal_lm(tmp_path / "judge", end_every=3)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    for name in ("chat_template.jinja", "chat_template.json"):
        (folder / name).unlink(missing_ok=True)
    return folder


def test_a_gemma_style_judge_folder_passes_the_check_with_a_note_and_judges(tmp_path):
    from prblib.rewards.base import PairInput
    from prblib.rewards.judges import PairwiseJudge, PointwiseJudge
    from prblib.llm.client import LocalCausalLMBackend
    from prblib.modelcheck import inspect_model_folder

    folder = judge_folder(tmp_path, GEMMA)
    info = inspect_model_folder(folder, models_root=tmp_path, task="causal-lm", hash_weights=False)
    assert info.chat_template_notes == ("tokenizer_config.json: the chat template refuses a system message: system "
                                        "prompts are folded into the first user turn",)
    backend = LocalCausalLMBackend(folder)
    assert backend.system_role is False
    prompt = backend.render_prompt(MESSAGES)
    # This tokenizer (BERT's) has no bos_token: it renders empty, as in transformers.
    assert prompt == "<start_of_turn>user\nYou compare two answers.\n\nA or B?<end_of_turn>\n<start_of_turn>model\n"
    pair = PairInput(id="p1", question="Which?", chosen="a", rejected="b", domain="d")
    for judge in (PairwiseJudge(backend, max_tokens=4), PointwiseJudge(backend, max_tokens=4)):
        [result] = judge.score_pairs([pair], setting="no_profile")  # no traceback: judged (badly, a random model)
        assert result.id == "p1" and "parse_failures" in result.details


def test_a_chatml_judge_folder_has_no_note(tmp_path):
    from prblib.modelcheck import inspect_model_folder

    info = inspect_model_folder(judge_folder(tmp_path, CHATML), models_root=tmp_path, task="causal-lm",
                                hash_weights=False)
    assert info.chat_template_notes == ()


def test_a_folder_whose_template_hangs_is_refused_by_the_check(tmp_path):
    from prblib.modelcheck import check_model_folder

    folder = judge_folder(tmp_path, "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
    started = time.monotonic()
    with pytest.raises(ModelError) as caught:
        check_model_folder(folder, task="causal-lm", models_root=tmp_path)
    # 10^10 iterations unbounded (hours): stopped at the step bound, in seconds even on a loaded machine.
    assert time.monotonic() - started < 30
    assert caught.value.problems == ["the chat template in tokenizer_config.json cannot render a prompt: the chat "
                                     "template was stopped: it takes more than 2,000,000 steps (loop iterations and "
                                     "calls)"]


def test_a_policy_whose_template_refuses_the_system_role_is_trained_on_folded_prompts(tmp_path):
    from transformers import AutoTokenizer

    from prblib.downstream.ppo import _render_ids

    folder = judge_folder(tmp_path, GEMMA)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    ids = _render_ids(tokenizer, MESSAGES)
    assert tokenizer.decode(ids) == ("< start _ of _ turn > user you compare two answers. a or b? < end _ of _ turn > "
                                     "< start _ of _ turn > model")  # folded; BERT's tokenizer lower-cases
