"""What one request may cost is bounded before the work starts (issue 33, fault 5 and part of 7):
a scores file is read in chunks within a line count the benchmark sets, refused attempts count
toward the hourly limit (checked before the upload is read), a model folder is walked one entry
at a time within MODEL_MAX_FILES and MODEL_CHECK_SECONDS, only regular files are ever opened,
links to folders are walked, no refusal names a server folder, and a rating's active time has
a maximum."""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from rest_framework.test import APIClient

from leaderboard import services
from leaderboard.models import Submission, SubmissionAttempt
from prblib import modelcheck
from prblib import rows
from prblib.errors import ModelError
from prblib.rewards.scores import parse_scores_file
from pipeline.services import benchmark_import
from tests.concurrency import race
from tests.factories import UserFactory
from tests.leaderboard.test_submissions import scores_upload
from prblib.tiny_models import build_decoder_rm
from tests.pipeline.test_formats import SAMPLE

FLOOD_BYTES = 20 << 20  # 20 MiB of line ends: the old reader split all of them into a list first


def api_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def sample(db):
    return benchmark_import(path=SAMPLE, name="sample").benchmark


@pytest.fixture(scope="module")
def built_rm(tmp_path_factory):
    return build_decoder_rm(tmp_path_factory.mktemp("costs") / "rm")


@pytest.fixture
def model_folder(built_rm, settings):
    """A fresh copy of a valid tiny RM under MODELS_ROOT; (folder, its name there)."""
    name = f"costs-{uuid.uuid4().hex[:8]}"
    folder = Path(shutil.copytree(built_rm, settings.MODELS_ROOT / name))
    yield folder, name
    shutil.rmtree(folder, ignore_errors=True)


def submit_folder(user, name):
    return api_for(user).post("/api/submissions/", {
        "display_name": f"rm {uuid.uuid4().hex[:6]}", "benchmark": "sample", "kind": "scalar",
        "settings": ["profile"], "model_path": name}, format="json")


class CountingOpen:
    """open() for rows.read_lines that counts the bytes read through it."""

    def __init__(self):
        self.read = 0

    def __call__(self, path, mode="r", *args, **kwargs):
        fh = open(path, mode, *args, **kwargs)
        counter, real_read = self, fh.read

        def read(size=-1):
            data = real_read(size)
            counter.read += len(data)
            return data

        fh.read = read
        return fh


# -- scores files: bounded by the benchmark, not by the file ------------------------------------------

