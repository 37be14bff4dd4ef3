"""Which of two submissions of the same model folder by one owner keeps the result: the one
submitted first (created_at, then id), whatever order their runs reach the workers
(leaderboard.identity). Another owner's copy is never a duplicate: both are evaluated."""

import hashlib
import shutil
from datetime import timedelta

import pytest

from leaderboard import identity, services
from leaderboard.models import EvaluationRun, RunStatus, Submission
from pipeline.services import benchmark_import
from tests.factories import UserFactory
from prblib.tiny_models import build_decoder_rm
from tests.pipeline.test_formats import SAMPLE

pytestmark = pytest.mark.django_db


@pytest.fixture
def sample():
    return benchmark_import(path=SAMPLE, name="sample").benchmark


@pytest.fixture
def models_root(settings, tmp_path):
    """A models folder of this test's own, holding "alice-rm" and "bob-rm", a byte-for-byte copy of it."""
    root = (tmp_path / "models").resolve()
    root.mkdir()
    settings.MODELS_ROOT = root
    build_decoder_rm(root / "alice-rm")
    shutil.copytree(root / "alice-rm", root / "bob-rm")
    return root


def submit(user, folder, display_name="rm") -> Submission:
    return services.submission_create(user=user, request=services.SubmissionRequest(
        display_name=display_name, benchmark="sample", kind="scalar", settings=("no_profile",), model_path=folder))


def run_of(submission) -> EvaluationRun:
    return EvaluationRun.objects.select_related("submission__benchmark").get(submission=submission)


def expected_fingerprint(folder, benchmark, owner) -> str:
    """sha256(weights | kind | benchmark | owner | configuration): the weights hash computed here
    from the files' bytes; the configuration (options after defaults, tokenizer and chat template
    hashes) as pipeline.manifest.configuration gives it."""
    from pipeline.services import configuration, configuration_sha256

    weights = hashlib.sha256(folder.joinpath("model.safetensors").read_bytes()
                             + folder.joinpath("config.json").read_bytes()).hexdigest()
    config = configuration(kind="scalar", options={}, dtype="auto", max_length=4096, profile_k=10, folder=folder)
    return hashlib.sha256(f"{weights}|scalar|{benchmark.content_hash}|owner:{owner.pk}|"
                          f"config:{configuration_sha256(config)}".encode()).hexdigest()


def test_a_copy_by_another_researcher_is_evaluated_too_and_names_no_private_submission(
        researcher, sample, models_root, client):
    """Issue 28, fault 7: whoever submitted the weights first used to own the result, the later
    owner's run failing as a duplicate (which also confirmed what a competitor evaluates)."""
    alice, bob = researcher, UserFactory(roles=["researcher"])
    alices = submit(alice, "alice-rm")
    bobs = submit(bob, "bob-rm")

    identity.run_identify(run_of(bobs))
    identity.run_identify(run_of(alices))
    bob_run, alice_run = run_of(bobs), run_of(alices)
    assert (bob_run.status, bob_run.error, alice_run.status, alice_run.error) == (
        RunStatus.QUEUED, "", RunStatus.QUEUED, "")
    assert alice_run.fingerprint == expected_fingerprint(models_root / "alice-rm", sample, alice)
    assert bob_run.fingerprint == expected_fingerprint(models_root / "bob-rm", sample, bob)
    assert alice_run.fingerprint != bob_run.fingerprint
    bobs.refresh_from_db()
    alices.refresh_from_db()
    assert bobs.weights_hash == alices.weights_hash  # the same weights, two results

    client.force_login(bob)
    page = client.get(f"/submissions/{bobs.pk}/").content.decode()
    assert f"/submissions/{alices.pk}/" not in page and "same weights as" not in page  # Alice's is private
    services.submission_publish(user=alice, submission=alices)
    page = client.get(f"/submissions/{bobs.pk}/").content.decode()
    assert f'same weights as <a href="/submissions/{alices.pk}/">submission {alices.pk}</a>' in page


