"""`evaluate_rm`: the public command, and the proof that the answer key never reaches a model."""

import json

import pytest
from django.core.management import CommandError, call_command

from pipeline.models import BenchmarkItem
from pipeline.services import benchmark_import
from tests.prblib.test_llm import save_tiny_causal_lm
from prblib.tiny_models import build_decoder_rm
from tests.pipeline.test_formats import SAMPLE

pytestmark = pytest.mark.django_db

SETTINGS = ("no_profile", "profile", "plan")


@pytest.fixture
def sample_with_sentinels():
    """The sample benchmark with answer-key fields replaced by unmistakable sentinels, and
    planner aspects so the plan setting runs."""
    benchmark = benchmark_import(path=SAMPLE, name="sample").benchmark
    for item in benchmark.items.all():
        item.narrative = f"NARRATIVE-SENTINEL-{item.pk} the user secretly wants X"
        item.rubric_aspects = [{"aspect": f"ASPECT-SENTINEL-{item.pk}", "evidence": f"EVIDENCE-SENTINEL-{item.pk}",
                                "reason": f"REASON-SENTINEL-{item.pk}"}]
        item.plan = [f"Planner aspect {n} for {item.source_id}" for n in range(3)]
        item.save()
    return benchmark


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    scores = root / "scores.jsonl"
    return {"scalar": build_decoder_rm(root / "scalar"), "causal": save_tiny_causal_lm(root / "causal"),
            "scores": scores}


def model_arg(kind: str, models, benchmark) -> str:
    if kind == "scores":
        lines = [json.dumps({"id": i, "chosen_score": 1.0, "rejected_score": 0.0})
                 for i in benchmark.items.values_list("source_id", flat=True)]
        models["scores"].write_text("\n".join(lines) + "\n")
        return str(models["scores"])
    return str(models["scalar" if kind == "scalar" else "causal"])


@pytest.mark.parametrize("kind", ["scalar", "pairwise", "pointwise", "scores"])
@pytest.mark.parametrize("setting", SETTINGS)
def test_the_narrative_and_rubric_never_reach_any_model(kind, setting, sample_with_sentinels, models, tmp_path):
    dump = tmp_path / "inputs.jsonl"
    args = ["evaluate_rm", "--benchmark", "sample", "--model", model_arg(kind, models, sample_with_sentinels),
            "--kind", kind, "--setting", setting, "--dump-inputs", str(dump), "--limit", "4", "-v", "0"]
    if kind in ("pairwise", "pointwise"):
        args += ["--option", "max_tokens=4"]
    with open(tmp_path / "stdout.txt", "w") as out:
        call_command(*args, stdout=out)
    rows = [json.loads(line) for line in dump.read_text().splitlines()]
    assert len(rows) == 4
    items = {i.source_id: i for i in BenchmarkItem.objects.filter(source_id__in=[r["id"] for r in rows])}
    for row in rows:
        text = row["chosen_text"] + row["rejected_text"]
        assert "SENTINEL" not in text
        item = items[row["id"]]
        if kind == "scores":
            assert text == ""  # nothing is computed: the scores were uploaded
            continue
        assert item.question in text
        first_post = item.profile[0]["text"].strip()
        assert (first_post in text) == (setting == "profile")
        assert ("Planner aspect 0" in text) == (setting == "plan")


def test_evaluate_rm_writes_per_pair_results_and_ends_with_a_json_summary(sample_with_sentinels, models, tmp_path,
                                                                          capsys):
    out = tmp_path / "pairs.jsonl"
    call_command("evaluate_rm", "--benchmark", "sample", "--model", str(models["scalar"]), "--kind", "scalar",
                 "--setting", "profile", "--out", str(out), "--batch-size", "3")
    stdout = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(stdout[-1])
    assert summary["n"] == 30 and 0 <= summary["accuracy"] <= 1 and "ties" in summary
    assert set(summary["by_domain"]) == {"arts_entertainment", "lifestyle_personal_development", "society_culture"}
    pairs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(pairs) == 30 and set(pairs[0]) == {"id", "domain", "chosen_score", "rejected_score", "correct"}
    assert sum(p["correct"] for p in pairs) / 30 == pytest.approx(summary["accuracy"])