@pytest.mark.parametrize("flood", [b"\n", b"\r", b"\r\n", b" \n", b"\t\r\n"], ids=repr)
def test_a_flood_of_blank_lines_is_refused_after_reading_a_few_kilobytes(tmp_path, monkeypatch, flood):
    path = tmp_path / "flood.jsonl"
    path.write_bytes(flood * (FLOOD_BYTES // len(flood)))
    opened = CountingOpen()
    monkeypatch.setattr(rows, "open", opened, raising=False)
    with pytest.raises(ModelError) as refused:
        parse_scores_file(path, expected_ids=[f"p{i}" for i in range(30)])
    assert str(refused.value) == ("scores file flood.jsonl, line 1061: more than 1,060 lines (blank lines count); "
                                  "the limit is 2 lines per pair of the benchmark (30 pairs) plus 1,000")
    assert opened.read <= 3 * (1 << 16)  # a chunk or two of the 20 MiB, never the whole file


def test_one_endless_line_is_refused_past_a_mebibyte(tmp_path, monkeypatch):
    path = tmp_path / "spaces.jsonl"
    path.write_bytes(b" " * FLOOD_BYTES)
    opened = CountingOpen()
    monkeypatch.setattr(rows, "open", opened, raising=False)
    with pytest.raises(ModelError) as refused:
        parse_scores_file(path, expected_ids=["a"])
    assert str(refused.value) == "scores file spaces.jsonl, line 1: the line is longer than 1,048,576 bytes"
    assert opened.read <= (1 << 20) + 2 * (1 << 16)


def test_a_file_at_the_line_limit_is_read_as_before(tmp_path):
    """Blank lines up to the limit are fine: each row then a blank line, and 1,000 more blank."""
    ids = [f"p{i}" for i in range(30)]
    body = "".join(f'{{"id": "{i}", "chosen_score": 1, "rejected_score": 0}}\r\n\r\n' for i in ids) + "\n" * 1000
    path = tmp_path / "spaced.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + body.encode())
    assert parse_scores_file(path, expected_ids=ids) == {i: (1.0, 0.0) for i in ids}
    path.write_bytes(body.encode() + b"\n")
    with pytest.raises(ModelError, match=r"line 1061: more than 1,060 lines"):
        parse_scores_file(path, expected_ids=ids)


@pytest.mark.django_db
def test_the_api_refuses_a_scores_file_of_newlines_with_a_400_naming_the_limit(researcher, sample):
    flood = SimpleUploadedFile("flood.jsonl", b"\n" * FLOOD_BYTES)
    response = api_for(researcher).post("/api/submissions/", {
        "display_name": "flood", "benchmark": "sample", "kind": "scores", "settings": ["profile"],
        "scores_file": flood}, format="multipart")
    assert response.status_code == 400
    assert response.json() == {
        "detail": "scores file flood.jsonl, line 1061: more than 1,060 lines (blank lines count); the limit is "
                  "2 lines per pair of the benchmark (30 pairs) plus 1,000",
        "scores_file": ["scores file flood.jsonl, line 1061: more than 1,060 lines (blank lines count); the limit "
                        "is 2 lines per pair of the benchmark (30 pairs) plus 1,000"]}
    assert Submission.objects.count() == 0


# -- refused attempts count toward the hourly limit ------------------------------------------------

LIMIT_MESSAGE = ("You reached the limit of 5 submission attempts per hour (SUBMISSIONS_PER_HOUR; refused ones "
                 "count too); try again later.")


@pytest.mark.django_db
def test_refused_uploads_count_and_the_sixth_attempt_is_a_429_before_its_upload_is_read(
        researcher, sample, settings, monkeypatch):
    settings.SUBMISSIONS_PER_HOUR = 5
    settings.MAX_UPLOAD_BYTES = 64 * 1024
    client = api_for(researcher)

    def post(upload):
        return client.post("/api/submissions/", {
            "display_name": "x", "benchmark": "sample", "kind": "scores", "settings": ["profile"],
            "scores_file": upload}, format="multipart")

    for _ in range(3):  # unreadable scores
        response = post(SimpleUploadedFile("bad.jsonl", b"not json\n"))
        assert response.status_code == 400 and response.json()["detail"].startswith("scores file bad.jsonl, line 1: ")
    response = post(SimpleUploadedFile("flood.jsonl", b"\n" * 60_000))
    assert response.status_code == 400 and "more than 1,060 lines" in response.json()["detail"]
    response = post(SimpleUploadedFile("huge.jsonl", b"\n" * (128 * 1024)))  # over MAX_UPLOAD_MB
    assert response.status_code == 413
    assert SubmissionAttempt.objects.filter(owner=researcher).count() == 5 and Submission.objects.count() == 0

    def never(*args, **kwargs):
        raise AssertionError("the upload was read")

    monkeypatch.setattr("leaderboard.services.submissions.parse_scores_file", never)
    response = post(scores_upload(sample))
    assert response.status_code == 429
    assert response.json() == {"detail": LIMIT_MESSAGE}
    assert SubmissionAttempt.objects.filter(owner=researcher).count() == 5  # a 429 is not counted again
    other = UserFactory(roles=["researcher"])  # the limit is per researcher
    monkeypatch.undo()
    assert api_for(other).post("/api/submissions/", {
        "display_name": "x", "benchmark": "sample", "kind": "scores", "settings": ["profile"],
        "scores_file": scores_upload(sample)}, format="multipart").status_code == 201


@pytest.mark.django_db
def test_the_form_answers_429_once_refused_attempts_reach_the_limit(researcher, sample, settings):
    settings.SUBMISSIONS_PER_HOUR = 5
    client = Client()
    client.force_login(researcher)
    fields = {"display_name": "x", "benchmark": "sample", "kind": "scores", "settings": ["profile"],
              "dtype": "auto", "max_length": 4096, "batch_size": 8, "profile_k": 10}
    for _ in range(5):
        page = client.post("/submit/", {**fields, "scores_file": SimpleUploadedFile("bad.jsonl", b"[]\n")})
        assert page.status_code == 200 and b"scores file bad.jsonl, line 1" in page.content
    page = client.post("/submit/", {**fields, "scores_file": scores_upload(sample)})
    assert page.status_code == 429
    assert LIMIT_MESSAGE.encode() in page.content.replace(b"&#x27;", b"'")
    assert Submission.objects.count() == 0


@pytest.mark.django_db
def test_a_made_submission_counts_once(researcher, sample, settings):
    settings.SUBMISSIONS_PER_HOUR = 2
    ids = list(sample.items.values_list("source_id", flat=True))
    for i in range(2):
        services.submission_create(user=researcher, request=services.SubmissionRequest(
            display_name=f"m{i}", benchmark="sample", kind="scores", settings=("profile",),
            scores_file=scores_upload(sample, wrong={ids[i]})))
    assert SubmissionAttempt.objects.count() == 0 and Submission.objects.count() == 2
    with pytest.raises(services.SubmissionRefused) as refused:
        services.submission_create(user=researcher, request=services.SubmissionRequest(
            display_name="m3", benchmark="sample", kind="scores", settings=("profile",),
            scores_file=scores_upload(sample)))
    assert refused.value.status == 429 and "limit of 2 submission attempts per hour" in str(refused.value)


@pytest.mark.django_db(transaction=True)
def test_a_burst_of_refused_uploads_gets_only_as_far_as_the_limit_allows(require_postgres, settings, monkeypatch):
    """Eight concurrent refused uploads by one researcher with a limit of 3: three are read and
    refused, five are 429s answered before their file is touched."""
    from django.db import connection as main_connection

    settings.SUBMISSIONS_PER_HOUR = 3
    benchmark_import(path=SAMPLE, name="sample")
    user = UserFactory(roles=["researcher"])
    parsed = []
    real_parse = parse_scores_file

    def counting_parse(*args, **kwargs):
        parsed.append(1)
        return real_parse(*args, **kwargs)

    monkeypatch.setattr("leaderboard.services.submissions.parse_scores_file", counting_parse)

    outcomes = race(8, lambda i: services.submission_create(user=user, request=services.SubmissionRequest(
        display_name=f"m{i}", benchmark="sample", kind="scores", settings=("profile",),
        scores_file=SimpleUploadedFile(f"s{i}.jsonl", b"\n" * 60_000))), timeout=60)
    main_connection.close()
    assert all(isinstance(o, services.SubmissionRefused) for o in outcomes), outcomes
    assert sorted(o.status for o in outcomes) == [400] * 3 + [429] * 5
    assert len(parsed) == 3 and SubmissionAttempt.objects.filter(owner=user).count() == 3


# -- model folders: bounded walks, only regular files opened ---------------------------------------

@pytest.mark.django_db
@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["chat_template.json", "tokenizer_config.json", "config.json",
                                  "model.safetensors", "deep/er/notes.txt"])
def test_a_fifo_anywhere_in_the_folder_is_refused_at_once_never_opened(researcher, sample, model_folder, name):
    folder, shown = model_folder
    fifo = folder / name
    fifo.parent.mkdir(parents=True, exist_ok=True)
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)  # opening it for reading would wait for a writer forever
    response = submit_folder(researcher, shown)
    assert response.status_code == 400
    assert response.json()["model_path"] == [f"{name} in the model folder is a FIFO (named pipe), not a regular "
                                             "file or folder"]