def test_a_later_copy_by_the_same_owner_fails_with_a_link_to_the_earlier_submission(researcher, sample, models_root):
    first = submit(researcher, "alice-rm", display_name="first")
    second = submit(researcher, "bob-rm", display_name="second")

    assert services.run_execute(run_id=run_of(second).pk) == RunStatus.FAILED
    assert run_of(second).error == (f"This model was already evaluated on sample in the \"Without profile\" setting "
                                    f"(submission #{first.pk}, queued): see /submissions/{first.pk}/")
    identity.run_identify(run_of(first))
    first_run = run_of(first)
    assert first_run.status == RunStatus.QUEUED
    assert first_run.fingerprint == expected_fingerprint(models_root / "alice-rm", sample, researcher)


def test_an_earlier_submission_whose_folder_is_refused_now_is_skipped_and_the_later_run_proceeds(
        researcher, sample, models_root):
    shutil.copytree(models_root / "alice-rm", models_root / "carol-rm")
    alices = submit(researcher, "alice-rm", display_name="alice")
    bobs = submit(researcher, "bob-rm", display_name="bob")
    carols = submit(researcher, "carol-rm", display_name="carol")  # the owner's third copy
    (models_root / "alice-rm" / "model.safetensors").unlink()

    # Alice's folder is skipped; the next earlier copy (Bob's) is the one Carol's run duplicates.
    assert services.run_execute(run_id=run_of(carols).pk) == RunStatus.FAILED
    assert run_of(carols).error == (f"This model was already evaluated on sample in the \"Without profile\" "
                                    f"setting (submission #{bobs.pk}, queued): see /submissions/{bobs.pk}/")
    identity.run_identify(run_of(bobs))
    assert run_of(bobs).status == RunStatus.QUEUED
    assert run_of(bobs).fingerprint == expected_fingerprint(models_root / "bob-rm", sample, researcher)
    alices.refresh_from_db()
    assert alices.weights_hash == ""  # nothing stored for a folder refused now
    # Alice's own run fails on her folder when it reaches a worker.
    assert services.run_execute(run_id=run_of(alices).pk) == RunStatus.FAILED
    assert "safetensors" in run_of(alices).error and run_of(alices).fingerprint == f"pending:{alices.pk}"


def test_only_submissions_created_before_the_run_are_compared_never_later_ones(researcher, sample, models_root):
    build_decoder_rm(models_root / "other-rm", seed=1)  # other weights
    other = submit(researcher, "other-rm", display_name="other")
    alices = submit(researcher, "alice-rm")
    bobs = submit(researcher, "bob-rm", display_name="bob")  # a later copy of the same owner's

    identity.run_identify(run_of(alices))
    assert run_of(alices).status == RunStatus.QUEUED
    assert run_of(alices).fingerprint == expected_fingerprint(models_root / "alice-rm", sample, researcher)
    other.refresh_from_db()
    bobs.refresh_from_db()
    assert len(other.weights_hash) == 64  # the earlier one was looked at (and differs) ...
    assert bobs.weights_hash == ""  # ... the later one never
    assert services.run_execute(run_id=run_of(bobs).pk) == RunStatus.FAILED
    assert run_of(bobs).error.startswith(f"This model was already evaluated on sample in the \"Without profile\" "
                                         f"setting (submission #{alices.pk}")


def test_the_earlier_submission_is_the_one_created_first_even_with_a_higher_id(researcher, sample, models_root):
    first = submit(researcher, "alice-rm", display_name="first")
    second = submit(researcher, "bob-rm", display_name="second")
    Submission.objects.filter(pk=second.pk).update(created_at=first.created_at - timedelta(minutes=1))

    assert services.run_execute(run_id=run_of(first).pk) == RunStatus.FAILED
    assert run_of(first).error == (f"This model was already evaluated on sample in the \"Without profile\" setting "
                                   f"(submission #{second.pk}, queued): see /submissions/{second.pk}/")


