"""Every result carries what reproduces it: per-pair exports (CSV columns, a JSONL field per row),
downstream outcomes (computed or imported), the API and the pages."""

import csv
import io
import json

import pytest
from rest_framework.test import APIClient

from leaderboard import services
from leaderboard.models import DownstreamOutcome, ExternalBenchmarkScore
from pipeline.models import LLMEndpoint
from tests.leaderboard.test_submissions import sample  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db


@pytest.fixture
def judged_run(researcher, sample, fake_openai):  # noqa: F811
    fake_openai.responder = lambda body: "Answer A fits better.\nVerdict: A"
    LLMEndpoint.objects.create(name="judge", base_url=fake_openai.base_url, max_retries=0)
    submission = services.submission_create(user=researcher, request=services.SubmissionRequest(
        display_name="Always-A", benchmark="sample", kind="pairwise", settings=("profile",), judge_backend="judge",
        model_path="judge-model", options={"seed": 7, "both_orders": False}))
    run = submission.runs.get()
    assert services.run_execute(run_id=run.pk) == "SUCCEEDED", run.error
    run.refresh_from_db()
    return run


def check_identity(manifest: dict, run) -> None:
    submission = run.submission
    assert manifest["code_version"] and manifest["code_version"] == run.metrics["manifest"]["code_version"]
    assert manifest["weights_hash"] == submission.weights_hash and len(submission.weights_hash) == 64
    assert manifest["benchmark_content_hash"] == submission.benchmark.content_hash
    assert manifest["templates"] == {"judge": "pairwise-judge@v1"}
    assert manifest["options"] == {"seed": 7, "both_orders": False} and manifest["seed"] == 7


def test_per_pair_exports_carry_the_runs_manifest_on_every_row(client, researcher, judged_run):
    run = judged_run
    client.force_login(researcher)
    url = f"/submissions/{run.submission_id}/runs/{run.pk}/scores"
    text = b"".join(client.get(url + ".csv").streaming_content).decode()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 30 and list(rows[0])[:6] == ["id", "domain", "chosen_score", "rejected_score", "correct", "tie"]
    for row in rows:
        assert row["manifest_code_version"] == run.metrics["manifest"]["code_version"]
        assert row["manifest_weights_hash"] == run.submission.weights_hash
        assert row["manifest_benchmark_content_hash"] == run.submission.benchmark.content_hash
        assert json.loads(row["manifest_templates"]) == {"judge": "pairwise-judge@v1"}
        assert json.loads(row["manifest_options"]) == {"both_orders": False, "seed": 7}
        assert row["manifest_seed"] == "7"
        check_identity(json.loads(row["manifest"]), run)

    lines = b"".join(client.get(url + ".jsonl").streaming_content).decode().splitlines()
    assert len(lines) == 30
    for line in lines:
        check_identity(json.loads(line)["manifest"], run)

    api = APIClient()
    api.force_authenticate(researcher)
    lines = b"".join(api.get(f"/api/submissions/{run.submission_id}/scores/?run={run.pk}").streaming_content) \
        .decode().splitlines()
    check_identity(json.loads(lines[0])["manifest"], run)
    check_identity(api.get(f"/api/submissions/{run.submission_id}/").json()["runs"][0]["metrics"]["manifest"], run)


def test_imported_outcomes_and_scores_record_their_file_and_show_it(client, researcher, judged_run, tmp_path):
    submission = judged_run.submission
    path = tmp_path / "outcomes.jsonl"
    path.write_text(json.dumps({"submission": submission.pk, "kind": "best_of_n", "k": 4, "outcome": 1.25,
                                "n": 30}) + "\n")
    assert services.outcomes_import(path=path) == 1
    outcome = DownstreamOutcome.objects.get()
    assert outcome.manifest["import_file"] == "outcomes.jsonl" and len(outcome.manifest["import_sha256"]) == 64
    assert outcome.manifest["weights_hash"] == submission.weights_hash and outcome.manifest["code_version"]

    scores = tmp_path / "rewardbench.csv"
    scores.write_text(f"benchmark,submission,accuracy\nRewardBench,{submission.pk},71.5\n")
    services.external_scores_import(path=scores)
    external = ExternalBenchmarkScore.objects.get()
    assert external.manifest["import_file"] == "rewardbench.csv"
    assert external.manifest["weights_hash"] == submission.weights_hash

    api = APIClient()
    api.force_authenticate(researcher)
    [listed] = api.get(f"/api/submissions/{submission.pk}/").json()["outcomes"]
    assert (listed["k"], listed["outcome"]) == (4, 1.25) and listed["manifest"] == outcome.manifest
    client.force_login(researcher)
    html = client.get(f"/submissions/{submission.pk}/").content.decode()
    assert 'class="outcome-manifest"' in html and outcome.manifest["import_sha256"] in html


def test_a_public_manifest_names_only_the_libraries_that_change_a_figure():
    """Published manifests are public: they list the libraries a number depends on, never the
    server's web framework, task queue or HTTP client (issue 33, fault 7)."""
    from pipeline.manifest import environment

    assert sorted(environment()["libraries"]) == ["numpy", "safetensors", "scikit-learn", "scipy", "torch",
                                                  "transformers", "trl"]
