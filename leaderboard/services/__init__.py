"""Leaderboard services, one module per concern:

- `submissions`: submitting a reward model (validation, one run per setting) and the owner's
  controls (publish, cancel, retry);
- `runs`: executing an evaluation run (score missing pairs, summarise);
- `imports`: downstream outcomes and other benchmarks' scores computed elsewhere;
- `outcomes`: the stored downstream outcomes, and the Best-of-N and PPO runs that record them.

Every run follows the job lifecycle of jobs/services.py (claimed by a conditional UPDATE,
heartbeat, progress, cancel, retry, stale sweep). Per-unit results are unique per run and
unit (PairScore per item, BestOfNSample per sample, PPOAnswer per held-out question), so a
retried, re-queued or redelivered run does only what is still missing.

The public names are re-exported here: `from leaderboard import services; services.X` and
`from leaderboard.services import X` both work.
"""

from pipeline.services import progress_chunk_size, rm_summarize

from ..models import EvaluationRun
from .imports import BenchmarkScoreRow, ImportRefused, OutcomeRow, external_scores_import, outcomes_import
from .outcomes import (RANDOM_BASELINE, bon_options, bon_run_create, bon_run_execute, bon_run_here, outcome_store,
                       ppo_options, ppo_run_create, ppo_run_execute, ppo_run_here, ppo_run_key)
from .runs import model_spec_for, run_execute, run_manifest
from .submissions import (AVAILABLE_KINDS, GENERATIVE_KINDS, HUB_ID, SETTING_NEEDS, SubmissionRefused,
                          SubmissionRequest, benchmark_settings, can_act, run_enqueue, submission_cancel,
                          submission_attempt_begin, submission_attempt_refused, submission_create,
                          submission_publish, submission_rate_check, submission_retry)

__all__ = [
    "run_manifest",
    "AVAILABLE_KINDS", "GENERATIVE_KINDS", "HUB_ID", "SETTING_NEEDS", "RANDOM_BASELINE",
    "BenchmarkScoreRow", "EvaluationRun", "ImportRefused", "OutcomeRow", "SubmissionRefused", "SubmissionRequest",
    "benchmark_settings", "bon_options", "bon_run_create", "bon_run_execute", "bon_run_here", "ppo_options",
    "ppo_run_create", "ppo_run_here", "ppo_run_key", "can_act", "external_scores_import", "model_spec_for",
    "outcome_store", "outcomes_import", "ppo_run_execute", "progress_chunk_size", "rm_summarize", "run_enqueue",
    "run_execute", "submission_attempt_begin", "submission_attempt_refused", "submission_cancel",
    "submission_create", "submission_publish", "submission_rate_check", "submission_retry",
]