def test_submissions_created_at_the_same_moment_are_ordered_by_id(researcher, sample, models_root):
    first = submit(researcher, "alice-rm", display_name="first")
    second = submit(researcher, "bob-rm", display_name="second")
    Submission.objects.filter(pk=second.pk).update(created_at=first.created_at)

    assert services.run_execute(run_id=run_of(second).pk) == RunStatus.FAILED
    assert run_of(second).error == (f"This model was already evaluated on sample in the \"Without profile\" setting "
                                    f"(submission #{first.pk}, queued): see /submissions/{first.pk}/")
    identity.run_identify(run_of(first))
    assert run_of(first).status == RunStatus.QUEUED


def test_with_two_earlier_copies_pending_the_earliest_is_named(researcher, sample, models_root):
    shutil.copytree(models_root / "alice-rm", models_root / "carol-rm")
    first = submit(researcher, "alice-rm", display_name="first")
    submit(researcher, "bob-rm", display_name="second")
    third = submit(researcher, "carol-rm", display_name="third")

    assert services.run_execute(run_id=run_of(third).pk) == RunStatus.FAILED
    assert run_of(third).error == (f"This model was already evaluated on sample in the \"Without profile\" setting "
                                   f"(submission #{first.pk}, queued): see /submissions/{first.pk}/")


def test_the_earlier_run_identified_by_its_own_worker_at_the_same_moment_still_wins(
        researcher, sample, models_root, monkeypatch):
    """Alice's run takes its real fingerprint after Bob's run looked for live results and before
    it looks for pending ones: the unique constraint stops Bob's run, with the usual reason."""
    alices = submit(researcher, "alice-rm", display_name="alice")
    bobs = submit(researcher, "bob-rm")
    look = identity._earlier_pending_duplicate
    raced = []

    def alice_identified_meanwhile(run, fingerprint):
        if not raced:
            raced.append(True)
            identity.run_identify(run_of(alices))
        return look(run, fingerprint)

    monkeypatch.setattr(identity, "_earlier_pending_duplicate", alice_identified_meanwhile)
    assert services.run_execute(run_id=run_of(bobs).pk) == RunStatus.FAILED
    assert run_of(bobs).error == (f"This model was already evaluated on sample in the \"Without profile\" setting "
                                  f"(submission #{alices.pk}, queued): see /submissions/{alices.pk}/")
    assert run_of(alices).status == RunStatus.QUEUED
    assert run_of(alices).fingerprint == expected_fingerprint(models_root / "alice-rm", sample, researcher)


def test_an_earlier_folder_made_to_break_the_reader_never_fails_a_later_run(researcher, sample, models_root):
    """Mallory submits first, then rewrites her config.json nested past the JSON parser's depth:
    Alice's run, which looks at Mallory's pending submission, must not fail on it."""
    mallory = submit(researcher, "bob-rm", display_name="mallory")  # (another owner's is never even looked at)
    build_decoder_rm(models_root / "carol-rm", seed=7)  # other weights
    alices = submit(researcher, "carol-rm", display_name="alice")
    (models_root / "bob-rm" / "config.json").write_text("[" * 200_000 + "]" * 200_000)

    identity.run_identify(run_of(alices))
    alice_run = run_of(alices)
    assert alice_run.status == RunStatus.QUEUED and alice_run.error == ""
    assert alice_run.fingerprint == expected_fingerprint(models_root / "carol-rm", sample, researcher)
    assert run_of(mallory).fingerprint == f"pending:{mallory.pk}"  # fails on its own worker, with a reason


def test_a_duplicate_reason_links_to_the_earlier_submission_and_escapes_the_rest():
    from leaderboard.templatetags.leaderboard_tags import link_submissions

    reason = 'Already evaluated (submission #7, queued): see /submissions/7/ <b>"x"</b>'
    assert link_submissions(reason) == ('Already evaluated (submission #7, queued): see '
                                        '<a href="/submissions/7/">/submissions/7/</a> '
                                        '&lt;b&gt;&quot;x&quot;&lt;/b&gt;')
    # Only the whole path as a word: nothing glued before or after it becomes part of a link.
    assert link_submissions("see /submissions/7/../admin/ or https://e.com/submissions/7/, /submissions/8/.") == (
        'see /submissions/7/../admin/ or https://e.com/submissions/7/, <a href="/submissions/8/">/submissions/8/</a>.')
