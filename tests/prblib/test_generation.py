"""Benchmark-pair generation and the planner, against a fake OpenAI-compatible server: what the
prompts contain (and never contain), retries, per-item failures, length balancing, the cache,
planner parsing and template validation."""

import inspect
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from prblib.errors import ModelError
from prblib.construction.generation import (AVOID_CONTRARY_TEMPLATE, AVOID_GENERIC_TEMPLATE, CHOSEN_TEMPLATE,
                                    DEFAULT_AVOID_TEMPLATES, DEFAULT_TEMPLATES, PLANNER_TEMPLATE, Aspect,
                                    GenerationRequest, PairOutput, PromptTemplate, choose_avoid_template,
                                    format_aspects, format_profile, generate_many, generate_pair,
                                    generate_pair_balanced, length_ratio, parse_aspects, plan_aspects,
                                    plan_many)
from prblib.llm.client import CachedBackend, build_backend
from prblib.llm.answers import AnswerError
from tests.prblib.fake_openai import fenced, refusal, status, text, truncated

NARRATIVE = "NARRATIVE-SENTINEL-7f3a the asker secretly wants a cabin in Norway"
QUESTION = "How should I plan a first long hike?"
POSTS = ["I have bad knees since a ski accident.", "Saving money this year, tight budget.",
         "Love birdwatching at dawn."]
ASPECTS = [
    {"aspect": "Low-impact routes for weak knees", "evidence": "mentions a ski accident",
     "reason": "steep descents would hurt"},
    {"aspect": "Cheap gear options", "evidence": "says money is tight", "reason": "cannot buy premium kit"},
]
ITEM = {"id": "q1", "question": QUESTION, "profile": [{"id": "p1", "text": t, "category": "x"} for t in POSTS],
        "rubric_aspects": ASPECTS, "narrative": NARRATIVE, "category": "Lifestyle"}


def words(n, word="word"):
    return " ".join([word] * n)


def backend_for(server, **options):
    options = {"backend": "openai", "base_url": server.base_url, "model": "m", "backoff_base": 0.001,
               "backoff_max": 0.01, "timeout": 5, "max_retries": 3, **options}
    return build_backend(options)


def system_of(body):
    return next((m["content"] for m in body["messages"] if m["role"] == "system"), "")


def user_of(body):
    return next(m["content"] for m in body["messages"] if m["role"] == "user")


def side_of(body):
    """Which template a request was rendered from, by its instruction text."""
    user = user_of(body)
    if "for this person in particular" in user:
        return "chosen"
    if "typical person" in user or "makes different choices" in user:
        return "rejected"
    return "planner"


# -- formatting and templates -----------------------------------------------------------------

def test_the_profile_is_numbered_with_each_post_on_one_line():
    assert format_profile(["first\npost ", "", "  second   post"]) == "1. first post\n2. second post"
    assert "no past posts" in format_profile([])


def test_aspects_are_listed_with_their_evidence_and_reason():
    text = format_aspects(ASPECTS + ["plain aspect only"])
    assert text.splitlines() == [
        "1. Low-impact routes for weak knees", "   Evidence: mentions a ski accident",
        "   Why it matters: steep descents would hurt",
        "2. Cheap gear options", "   Evidence: says money is tight", "   Why it matters: cannot buy premium kit",
        "3. plain aspect only"]


def test_the_default_templates_are_one_chosen_two_avoid_variants_and_one_planner():
    purposes = sorted(t.purpose for t in DEFAULT_TEMPLATES.values())
    assert purposes == ["avoid", "avoid", "chosen", "planner"]
    assert set(DEFAULT_TEMPLATES) == {"chosen", "avoid-generic", "avoid-contrary", "planner"}
    assert DEFAULT_AVOID_TEMPLATES == (AVOID_GENERIC_TEMPLATE, AVOID_CONTRARY_TEMPLATE)
    assert DEFAULT_TEMPLATES["planner"] is PLANNER_TEMPLATE


def test_rendering_fills_every_placeholder_and_asks_for_the_target_length():
    for template in (CHOSEN_TEMPLATE, AVOID_GENERIC_TEMPLATE, AVOID_CONTRARY_TEMPLATE):
        messages = template.render(QUESTION, POSTS, ASPECTS, target_words=120)
        assert [m["role"] for m in messages] == ["system", "user"]
        user = messages[1]["content"]
        assert "about 120 words" in user and "{" not in user
        assert QUESTION in user and all(p in user for p in POSTS)
        assert all(a["aspect"] in user and a["evidence"] in user and a["reason"] in user for a in ASPECTS)
    planner = PLANNER_TEMPLATE.render(QUESTION, POSTS)[1]["content"]
    assert QUESTION in planner and all(p in planner for p in POSTS) and '"- "' in planner