@pytest.mark.timeout(60)
def test_each_open_refuses_a_fifo_swapped_in_after_the_walk(built_rm, tmp_path):
    """The readers behind the walk open without waiting and check the open file, so a FIFO put in
    place after the walk is refused, not waited on."""
    folder = Path(shutil.copytree(built_rm, tmp_path / "rm"))
    (folder / "chat_template.json").unlink(missing_ok=True)
    os.mkfifo(folder / "chat_template.json")
    with pytest.raises(ModelError) as refused:
        modelcheck._check_chat_template(folder)
    assert str(refused.value) == "chat_template.json in the model folder is a FIFO (named pipe), not a regular file"
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")
    with pytest.raises(ModelError, match=r"^config.json in the model folder is a FIFO"):
        modelcheck.weights_digest(folder, [folder / "model.safetensors"])


@pytest.mark.timeout(60)
def test_a_socket_and_a_link_to_a_device_are_refused(built_rm, tmp_path, monkeypatch):
    folder = Path(shutil.copytree(built_rm, tmp_path / "rm"))
    monkeypatch.chdir(folder)  # a short relative name: socket paths are limited to ~100 bytes
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind("tokenizer.sock")
    try:
        with pytest.raises(ModelError) as refused:
            modelcheck.check_model_folder(folder, models_root=tmp_path)
        assert str(refused.value) == "tokenizer.sock in the model folder is a socket, not a regular file or folder"
    finally:
        server.close()
        os.unlink(folder / "tokenizer.sock")
    (folder / "null").symlink_to("/dev/null")  # inside the root "/" it resolves into
    with pytest.raises(ModelError) as refused:
        modelcheck.ensure_inside_root(folder, Path("/"))
    assert str(refused.value) == "null in the model folder links to a device, not a regular file or folder"


