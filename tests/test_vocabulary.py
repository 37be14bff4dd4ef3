"""One vocabulary (issue 13): reward-model kinds, settings, outcome kinds and the Best-of-N k grid
are declared once, in prblib/registry.py.

- adding a kind to the registry is the only edit for it to be offered by the submission form, the
  API's request schema (its OpenAPI enum), `evaluate_rm --kind`, the option schemas and the loader;
- no module outside the registry spells out a list of these names (a precise AST and text scan:
  a literal tuple/list/set/dict holding two or more names of one vocabulary, or the k grid);
- no module, template or script outside the registry and the kinds' own modules compares a value
  with a kind's name (`kind == Kind.SCORES`, `kind != "pgenrm"`, `x in ("scalar",)`, `=== "scores"`):
  what a kind can do is a registry capability (`RMKind` flags, `needs`, `prompts`, the options
  model's `data_files()`), asked for by every check.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from prblib import registry

ROOT = Path(__file__).resolve().parent.parent


class ToyRewardModel:
    """A kind that exists only in this test: every pair's chosen answer wins by one."""

    kind = "toy"
    scores_groups = False

    @classmethod
    def load(cls, spec):
        return cls()

    def score_pairs(self, pairs, *, setting, progress=None):
        from prblib.rewards.base import PairResult

        return iter([PairResult(p.id, 1.0, 0.0) for p in pairs])

    def render_inputs(self, pair, *, setting):
        return "", ""

    def usage(self):
        return None

    def reusable(self):
        return True

    def close(self):
        pass


TOY = registry.RMKind("toy", "Toy test RM", f"{__name__}:ToyRewardModel", "ScalarOptions",
                      frozenset({"model_folder"}), model_task="sequence-classification")


@pytest.fixture
def toy_kind(monkeypatch):
    monkeypatch.setattr(registry, "KINDS", (*registry.KINDS, TOY))
    return TOY


def test_the_registry_holds_todays_vocabulary_with_the_stored_values_and_labels():
    from leaderboard.models import Kind, OutcomeKind, Setting

    assert registry.kind_choices() == [
        ("scalar", "Scalar (sequence classification)"), ("pairwise", "Generative judge, pairwise"),
        ("pointwise", "Generative judge, pointwise"), ("scores", "Uploaded scores"),
        ("pgenrm", "P-GenRM personalised judge"), ("dpo", "DPO implicit reward (policy vs reference)")]
    assert registry.setting_choices() == [("no_profile", "Without profile"), ("profile", "With profile"),
                                          ("plan", "With plan")]
    assert registry.outcome_kind_names() == ("best_of_n", "ppo", "grpo", "rloo")
    assert registry.generative_kind_names() == ("pairwise", "pointwise", "pgenrm")
    assert registry.KS == (1, 2, 4, 8, 16) and registry.k_grid(12) == (1, 2, 4, 8, 12)
    # The Django choices are views of the registry, member names included (Kind.SCALAR, Setting.PLAN).
    assert Kind.choices == registry.kind_choices() and Kind.SCALAR == "scalar" and Kind.PGENRM.label.startswith("P-")
    assert Setting.choices == registry.setting_choices() and Setting.PLAN == "plan"
    assert OutcomeKind.choices == registry.outcome_kind_choices() and OutcomeKind.BEST_OF_N == "best_of_n"


def test_every_kinds_class_declares_what_its_registry_entry_says():
    from prblib.rewards.options import options_model

    for entry in registry.KINDS:
        cls = entry.load_class()
        assert cls.kind == entry.name
        assert cls.scores_groups is entry.scores_groups, entry.name
        assert callable(cls.usage) and callable(cls.close) and callable(cls.load), entry.name
        assert options_model(entry.name).__name__ == entry.options


def test_a_kind_added_to_the_registry_is_offered_everywhere(toy_kind, researcher, client):
    from django.core.management import load_command_class

    from leaderboard.api import SubmissionCreateSerializer
    from leaderboard.forms import SubmissionForm, kind_fields
    from prblib.rewards.base import ModelSpec, load_reward_model
    from prblib.rewards.options import options_model

    # the submission form, with the fields its needs bring
    assert ("toy", "Toy test RM") in SubmissionForm().fields["kind"].choices
    assert kind_fields()["toy"] == ("model_path", "dtype", "max_length", "batch_size", "profile_k", "options")
    # the API: accepted by the serializer and listed in the OpenAPI enum of `kind`
    assert SubmissionCreateSerializer().fields["kind"].choices["toy"] == "Toy test RM"
    client.force_login(researcher)
    schema = client.get("/api/schema/?format=json").json()
    enums = [c["enum"] for c in schema["components"]["schemas"].values() if "enum" in c]
    assert any("toy" in values and "scalar" in values for values in enums)
    # ... read when the document is generated: the options' oneOf and the leaderboard's `kind` filter
    options = schema["components"]["schemas"]["SubmissionCreateRequest"]["properties"]["options"]
    assert [o["title"] for o in options["oneOf"]][-1] == "toy options"
    parameters = schema["paths"]["/api/leaderboard/"]["get"]["parameters"]
    assert "toy" in next(p for p in parameters if p["name"] == "kind")["schema"]["enum"]
    # evaluate_rm --kind
    parser = load_command_class("pipeline", "evaluate_rm").create_parser("manage.py", "evaluate_rm")
    args = parser.parse_args(["--benchmark", "b", "--model", "m", "--kind", "toy", "--setting", "profile"])
    assert args.kind == "toy"
    # the option schema and the lazy loader
    assert options_model("toy").__name__ == "ScalarOptions"
    assert isinstance(load_reward_model(ModelSpec(kind="toy", path="")), ToyRewardModel)