def test_a_planner_template_refuses_aspects_and_a_generator_template_needs_them():
    with pytest.raises(ModelError, match="planner sees only the question and the profile"):
        PLANNER_TEMPLATE.render(QUESTION, POSTS, ASPECTS)
    with pytest.raises(ModelError, match="needs at least one rubric aspect"):
        CHOSEN_TEMPLATE.render(QUESTION, POSTS, [])


@pytest.mark.parametrize("purpose, user, message", [
    ("chosen", "{{ question }} {{ profile }} {{ aspects }} {{ narrative }}", r"unknown variables \{\{ narrative \}\}"),
    ("chosen", "{{ question }} {{ profile }}", r"missing the variables \{\{ aspects \}\}"),
    ("avoid", "{{ question }} {{ aspects }}", r"missing the variables \{\{ profile \}\}"),
    ("avoid", "{{ question }} {{ profile }} {{ aspects }} {{ rubric }} {{ persona }}",
     r"unknown variables \{\{ persona \}\}, \{\{ rubric \}\}"),
    ("planner", "{{ question }} {{ profile }} {{ aspects }}", "planner must never see the rubric"),
    ("planner", "{{ question }} {{ profile }} {{ target_words }}", r"unknown variables \{\{ target_words \}\}"),
    ("planner", "{{ question }}", r"missing the variables \{\{ profile \}\}"),
    ("planner", "{% for p in profile %}{{ p }}{% endfor %} {{ question }} {{ aspects|length }}",
     "planner must never see the rubric"),  # a variable used inside a tag or filter counts too
    ("chosen", "{{ question }} {{ profile }} {{ aspects }} {{ oops", r"not a valid template: .* \(line 1\)"),
    ("chosen", "{question} {profile} {aspects}", r"missing the variables \{\{ aspects \}\}, \{\{ profile \}\}"),
    ("judge", "{{ question }} {{ profile }}", "unknown purpose 'judge'"),
])
def test_template_validation_names_what_is_wrong(purpose, user, message):
    with pytest.raises(ModelError, match=message):
        PromptTemplate(name="t", purpose=purpose, version=1, system="", user=user)


def test_variables_in_the_system_text_count_and_literal_braces_are_allowed():
    with pytest.raises(ModelError, match=r"unknown variables \{\{ narrative \}\}"):
        PromptTemplate("t", "chosen", 1, "Know {{ narrative }}.", "{{ question }} {{ profile }} {{ aspects }}")
    template = PromptTemplate("t", "chosen", 2, 'Answer as JSON {"a": 1} for {{ question }}', "{{ profile }} {{ aspects }}")
    assert template.key == "t@v2"
    assert template.render("Q?", ["p"], ["a"])[0]["content"] == 'Answer as JSON {"a": 1} for Q?'
    with pytest.raises(ModelError, match="version"):
        PromptTemplate("t", "chosen", 0, "", "{{ question }} {{ profile }} {{ aspects }}")


def test_a_staff_template_runs_in_the_sandbox():
    from prblib.templates import compile_template

    escape = PromptTemplate("t", "chosen", 1, "", "{{ question.__class__.__mro__ }} {{ profile }} {{ aspects }}")
    with pytest.raises(ModelError, match="cannot be rendered: .*unsafe"):
        escape.render("Q?", ["p"], ["a"])
    loop = PromptTemplate("t", "chosen", 1, "", "{{ question|upper }}{% if target_words > 100 %} long{% endif %}"
                                                "\n{{ profile }}\n{{ aspects }}\n")
    assert loop.render("q?", ["p"], ["a"], target_words=150)[0]["content"] == "Q? long\n1. p\n1. a\n"
    # Values are never read as templates: braces and tags in a question come out as they are.
    assert "{{ x }} {% y %}" in CHOSEN_TEMPLATE.render("{{ x }} {% y %}", ["p"], ["a"])[1]["content"]
    with pytest.raises(ValueError, match=r"needs values for \{\{ b \}\}"):
        compile_template("{{ a }}{{ b }}", where="t", allowed={"a", "b"}).render({"a": 1})