@pytest.mark.django_db
def test_a_folder_past_model_max_files_is_refused_after_reading_one_entry_more(
        researcher, sample, model_folder, settings, monkeypatch):
    folder, name = model_folder
    settings.MODEL_MAX_FILES = 40
    (folder / "many").mkdir()
    for i in range(200):
        (folder / "many" / f"f{i:03}").touch()
    listed = []
    real_scandir = os.scandir

    class CountingScandir:
        def __init__(self, path):
            self.inner = real_scandir(path)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.inner.close()

        def __iter__(self):
            for entry in self.inner:
                listed.append(entry.name)
                yield entry

    monkeypatch.setattr(modelcheck.os, "scandir", CountingScandir)
    response = submit_folder(researcher, name)
    monkeypatch.undo()
    assert response.status_code == 400
    assert response.json()["model_path"] == [
        "the model folder has more than 40 entries (files and folders at any depth; the limit is MODEL_MAX_FILES)"]
    assert len(listed) == 41  # the walk stopped at the first entry past the limit
    settings.MODEL_MAX_FILES = 300
    assert submit_folder(researcher, name).status_code == 201


def test_a_slow_listing_is_refused_past_model_check_seconds(built_rm, tmp_path, monkeypatch):
    folder = Path(shutil.copytree(built_rm, tmp_path / "rm"))

    class Clock:  # each look at the clock is a second later
        now = 0.0

        def monotonic(self):
            self.now += 1.0
            return self.now

    monkeypatch.setattr(modelcheck, "time", Clock())
    with pytest.raises(ModelError) as refused:
        modelcheck.ensure_inside_root(folder, tmp_path, limits=modelcheck.FolderLimits(max_seconds=3))
    assert str(refused.value).startswith("listing the model folder took longer than 3 s (the limit is "
                                         "MODEL_CHECK_SECONDS; stopped at ")


