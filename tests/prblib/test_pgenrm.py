"""P-GenRM: chain parsing, prototypes, test-time scaling, and the RM against a fake
OpenAI-compatible server and a tiny random local LM."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from prblib.rewards.base import ModelSpec, PairInput, load_reward_model
from prblib.errors import ModelError
from prblib.llm.client import BACKEND_OPTIONS, messages_as_text
from prblib.rewards.pgenrm.model import (Chain, ParseFailure, PGenRM, Prototypes, accuracy_grid, build_prototypes,
                                chosen_position, embedder_meta, fit_prototypes, k_for_variance, parse_chain,
                                scaled_score, user_signals)
from tests.prblib.test_llm import tiny_lm_folder  # noqa: F401

NARRATIVE = "SENTINEL-NARRATIVE-5e1b: a retired sailor who distrusts apps"
RUBRIC = "SENTINEL-RUBRIC-a7c3: mention paper charts"
HISTORY = (
    {"prompt": "HIST-Q1 which knot for mooring?", "chosen": "HIST-C1 a bowline, tied by hand",
     "rejected": "HIST-R1 download a knot app", "narrative": NARRATIVE, "rubric_aspects": [RUBRIC]},
    {"prompt": "HIST-Q2 best tea on a boat?", "chosen": "HIST-C2 loose-leaf in a thermos",
     "rejected": "HIST-R2 a capsule machine"},
)


def make_pair(i: int = 1, **fields) -> PairInput:
    values = dict(id=f"p{i}", domain="Lifestyle", question=f"QUESTION-{i}: how should I plan a sailing week?",
                  chosen=f"CHOSEN-{i} answer with paper charts", rejected=f"REJECTED-{i} generic app answer",
                  profile=(f"POST-{i}-1 about sailing", f"POST-{i}-2 about tea"), plan=(f"PLAN-{i}: low-tech",))
    values.update(fields)
    return PairInput(**values)


def chain_text(a, b, *, weights=(60, 40), names=("Fits the person", "General quality"), totals=None,
               persona="A sailor who likes low-tech advice.", fenced=True, prose="Step 1: persona ...\n"):
    obj = {"persona": persona, "criteria": [{"name": n, "weight": w} for n, w in zip(names, weights)],
           "scores": {"A": dict(zip(names, a)), "B": dict(zip(names, b))}}
    if totals is None:  # the right totals (when the parts are numbers at all)
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (*weights, *a, *b))
        totals = [sum(w * s for w, s in zip(weights, side)) / 100 if numeric else 5 for side in (a, b)]
    obj["totals"] = {"A": totals[0], "B": totals[1]}
    blob = json.dumps(obj)
    return prose + (f"```json\n{blob}\n```" if fenced else blob)


def user_message(body: dict) -> str:
    return next(m["content"] for m in body["messages"] if m["role"] == "user")


def block(user: str, label: str) -> str:
    match = re.search(rf"=== {label} ===\n(.*?)\n=== End of {label.lower()} ===", user, re.S)
    assert match, f"no {label} block"
    return match.group(1)


def prefers_chosen(body: dict) -> str:
    """A judge that scores whichever slot holds the CHOSEN answer higher."""
    chosen_is_a = "CHOSEN-" in block(user_message(body), "Answer A")
    good, bad = (9, 8), (3, 4)
    return chain_text(good, bad) if chosen_is_a else chain_text(bad, good)


def spec_for(server, **options):
    """P-GenRM options as a researcher sets them; connection and cache as the platform does (runtime)."""
    runtime = {"backend": "openai", "base_url": server.base_url, "max_retries": 0, "timeout": 5,
               **{k: options.pop(k) for k in list(options) if k in BACKEND_OPTIONS}}
    return ModelSpec(kind="pgenrm", path="judge-model", options=options, runtime=runtime)


# -- parsing -----------------------------------------------------------------------------------

def test_a_well_formed_chain_is_read_and_its_totals_recomputed():
    chain = parse_chain(chain_text((9, 6), (3, 5)))
    assert isinstance(chain, Chain)
    assert chain.persona.startswith("A sailor")
    assert chain.criteria == (("Fits the person", 60.0), ("General quality", 40.0))
    assert chain.totals == {"A": pytest.approx(7.8), "B": pytest.approx(3.8)}
    assert not chain.totals_mismatch


def test_the_last_json_object_is_used_bare_or_fenced():
    example = '{"persona": "an example", "criteria": []}'
    text = f"The format is {example}.\n\nMy evaluation:\n" + chain_text((2, 2), (9, 9), fenced=False)
    chain = parse_chain(text)
    assert isinstance(chain, Chain) and chain.totals == {"A": 2.0, "B": 9.0}
    fenced_then_bare = chain_text((9, 9), (2, 2)) + "\nCorrection:\n" + chain_text((2, 2), (9, 9), fenced=False,
                                                                                   prose="")
    assert parse_chain(fenced_then_bare).totals == {"A": 2.0, "B": 9.0}


@pytest.mark.parametrize("text, reason", [
    ("I think A is better.", "no_json"),
    ('```json\n{"persona": "x", "criteria": [,]}\n```', "malformed_json"),
    ('Here: {"persona": "x", "criteria": [{"name": "a", "weight": 100}], "scores": {"A": {"a": 5}', "malformed_json"),
    (chain_text((5, 5), (5, 5)).replace('"totals"', '"totals": NaN, "t"'), "malformed_json"),
    (chain_text((5, 5), (5, 5)).replace('"persona"', '"weight": 1, "weight"'), "malformed_json"),  # duplicate key
    (chain_text((5, 5), (5, 5), persona=""), "missing_persona"),
    (chain_text((5, 5), (5, 5), weights=(60, 30)), "weights_sum"),
    (chain_text((5, 5), (5, 5), weights=(70, 40)), "weights_sum"),
    (chain_text((5, 5), (5, 5), weights=(120, -20)), "bad_weight"),
    (chain_text((5, 5), (5, 5), weights=("60", 40)), "bad_weight"),
    (chain_text((11, 5), (5, 5)), "score_out_of_range"),
    (chain_text((5, 5), (5, 0)), "score_out_of_range"),
    (chain_text((5, "7"), (5, 5)), "bad_score"),
    (chain_text((5, True), (5, 5)), "bad_score"),
    (chain_text((5,), (5, 5)), "missing_scores"),
    (chain_text((5, 5), (5, 5)).replace('"B": {', '"C": {', 1), "missing_scores"),
    (chain_text((5, 5), (5, 5)).replace('"General quality": 5}', '"General quality": 5, "Extra": 5}', 1),
     "unknown_criterion"),
    (chain_text((5, 5), (5, 5), names=("Same", "same")), "bad_criteria"),
    (chain_text((5, 5), (5, 5), totals=("high", 5)), "bad_totals"),
    (chain_text((5, 5), (5, 5)).replace('"totals"', '"sums"'), "bad_totals"),
])
def test_malformed_chains_are_failures_with_a_reason(text, reason):
    result = parse_chain(text)
    assert isinstance(result, ParseFailure), result
    assert result.reason == reason, result.detail


def test_weights_within_half_a_point_of_100_are_accepted():
    assert isinstance(parse_chain(chain_text((5, 5), (5, 5), weights=(60.2, 40.2))), Chain)


def test_totals_that_disagree_with_their_parts_are_flagged_and_the_recomputed_value_used():
    chain = parse_chain(chain_text((9, 6), (3, 5), totals=(78.0, 3.8)))  # A on a 0-100 scale
    assert isinstance(chain, Chain) and chain.totals_mismatch
    assert chain.totals["A"] == pytest.approx(7.8) and chain.stated_totals["A"] == 78.0
    close = parse_chain(chain_text((9, 6), (3, 5), totals=(8.2, 3.5)))  # within 0.5: rounding
    assert not close.totals_mismatch


def test_criterion_names_match_ignoring_case_and_spacing():
    text = chain_text((8, 6), (4, 5)).replace('"A": {"Fits the person"', '"a": {"fits  the PERSON"')
    chain = parse_chain(text)
    assert isinstance(chain, Chain) and chain.scores["A"]["Fits the person"] == 8.0


# -- prototypes ----------------------------------------------------------------------------------

CLUSTERS = {  # three obvious clusters in 2-D
    "north": [(0.0, 10.0), (0.5, 10.2), (-0.4, 9.8)],
    "east": [(10.0, 0.0), (10.3, 0.4), (9.7, -0.3), (10.1, -0.1)],
    "south": [(0.0, -10.0), (0.3, -9.6)],
}
IDS = [f"{name}{i}" for name, points in CLUSTERS.items() for i in range(len(points))]
POINTS = np.array([p for points in CLUSTERS.values() for p in points])


def test_k_means_finds_the_three_clusters_and_assigns_new_users_to_the_nearest():
    protos = fit_prototypes(IDS, POINTS, k=3, seed=0)
    assert protos.k == 3
    groups = sorted(sorted(m) for m in protos.members)
    assert groups == sorted(sorted(u for u in IDS if u.startswith(name)) for name in CLUSTERS)
    assert protos.assign([9.0, 1.0]) == protos.labels[IDS.index("east0")]
    assert protos.assign([0.2, -8.0]) == protos.labels[IDS.index("south0")]


def test_similar_users_are_the_nearest_cluster_by_cosine_then_the_next_nearest_cluster():
    protos = fit_prototypes(IDS, POINTS, k=3, seed=0)
    query = [10.0, 0.35]  # east; most like east1 (10.3, 0.4), then east0, east3, east2
    assert protos.similar_users(query, 2) == ["east1", "east0"]
    four = protos.similar_users(query, 4)
    assert four == ["east1", "east0", "east3", "east2"]
    six = protos.similar_users(query, 6)  # east has 4: the next-nearest centroid is north's
    assert six[:4] == four and set(six[4:]) <= {"north0", "north1", "north2"}
    assert protos.similar_users(query, 2, exclude="east1") == ["east0", "east3"]
    assert protos.similar_users(query, 0) == []
    assert len(protos.similar_users(query, 100)) == len(IDS)


def test_k_is_capped_by_the_number_of_users_and_of_distinct_embeddings():
    assert fit_prototypes(IDS, POINTS).k == len(IDS)  # k=50 by default
    same = fit_prototypes(["a", "b", "c"], np.array([[1.0, 1.0], [1.0, 1.0], [2.0, 0.0]]), k=3)
    assert same.k == 2


def test_k_can_come_from_the_explained_variance():
    rng = np.random.default_rng(0)
    flat = np.column_stack([rng.normal(0, 10, 40), rng.normal(0, 1, 40), rng.normal(0, 0.01, 40)])
    assert k_for_variance(flat, 0.9) == 1
    assert k_for_variance(flat, 0.999) == 2
    assert k_for_variance(flat, 1.0) == 3
    assert fit_prototypes([str(i) for i in range(40)], flat, k=50, k_from_variance=0.999).k == 2
    assert k_for_variance(POINTS, 0.5) == 1 and k_for_variance(POINTS[:1], 0.99) == 1
    with pytest.raises(ValueError):
        k_for_variance(POINTS, 0.0)


def test_prototypes_round_trip_through_a_plain_dict_and_through_json_with_npz(tmp_path):
    protos = fit_prototypes(IDS, POINTS, k=3, seed=0)
    protos.signals = {u: {"profile": [f"post of {u}"], "history": []} for u in IDS}
    again = Prototypes.from_dict(json.loads(json.dumps(protos.to_dict())))
    assert again.similar_users([10.0, 0.35], 3) == protos.similar_users([10.0, 0.35], 3)
    path = protos.save(tmp_path / "protos.json")
    assert (tmp_path / "protos.npz").exists() and "centroids" not in json.loads(path.read_text())
    loaded = Prototypes.load(path)
    np.testing.assert_allclose(loaded.centroids, protos.centroids)
    assert loaded.members == protos.members and loaded.signals == protos.signals
    np.savez(tmp_path / "protos.npz", centroids=protos.centroids * 2, embeddings=protos.embeddings)
    with pytest.raises(ValueError, match="sha256"):
        Prototypes.load(path)


# -- test-time scaling ----------------------------------------------------------------------------

def test_the_scaled_score_is_the_individual_mean_plus_the_neighbour_mean():
    assert scaled_score([6.0, 8.0], [4.0, 6.0]) == 12.0
    assert scaled_score([6.0, 8.0]) == 7.0  # n = 0
    assert scaled_score([6.0, None, 8.0], [None, 4.0]) == 11.0  # failed chains are dropped
    assert scaled_score([6.0], [None, None]) == 6.0  # every neighbour failed: no neighbour term
    assert scaled_score([None, None], [5.0]) is None  # every individual chain failed: no score
    assert scaled_score([], []) is None


def chain(c, r):
    failure = None if c is not None else "malformed_json"
    return {"chosen_total": c, "rejected_total": r, "failure": failure, "totals_mismatch": False}


def test_the_accuracy_grid_recomputes_accuracy_for_fewer_chains_and_neighbours():
    details = [
        # chain 1 right, chain 2 wrong enough to flip the mean; the neighbour pulls it back
        {"m": 2, "n": 1, "chains": [chain(6, 5), chain(4, 8)], "neighbours": [chain(9, 1)]},
        # only failures among the chains: wrong whatever the neighbours say
        {"m": 2, "n": 1, "chains": [chain(None, None), chain(None, None)], "neighbours": [chain(9, 1)]},
        # right everywhere
        {"m": 2, "n": 1, "chains": [chain(7, 2), chain(6, 3)], "neighbours": [chain(5, 4)]},
        # a tie is wrong
        {"m": 2, "n": 1, "chains": [chain(5, 5), chain(None, None)], "neighbours": [chain(2, 8)]},
    ]
    grid = accuracy_grid(details, ms=[1, 2], ns=[0, 1])
    assert grid == {(1, 0): 0.5, (2, 0): 0.25, (1, 1): 0.5, (2, 1): 0.5}
    with pytest.raises(ValueError, match="m=3"):
        accuracy_grid(details, ms=[3], ns=[0])
    with pytest.raises(ValueError, match="n=2"):
        accuracy_grid(details, ms=[1], ns=[2])


# -- the reward model against a fake endpoint ---------------------------------------------------

def test_a_judge_that_prefers_the_chosen_answer_gets_every_pair_right(fake_openai):
    fake_openai.responder = prefers_chosen
    model = load_reward_model(spec_for(fake_openai, m=4))
    results = {r.id: r for r in model.score_pairs([make_pair(1), make_pair(2), make_pair(3)], setting="profile")}
    assert all(r.correct for r in results.values())
    r = results["p1"]
    assert r.chosen_score == pytest.approx(8.6) and r.rejected_score == pytest.approx(3.4)
    chains = r.details["chains"]
    assert len(chains) == 4 and r.details["m"] == 4 and r.details["n"] == 0 and r.details["neighbours"] == []
    assert [c["chosen_position"] for c in chains] == [chosen_position("p1", i) for i in range(4)]
    assert sorted(c["chosen_position"] for c in chains) == ["A", "A", "B", "B"]  # alternating
    assert [c["seed"] for c in chains] == [0, 1, 2, 3] and r.details["parse_failures"] == 0
    assert {c["failure"] for c in chains} == {None} and not any(c["totals_mismatch"] for c in chains)
    assert chains[0]["criteria"] == [{"name": "Fits the person", "weight": 60.0},
                                     {"name": "General quality", "weight": 40.0}]
    bodies = fake_openai.bodies
    assert len(bodies) == 12
    assert {b["temperature"] for b in bodies} == {0.7} and {b["max_tokens"] for b in bodies} == {1024}
    assert sorted(b["seed"] for b in bodies) == sorted([0, 1, 2, 3] * 3)
    assert accuracy_grid([r.details for r in results.values()], [1, 2, 4], [0]) == {
        (1, 0): 1.0, (2, 0): 1.0, (4, 0): 1.0}


def test_failed_chains_are_counted_and_dropped_and_a_totals_mismatch_is_flagged(fake_openai):
    # One pair, so its chains run one after another and the script order is the chain order.
    pair = make_pair(1)
    a_is_chosen = [chosen_position("p1", i) == "A" for i in range(5)]

    def oriented(i, chosen_scores, rejected_scores, **kw):
        a, b = (chosen_scores, rejected_scores) if a_is_chosen[i] else (rejected_scores, chosen_scores)
        if "totals" in kw and not a_is_chosen[i]:  # given as (chosen, rejected) too
            kw["totals"] = kw["totals"][::-1]
        return chain_text(a, b, **kw)

    fake_openai.script(
        oriented(0, (8, 8), (4, 4)),                                   # fine: 8 vs 4
        "Persona: ... ```json\n{\"persona\": \"x\", \"criteria\": [}\n```",  # malformed JSON
        oriented(2, (9, 9), (1, 1), weights=(50, 40)),                 # weights sum to 90
        oriented(3, (6, 6), (5, 5), totals=(60.0, 50.0)),              # totals disagree: 6 vs 5 used
        oriented(4, (12, 8), (1, 1)),                                  # out of range
    )
    model = load_reward_model(spec_for(fake_openai, m=5))
    [result] = model.score_pairs([pair], setting="profile")
    chains = result.details["chains"]
    assert [c["failure"] for c in chains] == [None, "malformed_json", "weights_sum", None, "score_out_of_range"]
    assert result.details["parse_failures"] == 3
    assert [c["totals_mismatch"] for c in chains] == [False, False, False, True, False]
    assert chains[3]["chosen_total"] == 6.0 and chains[3]["stated_totals"]["chosen"] == 60.0
    assert chains[1]["raw"].startswith("Persona") and chains[1]["chosen_total"] is None
    assert result.chosen_score == 7.0 and result.rejected_score == 4.5 and result.correct


def test_a_pair_whose_chains_all_fail_has_no_score_and_is_wrong(fake_openai):
    fake_openai.responder = lambda body: "Answer A is clearly better for this person."
    model = load_reward_model(spec_for(fake_openai, m=3))
    [result] = model.score_pairs([make_pair(1)], setting="profile")
    assert result.chosen_score is None and result.rejected_score is None and not result.correct
    assert result.details["parse_failures"] == 3 and {c["failure"] for c in result.details["chains"]} == {"no_json"}


def test_the_prompt_shows_posts_and_history_pairs_and_nothing_of_the_answer_key(fake_openai):
    fake_openai.responder = prefers_chosen
    rendered = tuple(f"Asked: {h['prompt']} | Preferred: {h['chosen']} | Over: {h['rejected']}" for h in HISTORY)
    pair = make_pair(1, profile=("POST-1-1 about sailing", *rendered), history=HISTORY)
    model = load_reward_model(spec_for(fake_openai, m=2))
    list(model.score_pairs([pair], setting="profile"))
    for body in fake_openai.bodies:
        dumped = json.dumps(body)
        assert "SENTINEL" not in dumped
        user = user_message(body)
        assert "POST-1-1 about sailing" in user and "QUESTION-1" in user
        for h in HISTORY:
            for key in ("prompt", "chosen", "rejected"):
                assert user.count(h[key]) == 1  # shown once, as a structured pair (its text copy is dropped)
        assert "Asked:" not in user
        assert "PLAN-1" not in user
        assert "CHOSEN-1" in user and "REJECTED-1" in user
    first, second = (user_message(b) for b in fake_openai.bodies)
    assert {block(first, "Answer A")[:6], block(second, "Answer A")[:6]} == {"CHOSEN", "REJECT"}


def test_the_settings_decide_which_signals_are_shown(fake_openai):
    fake_openai.responder = prefers_chosen
    model = load_reward_model(spec_for(fake_openai, m=1))
    pair = make_pair(1, history=HISTORY)
    list(model.score_pairs([pair], setting="no_profile"))
    list(model.score_pairs([pair], setting="plan"))
    no_profile, plan = (user_message(b) for b in fake_openai.bodies)
    assert "POST-1" not in no_profile and "HIST-" not in no_profile and "PLAN-1" not in no_profile
    assert "Nothing is known about this person" in no_profile
    assert "PLAN-1: low-tech" in plan and "POST-1" not in plan and "HIST-" not in plan
    with pytest.raises(ModelError, match="plan"):
        list(model.score_pairs([make_pair(2, plan=())], setting="plan"))


def test_render_inputs_are_the_exact_prompts_of_both_orders(fake_openai):
    fake_openai.responder = prefers_chosen
    model = load_reward_model(spec_for(fake_openai, m=2))
    pair = make_pair(1, history=HISTORY)
    chosen_first, chosen_second = model.render_inputs(pair, setting="profile")
    assert block(chosen_first, "Answer A").startswith("CHOSEN-1")
    assert block(chosen_second, "Answer B").startswith("CHOSEN-1")
    list(model.score_pairs([pair], setting="profile"))
    sent = {chosen_position("p1", i): messages_as_text(fake_openai.bodies[i]["messages"]) for i in range(2)}
    assert sent == {"A": chosen_first, "B": chosen_second}


def test_the_cache_answers_a_rerun_and_usage_adds_up(fake_openai, tmp_path):
    fake_openai.responder = prefers_chosen
    pairs = [make_pair(1), make_pair(2)]
    model = load_reward_model(spec_for(fake_openai, m=3, cache_dir=str(tmp_path / "cache"),
                                       price_prompt_per_1k=1.0))
    first = sorted((r.id, r.chosen_score, r.rejected_score) for r in model.score_pairs(pairs, setting="profile"))
    usage = model.usage()
    assert usage["requests"] == 6 and usage["cache_misses"] == 6 and usage["cache_hits"] == 0
    assert usage["prompt_tokens"] == 60 and usage["cost"] == pytest.approx(0.06) and usage["chains"] == 6
    again = load_reward_model(spec_for(fake_openai, m=4, cache_dir=str(tmp_path / "cache")))
    list(again.score_pairs(pairs, setting="profile"))
    assert len(fake_openai.requests) == 8  # chains 0-2 came from the cache, only chain 3 was asked
    assert again.usage()["cache_hits"] == 6 and again.usage()["chain_prompt_tokens"] == 80
    rerun = load_reward_model(spec_for(fake_openai, m=3, cache_dir=str(tmp_path / "cache")))
    assert sorted((r.id, r.chosen_score, r.rejected_score) for r in rerun.score_pairs(pairs, setting="profile")) \
        == first
    assert len(fake_openai.requests) == 8


@pytest.mark.parametrize("options, message", [
    ({"bogus": 1}, "option 'bogus' is not an option of the pgenrm kind"),
    ({"m": 0}, "option 'm': Input should be greater than or equal to 1"),
    ({"m": True}, "option 'm': Input should be a valid integer"),
    ({"n": -1}, "option 'n': Input should be greater than or equal to 0"),
    ({"n": 2}, "option n > 0 needs option prototypes"),
    ({"temperature": 0, "m": 2}, "option temperature must be above 0 when m > 1"),
    ({"temperature": "hot"}, "option 'temperature': Input should be a valid number"),
    ({"prototypes": "nonexistent/protos.json"}, "protos.json does not exist"),
    ({"prototypes": "/etc/protos.json"}, "option 'prototypes': must be a file name relative to the data folder"),
    ({"prototypes": "../protos.json"}, "option 'prototypes': must be a file name relative to the data folder"),
    ({"api_key": "sk-123"}, "option 'api_key' is not an option of the pgenrm kind"),
])
def test_bad_options_are_refused(fake_openai, tmp_path, options, message):
    spec = spec_for(fake_openai, **options)
    spec = ModelSpec(**{**spec.__dict__, "runtime": {**spec.runtime, "data_root": str(tmp_path)}})
    with pytest.raises(ModelError, match=re.escape(message)):
        PGenRM.load(spec)


def test_a_prototypes_file_that_links_out_of_the_data_folder_is_refused(fake_openai, tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    data = tmp_path / "data"
    data.mkdir()
    (data / "protos.json").symlink_to(outside)
    spec = spec_for(fake_openai, n=1, prototypes="protos.json")
    spec = ModelSpec(**{**spec.__dict__, "runtime": {**spec.runtime, "data_root": str(data)}})
    with pytest.raises(ModelError, match=re.escape("prototypes file 'protos.json' is outside the data folder")):
        PGenRM.load(spec)


def test_a_single_chain_may_be_greedy(fake_openai):
    fake_openai.responder = prefers_chosen
    model = PGenRM.load(spec_for(fake_openai, m=1, temperature=0))
    assert next(iter(model.score_pairs([make_pair(1)], setting="profile"))).correct
    assert fake_openai.bodies[0]["temperature"] == 0


# -- neighbours ---------------------------------------------------------------------------------

TOPICS = {"sailing": (1.0, 0.0), "boat": (0.9, 0.1), "cooking": (0.0, 1.0), "baking": (0.1, 0.9)}


def topic_embed(texts):
    """A hand-made 2-D embedder: the direction of the first topic word in each text."""
    rows = []
    for text in texts:
        rows.append(next((v for word, v in TOPICS.items() if word in text), (0.5, 0.5)))
    return np.array(rows, dtype=np.float32)


TRAINING_USERS = {
    "sailor-a": {"profile": ["I go sailing every weekend", "sailing in fog"], "history": [],
                 "narrative": NARRATIVE},
    "sailor-b": {"profile": ["my boat needs paint"], "history": [
        {"prompt": "boat varnish?", "chosen": "NEIGHBOUR-B-CHOSEN marine varnish", "rejected": "any paint",
         "narrative": NARRATIVE}]},
    "cook-a": {"profile": ["cooking for six", "cooking on a budget"], "history": []},
    "cook-b": {"profile": ["baking sourdough"], "history": []},
}


def neighbour_model(server, tmp_path, **kwargs):
    protos = build_prototypes(TRAINING_USERS, embed=topic_embed, k=2, seed=0)
    path = protos.save(tmp_path / "protos.json")
    loaded = Prototypes.load(path)
    from prblib.llm.client import build_backend

    backend = build_backend({"base_url": server.base_url, "model": "judge-model", "max_retries": 0, "timeout": 5})
    return PGenRM(backend, prototypes=loaded, embed=topic_embed, **kwargs)


def test_neighbour_chains_use_the_similar_users_signals_with_the_current_question(fake_openai, tmp_path):
    fake_openai.responder = prefers_chosen
    model = neighbour_model(fake_openai, tmp_path, m=2, n=2)
    pair = make_pair(1, profile=("sailing in the Baltic",))
    [result] = model.score_pairs([pair], setting="profile")
    neighbours = result.details["neighbours"]
    assert [nb["user"] for nb in neighbours] == ["sailor-a", "sailor-b"]
    assert neighbours[0]["similarity"] == pytest.approx(1.0)
    assert [nb["chosen_position"] for nb in neighbours] == [chosen_position("p1", j) for j in range(2)]
    assert result.details["neighbours_skipped"] is None and result.details["parse_failures"] == 0
    assert result.chosen_score == pytest.approx(8.6 + 8.6) and result.correct
    users = [user_message(b) for b in fake_openai.bodies]
    assert len(users) == 4
    assert all("QUESTION-1" in u and "CHOSEN-1" in u for u in users)
    assert "sailing in the Baltic" in users[0] and "sailing in the Baltic" in users[1]
    assert "I go sailing every weekend" in users[2] and "sailing in the Baltic" not in users[2]
    assert "NEIGHBOUR-B-CHOSEN marine varnish" in users[3] and "my boat needs paint" in users[3]
    assert not any("SENTINEL" in json.dumps(b) for b in fake_openai.bodies)
    grid = accuracy_grid([result.details], ms=[1, 2], ns=[0, 1, 2])
    assert set(grid.values()) == {1.0}


def test_a_user_among_the_training_users_is_not_their_own_neighbour(fake_openai, tmp_path):
    fake_openai.responder = prefers_chosen
    model = neighbour_model(fake_openai, tmp_path, m=1, n=1)
    pair = make_pair(1, profile=tuple(TRAINING_USERS["sailor-a"]["profile"]))
    [result] = model.score_pairs([pair], setting="profile")
    assert [nb["user"] for nb in result.details["neighbours"]] == ["sailor-b"]


def test_neighbours_are_skipped_without_signals_to_embed(fake_openai, tmp_path):
    fake_openai.responder = prefers_chosen
    model = neighbour_model(fake_openai, tmp_path, m=1, n=2)
    [plain] = model.score_pairs([make_pair(1)], setting="no_profile")
    [empty] = model.score_pairs([make_pair(2, profile=())], setting="profile")
    for result in (plain, empty):
        assert result.details["neighbours"] == [] and result.details["neighbours_skipped"]
        assert result.correct
    assert len(fake_openai.requests) == 2


def test_neighbour_failures_drop_out_of_the_neighbour_mean(fake_openai, tmp_path):
    def reply(body):
        user = user_message(body)
        if "sailing in fog" in user:  # sailor-a's chain
            return "no json here"
        return prefers_chosen(body)

    fake_openai.responder = reply
    model = neighbour_model(fake_openai, tmp_path, m=1, n=2)
    [result] = model.score_pairs([make_pair(1, profile=("sailing in the Baltic",))], setting="profile")
    assert [nb["failure"] for nb in result.details["neighbours"]] == ["no_json", None]
    assert result.details["parse_failures"] == 1
    assert result.chosen_score == pytest.approx(8.6 + 8.6)


def test_load_rebuilds_the_bundled_embedder_from_a_prototypes_file(fake_openai, tmp_path):
    from prblib.construction.retrieval import DenseRetriever

    retriever = DenseRetriever.default()
    try:
        protos = build_prototypes(TRAINING_USERS, embed=retriever.embed, k=2, embedder=embedder_meta(retriever))
    finally:
        retriever.close()
    path = protos.save(tmp_path / "protos.json")
    fake_openai.responder = prefers_chosen
    spec = spec_for(fake_openai, m=1, n=1, prototypes=path.name, cache_dir=str(tmp_path / "c"))
    model = PGenRM.load(ModelSpec(**{**spec.__dict__, "runtime": {**spec.runtime, "data_root": str(tmp_path)}}))
    try:
        [result] = model.score_pairs([make_pair(1, profile=("We went sailing on a small boat",))],
                                     setting="profile")
    finally:
        model.close()
    assert [nb["user"] for nb in result.details["neighbours"]][0] in {"sailor-a", "sailor-b"}
    assert result.correct and any((tmp_path / "c" / "embeddings").iterdir())


def test_prototypes_without_signals_cannot_serve_neighbours(fake_openai, tmp_path):
    protos = fit_prototypes(IDS, POINTS, k=3)
    path = protos.save(tmp_path / "protos.json")
    with pytest.raises(ModelError, match="no preference signals"):
        PGenRM(None, n=1, prototypes=Prototypes.load(path), embed=topic_embed)


def test_user_signals_leave_out_posts_that_repeat_a_history_item():
    rendered = f"Asked: {HISTORY[0]['prompt']} | Preferred: {HISTORY[0]['chosen']} | Over: {HISTORY[0]['rejected']}"
    shown = user_signals(["a post", rendered], HISTORY, k=10)
    assert shown.posts == ("a post",) and len(shown.history) == 2
    assert user_signals([f"p{i}" for i in range(20)], HISTORY * 8, k=3).posts == ("p0", "p1", "p2")
    with pytest.raises(ModelError, match="history item 1"):
        user_signals([], [{"prompt": "q", "chosen": 3, "rejected": "r"}])


# -- a tiny random local LM -----------------------------------------------------------------------

def test_a_random_local_model_gives_counted_parse_failures_and_a_wrong_pair(tiny_lm_folder):  # noqa: F811
    spec = ModelSpec(kind="pgenrm", path=str(tiny_lm_folder), options={"max_tokens": 8, "m": 2},
                     runtime={"backend": "local"})
    model = load_reward_model(spec)
    try:
        [result] = model.score_pairs([make_pair(1, history=HISTORY)], setting="profile")
        usage = model.usage()
    finally:
        model.close()
    assert result.details["parse_failures"] == 2
    # 8 tokens, then 16, never reach an end-of-sequence token: each chain is truncated, never parsed.
    assert [c["failure"] for c in result.details["chains"]] == ["truncated", "truncated"]
    assert all(c["raw"] for c in result.details["chains"])
    assert result.chosen_score is None and not result.correct
    assert usage["requests"] == 4  # two chains, each asked twice (the second time with 16 tokens)
    assert usage["completion_tokens"] > 0 and usage["prompt_tokens"] > 0


def test_importing_pgenrm_loads_no_heavy_library():
    code = ("import sys, prblib.rewards.pgenrm.model; "
            "print(sorted(m for m in ('torch', 'transformers', 'openai', 'sklearn', 'django') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"