def test_a_str_format_template_converts_to_jinja2_and_renders_the_same_text():
    from prblib.templates import TemplateError, format_to_jinja

    legacy = 'JSON {{"a": {{"b": 1}}}} for {question}{{#not a comment}} {{% raw %}} {profile}\n'
    values = {"question": "Q?", "profile": "P"}
    converted = format_to_jinja(legacy)
    assert compile_template_text(converted, values) == legacy.format(**values)
    for template in DEFAULT_TEMPLATES.values():  # the built-ins were these texts in str.format syntax
        for text in (template.system, template.user):
            assert format_to_jinja(text.replace("{{ ", "{").replace(" }}", "}")) == text
    for bad in ("{}", "{0}", "{a.b}", "{a[0]}", "{a!r}", "{a:>9}", "{oops"):
        with pytest.raises(TemplateError):
            format_to_jinja(bad)


def compile_template_text(source, values):
    from prblib.templates import compile_template

    return compile_template(source, where="t", allowed=set(values)).render(values)


# The four built-in prompts rendered on a fixed item before they moved from str.format to jinja2
# (sha256 of the JSON of every rendered message): byte-identical since.
def test_the_built_in_prompts_render_byte_identically_to_their_str_format_versions():
    import hashlib
    import json

    q = "How do I {start} painting?\nWith {{braces}} and {% tags %}"
    posts = ["I paint {daily}.", "Watercolour\r\nfan", ""]
    aspects = [{"aspect": "Uses {watercolour}", "evidence": "posts", "reason": "medium"}, "Short {{answers}}"]
    out = {name: t.render(q, posts, None if t.purpose == "planner" else aspects, target_words=120)
           for name, t in DEFAULT_TEMPLATES.items()}
    from prblib.rewards.pgenrm import published as pub

    out["published"] = pub.Template().messages([("q {1}", "c {{x}}", "r")], "query {q}", " r1 {%x%} ", "r2")
    out["published_empty"] = pub.Template().messages([], "query", "a", "b")
    blob = json.dumps(out, ensure_ascii=False, sort_keys=True)
    assert hashlib.sha256(blob.encode()).hexdigest() == "406e2e973383953eeaf091a626fdb88ca4de6ba804af94340befcd9f41780203"


def test_templates_are_checked_for_their_role():
    with pytest.raises(ModelError, match="avoid_template must be a 'avoid' template"):
        generate_pair(None, question=QUESTION, profile_texts=POSTS, aspects=ASPECTS,
                      chosen_template=CHOSEN_TEMPLATE, avoid_template=CHOSEN_TEMPLATE)
    with pytest.raises(ModelError, match="must be a 'planner' template"):
        plan_aspects(None, question=QUESTION, profile_texts=POSTS, template=CHOSEN_TEMPLATE)


# -- what the generator and planner are sent --------------------------------------------------

def test_chosen_gets_the_rubric_and_rejected_the_avoid_instruction_with_the_same_inputs(fake_openai):
    fake_openai.script(text(words(150, "good"), prompt_tokens=300, completion_tokens=200),
                       text(words(140, "plain"), prompt_tokens=310, completion_tokens=190))
    out = generate_pair(backend_for(fake_openai), question=QUESTION, profile_texts=POSTS, aspects=ASPECTS,
                        chosen_template=CHOSEN_TEMPLATE, avoid_template=AVOID_CONTRARY_TEMPLATE,
                        temperature=0.7, max_tokens=400, seed=5)
    assert isinstance(out, PairOutput)
    assert out.chosen == words(150, "good") and out.rejected == words(140, "plain")
    assert out.avoid_variant == "avoid-contrary"
    assert (out.chosen_template, out.avoid_template) == ("chosen@v1", "avoid-contrary@v1")
    assert (out.prompt_tokens, out.completion_tokens) == (610, 390)
    assert out.length_ratio == pytest.approx(150 / 140) and out.within_bounds is None
    chosen_body, rejected_body = fake_openai.bodies
    for body in (chosen_body, rejected_body):
        user = user_of(body)
        assert QUESTION in user and all(post in user for post in POSTS)
        assert all(a["aspect"] in user and a["evidence"] in user and a["reason"] in user for a in ASPECTS)
        assert (body["temperature"], body["max_tokens"], body["seed"], body["model"]) == (0.7, 400, 5, "m")
    assert "for this person in particular" in user_of(chosen_body)
    assert "makes different choices" in user_of(rejected_body)
    assert "only not tailored to this person" in user_of(rejected_body)
    assert system_of(chosen_body) == system_of(rejected_body)  # the same generator