def test_a_judge_that_never_answers_in_format_scores_every_pair_wrong(sample_with_sentinels, models, capsys):
    # A tiny random causal LM writes gibberish: every verdict is a parse failure, and a
    # parse failure is counted wrong, never turned into a default answer.
    call_command("evaluate_rm", "--benchmark", "sample", "--model", str(models["causal"]), "--kind", "pairwise",
                 "--setting", "no_profile", "--limit", "3", "--option", "max_tokens=4", "-v", "0")
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["accuracy"] == 0 and summary["judge"]["parse_failure_rate"] == 1.0


def test_evaluate_rm_errors_are_one_clear_line(sample_with_sentinels, models, tmp_path):
    with pytest.raises(CommandError, match="no benchmark named 'missing'"):
        call_command("evaluate_rm", "--benchmark", "missing", "--model", "x", "--kind", "scalar",
                     "--setting", "profile")
    with pytest.raises(CommandError, match="config.json"):
        call_command("evaluate_rm", "--benchmark", "sample", "--model", str(tmp_path), "--kind", "scalar",
                     "--setting", "profile")
    # An operator's template file is for the kinds whose registry entry says so (template_file).
    with pytest.raises(CommandError, match="--template-file serves the pgenrm kind, not scalar"):
        call_command("evaluate_rm", "--benchmark", "sample", "--model", str(models["scalar"]), "--kind", "scalar",
                     "--setting", "profile", "--template-file", "template.json")
    BenchmarkItem.objects.update(plan=[])
    with pytest.raises(CommandError, match="needs planner aspects"):
        call_command("evaluate_rm", "--benchmark", "sample", "--model", model_arg("scores", models, sample_with_sentinels),
                     "--kind", "scores", "--setting", "plan")


@pytest.mark.django_db(transaction=True)
def test_evaluate_rm_starts_without_the_url_conf_or_views(models):
    """Start-up is much of a small evaluation's time: no system checks (they import every URLconf
    and view). (scipy.stats is loaded: the summary's calibration needs it, as the worker's does.)"""
    import subprocess
    import sys

    from tests.conftest import BASE_DIR, subprocess_env

    benchmark = benchmark_import(path=SAMPLE, name="sample").benchmark
    argv = ["manage.py", "evaluate_rm", "--benchmark", "sample", "--model", str(models["scalar"]), "--kind", "scalar",
            "--setting", "profile", "-v", "0"]
    code = ("import json, sys\n"
            "from django.core.management import execute_from_command_line\n"
            f"execute_from_command_line({argv!r})\n"
            "heavy = ('drf_spectacular.views', 'prbench.urls', 'leaderboard.views')\n"
            "print(json.dumps(sorted(m for m in heavy if m in sys.modules)))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=BASE_DIR, env=subprocess_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    *_, summary, loaded = proc.stdout.strip().splitlines()
    assert json.loads(summary)["n"] == benchmark.items.count()
    assert json.loads(loaded) == []


@pytest.mark.django_db(transaction=True)
def test_manage_py_evaluate_rm_writes_everything_before_it_skips_the_teardown(models, tmp_path):
    """manage.py ends a process that loaded torch with os._exit after the command
    (core/fast_exit.py): the summary on stdout, the progress bar on stderr and every --out
    line are all there, and the exit status is 0; a failing run still exits 1 with its message."""
    import subprocess
    import sys

    from tests.conftest import BASE_DIR, subprocess_env

    benchmark = benchmark_import(path=SAMPLE, name="sample").benchmark
    out = tmp_path / "pairs.jsonl"
    argv = [sys.executable, "manage.py", "evaluate_rm", "--benchmark", "sample", "--model", str(models["scalar"]),
            "--kind", "scalar", "--setting", "profile", "--out", str(out)]
    proc = subprocess.run(argv, cwd=BASE_DIR, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    n = benchmark.items.count()
    assert summary["n"] == n == len(out.read_text().splitlines())
    assert f"{n}/{n}" in proc.stderr  # tqdm's last state: the bar was flushed too

    failed = subprocess.run(argv[:-2] + ["--limit", "0"], cwd=BASE_DIR, env=subprocess_env(), capture_output=True,
                            text=True, timeout=300)
    assert (failed.returncode, failed.stderr.strip()) == (1, "CommandError: --limit must be at least 1")
