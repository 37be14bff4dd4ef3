"""An InternLM2 reward checkpoint: refused as submitted (custom code), converted by `manage.py convert_internlm2`,
then submitted, run and ranked as an ordinary scalar RM whose scores are the reference forward's."""

import io
import json

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from leaderboard import services
from leaderboard.models import PairScore, RunStatus
from pipeline.services import benchmark_import
from tests.prblib.test_convert_internlm2 import REWARD_TOKEN, build_internlm2_rm, reference_reward
from prblib.tiny_models import load_tokenizer
from tests.pipeline.test_formats import make_row, write_jsonl

pytestmark = pytest.mark.django_db


def test_a_converted_internlm2_reward_model_runs_as_a_scalar_submission(researcher, tmp_path, one_torch_thread):
    source = build_internlm2_rm(settings.MODELS_ROOT / "internlm2-1_8b-reward")
    rows = [make_row(i, chosen=f"Practise wet-on-wet washes {i} times a week.", rejected="Practise.") for i in range(4)]
    benchmark_import(path=write_jsonl(tmp_path / "small.jsonl", rows), name="small")

    def submit(model_path):
        return services.submission_create(user=researcher, request=services.SubmissionRequest(
            display_name=model_path, benchmark="small", kind="scalar", settings=("no_profile",),
            model_path=model_path))

    with pytest.raises(services.SubmissionRefused, match="auto_map"):
        submit("internlm2-1_8b-reward")
    out = io.StringIO()
    call_command("convert_internlm2", "internlm2-1_8b-reward", "internlm2-1_8b-reward-llama", stdout=out)
    printed = json.loads(out.getvalue().strip().splitlines()[-1])
    assert printed["folder"] == "internlm2-1_8b-reward-llama" and printed["reward_token"] == REWARD_TOKEN
    with pytest.raises(CommandError, match="already exists"):
        call_command("convert_internlm2", "internlm2-1_8b-reward", "internlm2-1_8b-reward-llama")

    run = submit("internlm2-1_8b-reward-llama").runs.get()
    assert services.run_execute(run_id=run.pk) == RunStatus.SUCCEEDED
    tokenizer = load_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": [REWARD_TOKEN]})
    worst = 0.0
    for score in PairScore.objects.filter(run=run).select_related("item"):
        item = score.item
        for value, answer in ((score.chosen_score, item.chosen), (score.rejected_score, item.rejected)):
            text = (f"[CLS]<|im_start|>user\n{item.question}<|im_end|>\n<|im_start|>assistant\n{answer}<|im_end|>\n"
                    f"{REWARD_TOKEN}")
            worst = max(worst, abs(value - reference_reward(source, tokenizer(text, add_special_tokens=False)
                                                            ["input_ids"])))
    print(f"converted InternLM2 submission: max |stored score - reference| = {worst:.3g}")
    assert worst < 1e-4