def test_the_generic_avoid_variant_asks_for_a_typical_person_but_a_good_answer(fake_openai):
    generate_pair(backend_for(fake_openai), question=QUESTION, profile_texts=POSTS, aspects=ASPECTS,
                  avoid_template=AVOID_GENERIC_TEMPLATE)
    rejected = user_of(fake_openai.bodies[1])
    assert "typical person" in rejected and "Do not serve the needs listed above" in rejected
    assert "correct, on the question and genuinely helpful" in rejected
    assert ASPECTS[0]["aspect"] in rejected


def test_the_narrative_cannot_be_passed_and_never_reaches_any_request(fake_openai):
    for fn in (generate_pair, generate_pair_balanced, plan_aspects, generate_many, plan_many):
        assert "narrative" not in inspect.signature(fn).parameters
    with pytest.raises(TypeError):
        generate_pair(backend_for(fake_openai), question=QUESTION, profile_texts=POSTS, aspects=ASPECTS,
                      narrative=NARRATIVE)
    with pytest.raises(TypeError):
        GenerationRequest(id="x", question=QUESTION, narrative=NARRATIVE)
    assert NARRATIVE not in repr(GenerationRequest.from_row(ITEM))

    fake_openai.responder = lambda body: "- An aspect" if side_of(body) == "planner" else words(100)
    backend = backend_for(fake_openai)
    results = dict(generate_many(backend, [ITEM, {**ITEM, "id": "q2"}]))
    plans = dict(plan_many(backend, [ITEM]))
    assert all(isinstance(r, PairOutput) for r in results.values()) and isinstance(plans["q1"], list)
    assert len(fake_openai.requests) == 5
    sent = json.dumps(fake_openai.bodies)
    assert POSTS[0] in sent  # the check below would catch a leak
    assert "NARRATIVE-SENTINEL" not in sent and "cabin in Norway" not in sent


def test_the_planner_prompt_has_neither_rubric_nor_narrative(fake_openai):
    fake_openai.script(text("- Gentle routes\n- Cheap gear\n- Dawn starts"))
    assert plan_aspects(backend_for(fake_openai), question=QUESTION, profile_texts=POSTS) == [
        "Gentle routes", "Cheap gear", "Dawn starts"]
    [body] = fake_openai.bodies
    sent = json.dumps(body)
    assert QUESTION in sent and all(post in sent for post in POSTS)
    for aspect in ASPECTS:
        assert aspect["aspect"] not in sent and aspect["evidence"] not in sent and aspect["reason"] not in sent
    assert "NARRATIVE-SENTINEL" not in sent
    assert "aspects" not in inspect.signature(plan_aspects).parameters


def test_plan_many_reads_only_the_id_question_and_profile(fake_openai):
    broken_rubric = {**ITEM, "rubric_aspects": [{"no-aspect": 1}]}
    fake_openai.responder = lambda body: "- One\n- Two\n- Three"
    [(item_id, aspects)] = list(plan_many(backend_for(fake_openai), [broken_rubric]))
    assert (item_id, aspects) == ("q1", ["One", "Two", "Three"])


# -- retries and failures ---------------------------------------------------------------------

def test_429_and_500_are_retried_and_the_pair_still_comes_back(fake_openai):
    fake_openai.script(status(429), status(500), text(words(100, "c")), status(503), text(words(100, "r")))
    out = generate_pair(backend_for(fake_openai, max_retries=3), question=QUESTION, profile_texts=POSTS,
                        aspects=ASPECTS)
    assert (out.chosen, out.rejected) == (words(100, "c"), words(100, "r"))
    assert len(fake_openai.requests) == 5
    assert [side_of(b) for b in fake_openai.bodies] == ["chosen"] * 3 + ["rejected"] * 2