def toy_prompts(options, *, template_file=None):
    return {"judge": f"toy-judge@v{options.get('version', 1)}"}


def test_what_a_kind_can_do_is_a_registry_capability(monkeypatch):
    from pipeline.manifest import downstream_template_versions, template_versions
    from prblib.rewards.options import parse_options

    by_flag = {flag: [k.name for k in registry.KINDS if getattr(k, flag)]
               for flag in ("scores_groups", "single_setting", "template_file", "chain_scaling")}
    assert by_flag == {"scores_groups": ["scalar", "dpo"], "single_setting": ["scores"], "template_file": ["pgenrm"],
                       "chain_scaling": ["pgenrm"]}
    assert [k.name for k in registry.KINDS if not k.scores_new_answers] == ["scores"]
    assert [k.name for k in registry.KINDS if k.prompts is None] == ["scalar", "scores", "dpo"]
    # A new kind's prompts reach the manifest through its registry entry alone.
    toy = dataclasses.replace(TOY, prompts=f"{__name__}:toy_prompts", template_file=True)
    monkeypatch.setattr(registry, "KINDS", (*registry.KINDS, toy))
    assert template_versions("toy", {"version": 3}) == {"judge": "toy-judge@v3"}
    assert downstream_template_versions(rm_kind="toy")["rm_judge"] == "toy-judge@v1"
    assert registry.template_file_kind_names() == ("pgenrm", "toy")
    # The data files a kind's options need are declared by its options model.
    assert parse_options("pgenrm", {"n": 2}).data_files()["prototypes"][0] is None
    assert parse_options("pgenrm", {"preset": "paper", "prototypes": "p.json"}).data_files()["prototypes"][0] == "p.json"
    assert parse_options("pgenrm", {}).data_files() == {} and parse_options("scalar", {}).data_files() == {}


def test_a_kind_not_in_the_registry_is_refused_by_name():
    from prblib.rewards.base import ModelSpec, load_reward_model
    from prblib.errors import ModelError

    with pytest.raises(ModelError, match=r"unknown reward-model kind 'toy' \(known: scalar, pairwise"):
        load_reward_model(ModelSpec(kind="toy", path=""))


def test_a_setting_added_to_the_registry_is_accepted_and_documented_by_the_api(monkeypatch, researcher, client):
    from leaderboard.api import SubmissionCreateSerializer

    monkeypatch.setattr(registry, "SETTINGS", (*registry.SETTINGS, registry.SettingInfo("toy_setting", "Toy")))
    field = SubmissionCreateSerializer().fields["settings"]
    assert field.max_length == 4 and "toy_setting" in field.child.choices
    client.force_login(researcher)
    schema = client.get("/api/schema/?format=json").json()
    parameters = schema["paths"]["/api/correlations/"]["get"]["parameters"]
    assert "toy_setting" in next(p for p in parameters if p["name"] == "setting")["schema"]["enum"]


def test_a_setting_needing_plans_is_declared_with_its_need():
    plan = registry.setting("plan")
    assert plan.needs == "plan" and "plan_benchmark" in plan.needs_hint
    assert dataclasses.replace(TOY, settings=("profile",)).supports("profile")
    assert not dataclasses.replace(TOY, settings=("profile",)).supports("plan")


# -- no second list ----------------------------------------------------------------------------

SCANNED = ("pipeline", "leaderboard", "annotation", "prbench", "jobs")
VOCABULARIES = {
    "kinds": {k.name for k in registry.KINDS},
    # "profile" and "plan" are also item fields: a list of settings is one with "no_profile" in it
    "settings": {s.name for s in registry.SETTINGS},
    "outcome kinds": {o.name for o in registry.OUTCOME_KINDS},
}
MEMBERS = {"kinds": "Kind", "settings": "Setting", "outcome kinds": "OutcomeKind"}


def _python_files():
    for room in SCANNED:
        for path in sorted((ROOT / room).rglob("*.py")):
            if "migrations" in path.parts or path == ROOT / "prblib/registry.py":
                continue  # migrations keep the choices they were written with
            yield path


