"""P-GenRM as a submission: prototypes from a pair-history benchmark, m and n as options, the
(m, n) accuracy grid and the judge's token cost on the submission page."""

import json

import pytest
from django.core.management import call_command

from leaderboard import services
from pipeline.models import LLMEndpoint
from tests.prblib.test_pgenrm import block, chain_text, user_message
from tests.pipeline.test_formats import write_jsonl
from tests.pipeline.test_pair_history import history_row

pytestmark = pytest.mark.django_db


def judge(body: dict) -> str:
    """Scores whichever slot holds the garden answer (the chosen one) higher."""
    chosen_is_a = "botanical" in block(user_message(body), "Answer A")
    return chain_text((9, 8), (3, 4)) if chosen_is_a else chain_text((3, 4), (9, 8))


def test_a_pgenrm_submission_reports_accuracy_for_every_m_and_n(client, researcher, fake_openai, tmp_path):
    rows = [history_row(i) for i in range(6)]
    call_command("import_benchmark", str(write_jsonl(tmp_path / "prism.jsonl", rows)), "--name", "prism-like")
    call_command("build_prototypes", "--benchmark", "prism-like", "--out", "protos/prism.json", "--k", "2",
                 stdout=open(tmp_path / "out.txt", "w"))
    assert json.loads((tmp_path / "out.txt").read_text())["users"] == 3
    fake_openai.responder = judge
    LLMEndpoint.objects.create(name="judge", base_url=fake_openai.base_url, max_retries=1)
    submission = services.submission_create(user=researcher, request=services.SubmissionRequest(
        display_name="P-GenRM", benchmark="prism-like", kind="pgenrm", settings=("profile",), judge_backend="judge",
        model_path="chain-model", options={"m": 2, "n": 1, "prototypes": "protos/prism.json"}))
    run = submission.runs.get()
    assert services.run_execute(run_id=run.pk) == "SUCCEEDED", run.error
    run.refresh_from_db()
    assert run.metrics["accuracy"] == 1.0
    grid = {(p["m"], p["n"]): p["accuracy"] for p in run.metrics["scaling"]}
    assert set(grid) == {(1, 0), (2, 0), (1, 1), (2, 1)} and grid[(2, 1)] == 1.0
    assert run.metrics["usage"]["requests"] == len(fake_openai.requests) > 0
    client.force_login(researcher)
    html = client.get(f"/submissions/{submission.pk}/").content.decode()
    assert 'id="scaling-chart"' in html and "Judge cost" in html
    # Strict accuracy (the leaderboard's) beside the authors' two counting rules, labelled as such.
    assert run.metrics["authors_accounting"]["strict"]["accuracy"] == 1.0
    assert "as the authors count it" in html and "authors' baseline rule" in html


@pytest.mark.parametrize("options,field", [
    ({"m": 0}, "m"), ({"n": 1}, "prototypes"), ({"n": 1, "prototypes": "../../etc/passwd"}, "prototypes"),
    # The paper preset asks for 8 neighbours, so it needs a prototypes file too; any given file stays in DATA_ROOT.
    ({"preset": "paper"}, "prototypes"), ({"prototypes": "../../etc/passwd"}, "prototypes"),
    ({"chain_format": "xml"}, "chain_format"), ({"template_file": "/etc/passwd"}, "template_file")])
def test_pgenrm_options_are_checked_before_queueing(researcher, fake_openai, tmp_path, options, field):
    call_command("import_benchmark", str(write_jsonl(tmp_path / "p.jsonl", [history_row(0)])), "--name", "p")
    LLMEndpoint.objects.create(name="judge", base_url=fake_openai.base_url)
    with pytest.raises(services.SubmissionRefused) as info:
        services.submission_create(user=researcher, request=services.SubmissionRequest(
            display_name="x", benchmark="p", kind="pgenrm", settings=("profile",), judge_backend="judge",
            model_path="m", options=options))
    assert info.value.field == field