def test_a_permanently_failing_item_is_reported_while_the_others_finish(fake_openai):
    def responder(body):
        if "DOOMED" in user_of(body):
            return status(500)
        return words(100, side_of(body))

    fake_openai.responder = responder
    items = [{**ITEM, "id": f"ok{i}"} for i in range(5)]
    items.insert(2, {**ITEM, "id": "bad", "question": "DOOMED question?"})
    items.append({"id": "no-question", "question": "", "rubric_aspects": ASPECTS})
    results = dict(generate_many(backend_for(fake_openai, max_retries=1, concurrency=4), items))
    assert set(results) == {"ok0", "ok1", "ok2", "ok3", "ok4", "bad", "no-question"}
    assert isinstance(results["bad"], ModelError) and "answered 500 after 2 attempts" in str(results["bad"])
    assert isinstance(results["no-question"], ModelError) and "no question" in str(results["no-question"])
    for i in range(5):
        out = results[f"ok{i}"]
        assert isinstance(out, PairOutput) and out.chosen.startswith("chosen") and out.rejected.startswith("rejected")
        assert out.avoid_variant == choose_avoid_template(f"ok{i}", DEFAULT_AVOID_TEMPLATES).name


def test_the_planner_failing_to_list_aspects_is_a_readable_error(fake_openai):
    fake_openai.script(text("I cannot tell anything about this person." + " x" * 300))
    with pytest.raises(ModelError, match="planner output had no aspects: 'I cannot tell") as error:
        plan_aspects(backend_for(fake_openai), question=QUESTION, profile_texts=POSTS)
    assert len(str(error.value)) < 260
    fake_openai.responder = lambda body: "" if "broken" in user_of(body) else "- Fine aspect"
    results = dict(plan_many(backend_for(fake_openai), [
        {"id": "a", "question": "broken one?", "profile": POSTS}, {"id": "b", "question": "ok?", "profile": POSTS}]))
    assert isinstance(results["a"], ModelError) and results["b"] == ["Fine aspect"]


def test_an_empty_answer_is_an_error_not_a_pair(fake_openai):
    fake_openai.script(text("<think>long reasoning</think>   "))
    with pytest.raises(ModelError, match="empty chosen answer"):
        generate_pair(backend_for(fake_openai), question=QUESTION, profile_texts=POSTS, aspects=ASPECTS)


# -- length balance ---------------------------------------------------------------------------

def test_length_ratio_is_chosen_words_over_rejected_words():
    assert length_ratio("a b c d", "a b") == 2.0
    assert length_ratio("a", "a b c d") == 0.25
    assert length_ratio("", "") == 1.0 and length_ratio("a", "") == math.inf


def test_a_pair_within_bounds_is_not_regenerated(fake_openai):
    fake_openai.responder = lambda body: words(150 if side_of(body) == "chosen" else 130, side_of(body))
    out = generate_pair_balanced(backend_for(fake_openai), question=QUESTION, profile_texts=POSTS, aspects=ASPECTS)
    assert len(fake_openai.requests) == 2 and out.regenerations == 0
    assert out.within_bounds is True and out.length_ratio == pytest.approx(150 / 130)


def test_an_unbalanced_pair_regenerates_the_outlying_side_once_with_another_seed(fake_openai):
    def responder(body):
        if side_of(body) == "chosen":
            return words(150, "chosen")
        return words(50, "short") if body["seed"] == 3 else words(140, "longer")

    fake_openai.responder = responder
    out = generate_pair_balanced(backend_for(fake_openai), question=QUESTION, profile_texts=POSTS, aspects=ASPECTS,
                                 seed=3, target_words=150, bounds=(0.8, 1.25), max_attempts=2)
    bodies = fake_openai.bodies
    assert [side_of(b) for b in bodies] == ["chosen", "rejected", "rejected"]
    assert [b["seed"] for b in bodies] == [3, 3, 4]
    assert "about 150 words" in user_of(bodies[2])  # asked for the other side's length
    assert out.rejected == words(140, "longer") and out.chosen == words(150, "chosen")
    assert out.length_ratio == pytest.approx(150 / 140) and out.within_bounds is True
    assert out.regenerations == 1
    assert [(a.side, a.seed, a.words) for a in out.attempts] == [("chosen", 3, 150), ("rejected", 3, 50),
                                                                 ("rejected", 4, 140)]
    record = out.to_dict()
    assert record["length_ratio"] == pytest.approx(150 / 140) and record["regenerations"] == 1
    assert len(record["attempts"]) == 3 and record["bounds"] == [0.8, 1.25]
    json.dumps(record)