def _listed(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return list(node.elts)
    if isinstance(node, ast.Dict):
        return [k for k in node.keys if k is not None]
    return []


def _spelled_lists(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        elements = _listed(node)
        if not elements:
            continue
        strings = {e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        members = {(e.value.id, e.attr) for e in elements
                   if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name)}
        for vocabulary, names in VOCABULARIES.items():
            hits = strings & names
            if len(hits) >= 2 and (vocabulary != "settings" or "no_profile" in hits):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} lists {vocabulary} {sorted(hits)}")
            if len({attr for owner, attr in members if owner == MEMBERS[vocabulary]}) >= 2:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} lists {MEMBERS[vocabulary]} members")
        ints = [e.value for e in elements if isinstance(e, ast.Constant) and type(e.value) is int]
        if len(ints) == len(elements) and tuple(ints) == registry.KS:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} spells the k grid {tuple(ints)}")
    return found


def test_no_module_outside_the_registry_spells_out_a_vocabulary_list():
    found = [hit for path in _python_files() for hit in _spelled_lists(path)]
    assert found == []


def test_the_scan_finds_a_spelled_list(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('A = ("pairwise", "pgenrm")\nB = {Kind.SCALAR: 1, Kind.SCORES: 2}\nC = [1, 2, 4, 8, 16]\n'
                      'D = ("id", "profile", "plan")\nE = {"pairwise": 0.0, "centre": 0.0}\n')
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        found = _spelled_lists(sample)
    finally:
        ROOT = saved
    assert found == ["sample.py:1 lists kinds ['pairwise', 'pgenrm']", "sample.py:2 lists Kind members",
                     "sample.py:3 spells the k grid (1, 2, 4, 8, 16)"]


def test_no_template_or_script_spells_out_the_kinds():
    names = sorted(VOCABULARIES["kinds"])
    pattern = re.compile("|".join(rf"\b{re.escape(n)}\b" for n in names))
    found = []
    for folder, suffix in (("templates", "*.html"), ("static/js", "*.js")):
        for path in sorted((ROOT / folder).rglob(suffix)):
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                hits = set(pattern.findall(line))
                if len(hits) >= 2:
                    found.append(f"{path.relative_to(ROOT)}:{number} {sorted(hits)}")
    assert found == []


# -- no check by kind name -----------------------------------------------------------------------

def _kind_modules() -> set[Path]:
    """The kinds' own modules: they may name their own kind (a class's `kind = "scalar"`)."""
    return {ROOT / (k.implementation.partition(":")[0].replace(".", "/") + ".py") for k in registry.KINDS}


def _kind_named(node: ast.AST) -> str | None:
    """The kind name `node` spells: "'scores'" for a string, "Kind.SCORES" for a member, the first
    of a literal tuple/list/set; None otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in VOCABULARIES["kinds"]:
        return repr(node.value)
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Kind"
            and node.attr.isupper()):  # a member (Kind.SCORES), not Kind.values or Kind.choices
        return f"Kind.{node.attr}"
    for element in _listed(node):
        named = _kind_named(element)
        if named:
            return named
    return None


def _kind_comparisons(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                named = _kind_named(operand)
                if named:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} compares with {named}")
        elif isinstance(node, ast.match_case) and isinstance(node.pattern, ast.MatchValue):
            named = _kind_named(node.pattern.value)
            if named:
                found.append(f"{path.relative_to(ROOT)}:{node.pattern.lineno} matches {named}")
    return found


def test_no_module_outside_the_registry_checks_a_kind_by_its_name():
    own = _kind_modules()
    found = [hit for path in _python_files() if path not in own for hit in _kind_comparisons(path)]
    assert found == []


def test_the_scan_finds_a_check_by_kind_name(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('if kind == Kind.SCORES:\n    pass\nok = run.kind != "pgenrm"\nalso = k in ("scalar",)\n'
                      'fine = kind in registry.kind_names() or kind in Kind.values\nfield = name == "scores_file"\n'
                      'match kind:\n    case "pairwise":\n        pass\n')
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        found = _kind_comparisons(sample)
    finally:
        ROOT = saved
    assert found == ["sample.py:1 compares with Kind.SCORES", "sample.py:3 compares with 'pgenrm'",
                     "sample.py:4 compares with 'scalar'", "sample.py:8 matches 'pairwise'"]


def _script_comparisons(text: str) -> list[tuple[int, str]]:
    names = "|".join(re.escape(n) for n in sorted(VOCABULARIES["kinds"]))
    pattern = re.compile(rf"""(?:[=!]==?|\bin)\s*["']({names})["']|["']({names})["']\s*(?:[=!]==?|\bin\b)""")
    return [(number, first or second) for number, line in enumerate(text.splitlines(), start=1)
            for first, second in pattern.findall(line)]


def test_no_template_or_script_checks_a_kind_by_its_name():
    found = []
    for folder, suffix in (("templates", "*.html"), ("static/js", "*.js")):
        for path in sorted((ROOT / folder).rglob(suffix)):
            found += [f"{path.relative_to(ROOT)}:{n} {name}" for n, name in _script_comparisons(path.read_text())]
    assert found == []


def test_the_template_scan_finds_a_check_by_kind_name():
    text = ('{% if submission.kind == "scores" %}\n<p>kind scores</p>\nif (kind.value === \'pgenrm\') {}\n'
            "{% if 'scalar' != k %}\nconst field = name === \"scores_file\";\n")
    assert _script_comparisons(text) == [(1, "scores"), (3, "pgenrm"), (4, "scalar")]