# -- links to folders are walked ---------------------------------------------------------------------

@pytest.mark.django_db
def test_a_linked_sub_folder_is_walked_so_links_inside_it_are_checked_too(researcher, sample, model_folder,
                                                                         settings, tmp_path):
    folder, name = model_folder
    shared = settings.MODELS_ROOT / f"shared-{uuid.uuid4().hex[:8]}"
    shared.mkdir()
    (shared / "readme.txt").write_text("fine")
    (folder / "extra").symlink_to(shared, target_is_directory=True)
    (folder / "loop").symlink_to(".", target_is_directory=True)  # a loop ends: each real folder once
    assert submit_folder(researcher, name).status_code == 201
    secret = tmp_path / "worker-secret.json"
    secret.write_text("{}")
    (shared / "secret.json").symlink_to(secret)
    response = submit_folder(researcher, name)
    assert response.status_code == 400
    assert response.json()["model_path"] == [
        "extra/secret.json in the model folder points outside the models folder (links must stay inside it)"]
    (shared / "secret.json").unlink()
    os.mkfifo(shared / "pipe")
    assert submit_folder(researcher, name).json()["model_path"] == [
        "extra/pipe in the model folder is a FIFO (named pipe), not a regular file or folder"]
    shutil.rmtree(shared)


# -- no server folders in what researchers read --------------------------------------------------------

@pytest.mark.django_db
def test_model_folder_refusals_never_show_the_models_root(researcher, sample, model_folder, settings):
    folder, name = model_folder
    root = str(settings.MODELS_ROOT)
    client = api_for(researcher)
    cases = {"": "Give the model folder, relative to the models folder.",
             "no-such-rm": "model folder no-such-rm does not exist or is not a folder",
             "../outside": "model folder ../outside is outside the models folder"}
    for given, message in cases.items():
        response = client.post("/api/submissions/", {
            "display_name": "x", "benchmark": "sample", "kind": "scalar", "settings": ["profile"],
            "model_path": given}, format="json")
        assert response.status_code == 400 and response.json()["model_path"] == [message]
        assert root not in response.content.decode()
    page_client = Client()
    page_client.force_login(researcher)
    page = page_client.post("/submit/", {"display_name": "x", "benchmark": "sample", "kind": "scalar",
                                         "settings": ["profile"], "model_path": "no-such-rm", "dtype": "auto",
                                         "max_length": 4096, "batch_size": 8, "profile_k": 10})
    assert b"model folder no-such-rm does not exist or is not a folder" in page.content
    assert root.encode() not in page.content


# -- active seconds of a rating -----------------------------------------------------------------------

@pytest.mark.django_db
@pytest.mark.parametrize("seconds, status, detail", [
    (1e9, 400, "seconds must be a number from 0 to 14400 (4 hours of active time): must be at most 14400."),
    (14400.5, 400, "seconds must be a number from 0 to 14400 (4 hours of active time): must be at most 14400."),
    (14400, 201, None),
])
def test_a_rating_records_at_most_four_hours_of_active_time(sample, staff_user, annotator, seconds, status, detail):
    from annotation.models import Rating
    from annotation.services.campaigns import campaign_create

    campaign = campaign_create(user=staff_user, benchmark="sample", guidelines="g", overlap=1)
    client = api_for(annotator)
    token = client.get(f"/api/annotation/next/?campaign={campaign.pk}").json()["assignment"]
    full = {"factuality": 4, "relevance": 5, "helpfulness": 4, "personal_rubrics": 5}
    response = client.post("/api/annotation/ratings/", {"assignment": token, "ratings": {"1": full, "2": full},
                                                        "seconds": seconds}, format="json")
    assert response.status_code == status
    if detail:
        assert response.json() == {"detail": detail, "field": "seconds"}
        assert not Rating.objects.exists()
    else:
        assert Rating.objects.get().seconds == 14400