def test_when_regeneration_does_not_help_the_closest_attempt_is_kept_and_flagged(fake_openai):
    def responder(body):
        if side_of(body) == "rejected":
            return words(100, "rejected")
        return words(300, "first") if body["seed"] == 0 else words(400, "second")

    fake_openai.responder = responder
    out = generate_pair_balanced(backend_for(fake_openai), question=QUESTION, profile_texts=POSTS, aspects=ASPECTS,
                                 target_words=100)
    assert [side_of(b) for b in fake_openai.bodies] == ["chosen", "rejected", "chosen"]
    assert out.chosen == words(300, "first")  # 3.0 is closer to 1 than 4.0
    assert out.length_ratio == pytest.approx(3.0) and out.within_bounds is False
    assert len(out.attempts) == 3  # max_attempts=2: exactly one regeneration


def test_balancing_rejects_nonsense_bounds():
    with pytest.raises(ModelError, match="bounds"):
        generate_pair_balanced(None, question=QUESTION, profile_texts=POSTS, aspects=ASPECTS, bounds=(1.2, 1.5))
    with pytest.raises(ModelError, match="max_attempts"):
        generate_pair_balanced(None, question=QUESTION, profile_texts=POSTS, aspects=ASPECTS, max_attempts=0)


# -- cache ------------------------------------------------------------------------------------

def test_a_cached_rerun_sends_no_new_request_and_gives_the_same_pairs(fake_openai, tmp_path):
    def responder(body):
        if side_of(body) == "planner":
            return "- a\n- b\n- c"
        short = side_of(body) == "rejected" and body["seed"] == 0
        return words(40 if short else 120, side_of(body))

    fake_openai.responder = responder
    items = [{**ITEM, "id": f"i{i}", "question": f"{QUESTION} ({i})"} for i in range(4)]
    options = {"cache_dir": str(tmp_path / "llm-cache"), "concurrency": 3}
    first = dict(generate_many(backend_for(fake_openai, **options), items))
    first_plans = dict(plan_many(backend_for(fake_openai, **options), items))
    sent = len(fake_openai.requests)
    assert sent == 4 * 3 + 4  # every pair regenerated its rejected side once; one planner call per item

    rerun_backend = backend_for(fake_openai, **options)
    assert isinstance(rerun_backend, CachedBackend)
    again = dict(generate_many(rerun_backend, items))
    again_plans = dict(plan_many(rerun_backend, items))
    assert len(fake_openai.requests) == sent
    assert rerun_backend.misses == 0 and rerun_backend.hits == sent
    assert {k: v.to_dict() for k, v in again.items()} == {k: v.to_dict() for k, v in first.items()}
    assert again_plans == first_plans


# -- planner parsing --------------------------------------------------------------------------

@pytest.mark.parametrize("raw, expected", [
    ("- Budget travel\n- Knee-friendly paths\n- Early mornings", ["Budget travel", "Knee-friendly paths",
                                                                    "Early mornings"]),
    ("Here are the aspects this person would value:\n\n1. Budget travel\n2) Knee-friendly paths\n\n"
     "3. **Early mornings**\n\nI hope this helps!", ["Budget travel", "Knee-friendly paths", "Early mornings"]),
    ("* Aspect 1: Budget travel\n\u2022 Knee-friendly paths\n  that avoid steep descents\n- budget travel\n"
     "- \"Quiet trails\"\n", ["Budget travel", "Knee-friendly paths that avoid steep descents", "Quiet trails"]),
    ("Sorry, I cannot infer anything from these posts.", []),
    ("Sure! Based on the posts:\nBudget travel\n\nKnee-friendly paths\n## Notes\nEarly mornings",
     ["Budget travel", "Knee-friendly paths", "Early mornings"]),
    ("<think>- not an aspect</think>\n- Real aspect", ["Real aspect"]),
    ("- 1.5 hour walks at most\n- -5 C winter gear", ["1.5 hour walks at most", "-5 C winter gear"]),
    ("", []),
    ("Aspects:\n", []),
])
def test_planner_output_is_parsed_into_clean_aspects(raw, expected):
    assert parse_aspects(raw) == expected


@pytest.mark.parametrize("raw", [
    '```json\n["Practises quietly at night", "Budget under $200"]\n```',
    '["Practises quietly at night", "Budget under $200"]',
    '{"aspects": ["Practises quietly at night", "Budget under $200"]}',
    'Here is the plan:\n```json\n{"aspects": ["Practises quietly at night", "Budget under $200"]}\n```',
])
def test_a_json_plan_fenced_or_bare_is_read_by_the_structured_parser(raw):
    assert parse_aspects(raw) == ["Practises quietly at night", "Budget under $200"]


