"""Manifests that rerun what they describe (issue 28, fault 8): resolved options and the hashes
of what else decides the scores, paths relative to MODELS_ROOT that `evaluate_rm` takes as
written, and `rerun`, whose per-pair scores equal the original's."""

import json
import os

import pytest
from django.core.management import CommandError, call_command

from pipeline.manifest import configuration, evaluation_manifest, folder_hashes
from prblib.modelcheck import check_model_folder, weights_digest
from pipeline.services import benchmark_import
from prblib.tiny_models import build_decoder_rm
from tests.pipeline.test_formats import SAMPLE

pytestmark = pytest.mark.django_db


@pytest.fixture
def root(settings, tmp_path):
    settings.MODELS_ROOT = (tmp_path / "models").resolve()
    settings.MODELS_ROOT.mkdir()
    build_decoder_rm(settings.MODELS_ROOT / "rm")
    benchmark_import(path=SAMPLE, name="sample")
    return settings.MODELS_ROOT


def evaluate(model, out, capsys, *extra):
    call_command("evaluate_rm", "--benchmark", "sample", "--model", model, "--kind", "scalar", "--setting", "profile",
                 "--limit", "6", "--out", str(out), "-v", "0", *extra)
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_evaluate_rm_takes_a_folder_relative_to_models_root_or_the_current_folder(root, tmp_path, capsys,
                                                                                  monkeypatch):
    by_root = evaluate("rm", tmp_path / "a.jsonl", capsys)
    monkeypatch.chdir(root.parent)  # the README's form: --model var/models/NAME from the project folder
    by_cwd = evaluate("models/rm", tmp_path / "b.jsonl", capsys)
    assert by_root["manifest"]["model"] == by_cwd["manifest"]["model"] == "rm"  # relative to MODELS_ROOT
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "b.jsonl").read_text()
    folder, _, weights = check_model_folder(root / "rm", models_root=root)
    assert by_root["manifest"]["weights_hash"] == weights_digest(folder, weights)  # the CLI records the weights too


def test_the_manifest_resolves_options_and_hashes_tokenizer_and_chat_template(root, tmp_path, capsys):
    m = evaluate("rm", tmp_path / "a.jsonl", capsys)["manifest"]
    assert m["resolved_options"]["protocol"] == "prbench" and m["options"] == {}
    import hashlib

    tokenizer_json = (root / "rm" / "tokenizer.json").read_bytes()
    assert m["tokenizer_sha256"] is not None and len(m["tokenizer_sha256"]) == 64
    # Another tokenizer.json is another tokenizer hash, so another configuration (another result).
    before = configuration(kind="scalar", options={}, dtype="auto", max_length=4096, profile_k=10, folder=root / "rm")
    (root / "rm" / "tokenizer.json").write_bytes(tokenizer_json.replace(b'"', b'"', 1) + b"\n")
    after = configuration(kind="scalar", options={}, dtype="auto", max_length=4096, profile_k=10, folder=root / "rm")
    assert before["tokenizer_sha256"] != after["tokenizer_sha256"]
    assert before["chat_template_sha256"] == after["chat_template_sha256"]
    assert hashlib.sha256(tokenizer_json).hexdigest() != after["tokenizer_sha256"]  # a digest over names and files
    assert folder_hashes(None) == {"tokenizer_sha256": None, "chat_template_sha256": None}


def test_pgenrm_options_are_recorded_resolved_with_the_prototypes_hash(settings, tmp_path):
    settings.DATA_ROOT = tmp_path
    (tmp_path / "protos.json").write_text('{"prototypes": []}\n')
    config = configuration(kind="pgenrm", options={"preset": "paper", "m": 2, "prototypes": "protos.json"},
                           dtype="auto", max_length=4096, profile_k=10)
    # m set explicitly wins over the paper preset's 16; n, temperature, max_tokens are the preset's.
    assert {k: config["options"][k] for k in ("m", "n", "temperature", "max_tokens")} == {
        "m": 2, "n": 8, "temperature": 1.0, "max_tokens": 8192}
    assert config["options"]["prototype_stage"] is None and config["options"]["chain_format"] == "native"
    import hashlib

    assert config["data_files"] == {"prototypes": {
        "path": "protos.json", "sha256": hashlib.sha256(b'{"prototypes": []}\n').hexdigest()}}


def test_the_worker_and_the_command_write_the_same_manifest_keys(root):
    from pipeline.models import Benchmark

    bench = Benchmark.objects.get(name="sample")
    worker = evaluation_manifest(kind="scalar", setting="profile", benchmark=bench, model="rm", weights_hash="w",
                                 device="cpu", dtype="auto", max_length=4096, batch_size=8, profile_k=10, options={},
                                 folder=root / "rm")
    assert {"weights_hash", "resolved_options", "tokenizer_sha256", "chat_template_sha256", "data_files", "model",
            "benchmark_content_hash", "judge_endpoint", "seed", "protocol"} <= set(worker)


def test_rerun_reproduces_the_per_pair_scores_and_refuses_other_weights(root, tmp_path, capsys):
    original = evaluate("rm", tmp_path / "original.jsonl", capsys)
    manifest_file = tmp_path / "manifest.json"
    manifest_file.write_text(json.dumps(original))  # evaluate_rm's summary holds the manifest
    call_command("rerun", str(manifest_file), "--out", str(tmp_path / "rerun.jsonl"), "-v", "0")
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    first = [json.loads(line) for line in (tmp_path / "original.jsonl").read_text().splitlines()]
    second = [json.loads(line) for line in (tmp_path / "rerun.jsonl").read_text().splitlines()]
    assert len(first) == 6 and first == second  # every pair's chosen and rejected score, equal
    assert again["accuracy"] == original["accuracy"]

    weights = root / "rm" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(CommandError, match="the weights of rm here are not the ones recorded"):
        call_command("rerun", str(manifest_file))
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "scalar"}')
    with pytest.raises(CommandError, match=r"bad.json: not an evaluation manifest \(missing setting, benchmark"):
        call_command("rerun", str(bad))
    assert os.path.exists(tmp_path / "rerun.jsonl")