def test_a_json_plan_of_the_wrong_shape_is_unparseable_not_stored():
    with pytest.raises(AnswerError, match="invalid") as error:
        parse_aspects('```json\n{"needs": "quiet"}\n```')
    assert error.value.reason == "unparseable"


def test_a_fenced_plan_from_the_endpoint_becomes_its_aspects(fake_openai):
    fake_openai.script(fenced('["Practises quietly at night", "Budget under $200", "Lives in a flat"]'))
    assert plan_aspects(backend_for(fake_openai), question=QUESTION, profile_texts=POSTS) == [
        "Practises quietly at night", "Budget under $200", "Lives in a flat"]


def test_a_refused_plan_is_retried_once_then_fails_as_refused(fake_openai):
    fake_openai.script(text("I'm sorry, but I can't help with that request."), text("- Quiet practice\n- Budget"))
    assert plan_aspects(backend_for(fake_openai), question=QUESTION, profile_texts=POSTS) == ["Quiet practice",
                                                                                            "Budget"]
    fake_openai.responder = lambda body: text("I'm sorry, but I can't help with that request.")
    with pytest.raises(AnswerError, match="refused the plan twice") as error:
        plan_aspects(backend_for(fake_openai), question="Another question?", profile_texts=POSTS)
    assert error.value.reason == "refused"


def test_a_truncated_chosen_answer_is_never_kept(fake_openai):
    def respond(body):
        if side_of(body) == "chosen":
            return truncated("A tailored answer that stops in the middle of a")
        return text(words(150, "generic"))

    fake_openai.responder = respond
    [(item_id, outcome)] = list(generate_many(backend_for(fake_openai), [ITEM], bounds=None))
    assert isinstance(outcome, AnswerError) and outcome.reason == "truncated"
    assert str(outcome) == "the chosen answer stopped at the token limit twice (512 then 1024 tokens)"
    chosen_budgets = [b["max_tokens"] for b in fake_openai.bodies if side_of(b) == "chosen"]
    assert chosen_budgets == [512, 1024]


def test_a_refused_rejected_answer_is_retried_and_the_good_one_kept(fake_openai):
    replies = iter([refusal("I can't write that."), text(words(150, "generic"))])

    def respond(body):
        return text(words(150, "tailored")) if side_of(body) == "chosen" else next(replies)

    fake_openai.responder = respond
    pair = generate_pair(backend_for(fake_openai), question=QUESTION, profile_texts=POSTS, aspects=ASPECTS)
    assert pair.rejected == words(150, "generic") and pair.attempts[1].finish_reason == "stop"


def test_plan_aspects_keeps_at_most_the_asked_number(fake_openai):
    fake_openai.script(text("\n".join(f"- aspect {i}" for i in range(9))))
    assert plan_aspects(backend_for(fake_openai), question=QUESTION, profile_texts=POSTS) == [
        f"aspect {i}" for i in range(6)]


# -- requests and imports ---------------------------------------------------------------------

def test_a_request_reads_a_lamp_qa_row_and_keeps_the_ranked_top_k():
    row = {**ITEM, "profile": [{"text": f"post {i}"} for i in range(15)]}
    request = GenerationRequest.from_row(row)
    assert request.profile_texts == tuple(f"post {i}" for i in range(10))
    assert request.aspects[0] == Aspect("Low-impact routes for weak knees", "mentions a ski accident",
                                        "steep descents would hurt")
    with pytest.raises(ModelError, match="needs an id"):
        GenerationRequest.from_row({"question": "q"})


def test_the_avoid_variant_choice_is_stable_and_uses_both_variants():
    picks = [choose_avoid_template(f"item-{i}", DEFAULT_AVOID_TEMPLATES).name for i in range(40)]
    assert set(picks) == {"avoid-generic", "avoid-contrary"}
    assert picks == [choose_avoid_template(f"item-{i}", DEFAULT_AVOID_TEMPLATES).name for i in range(40)]


def test_importing_the_generation_module_loads_no_heavy_library_and_no_django():
    code = ("import sys, prblib.construction.generation; "
            "print(sorted(m for m in ('torch', 'transformers', 'openai', 'django') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"
