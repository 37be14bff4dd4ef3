"""`import_benchmark --split` (issue 27, fault 6): a folder holding several splits imports one of them
(test by default) and says in one line what it left out, instead of merging them into one benchmark."""

import io
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from pipeline.formats import file_split
from pipeline.management.commands.import_benchmark import Command
from pipeline.models import Benchmark
from tests.pipeline.test_formats import make_row, write_jsonl

pytestmark = pytest.mark.django_db


def split_folder(root: Path, splits: dict[str, int]) -> Path:
    """One file per (split, n): 'part-<n>/<split>.jsonl', one row each, ids unique across files."""
    for split, files in splits.items():
        for n in range(files):
            (root / f"part-{n}").mkdir(parents=True, exist_ok=True)
            write_jsonl(root / f"part-{n}" / f"{split}.jsonl", [make_row(n, id=f"{split}-{n}")])
    return root


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("import_benchmark", *args, "-v", "0", stdout=out)
    return out.getvalue()


@pytest.mark.parametrize("path, split", [
    ("test-00000-of-00001.parquet", "test"), ("Lifestyle_and_Personal_Development/train.jsonl", "train"),
    ("validation/part-0.json", "val"), ("data/dev.jsonl", "val"), ("val_rows.jsonl", "val"),
    ("contest.jsonl", None), ("Society_and_Culture.jsonl", None), ("evaluation.jsonl", None),
])
def test_which_split_a_path_names(path, split):
    assert file_split(Path(path)) == split


def test_a_folder_of_8_test_and_8_train_files_imports_the_8_test_items_and_says_so(tmp_path):
    folder = split_folder(tmp_path / "mixed", {"test": 8, "train": 8})
    out = run(str(folder), "--name", "mixed")
    assert out.splitlines()[0] == ("note: mixed holds the splits test (8 files), train (8 files); imported the test "
                                   "split only (8 files); --split train|val imports another")
    assert Benchmark.objects.get(name="mixed").item_count == 8
    assert sorted(Benchmark.objects.get(name="mixed").items.values_list("source_id", flat=True))[:2] == [
        "test-0", "test-1"]
    out = run(str(folder), "--name", "mixed-train", "--split", "train")
    assert out.splitlines()[0].startswith("note: mixed holds the splits test (8 files), train (8 files); imported "
                                          "the train split only (8 files)")
    assert set(Benchmark.objects.get(name="mixed-train").items.values_list("source_id", flat=True)) == {
        f"train-{n}" for n in range(8)}


def test_a_split_no_file_names_is_refused_with_the_splits_there_are(tmp_path):
    folder = split_folder(tmp_path / "mixed", {"test": 2, "train": 1})
    with pytest.raises(CommandError) as exc:
        run(str(folder), "--name", "x", "--split", "val")
    assert str(exc.value) == f"{folder}: no data file names the split 'val' (the files name: test (2 files), train (1 file))"


def test_without_a_test_split_the_command_asks_for_one(tmp_path):
    folder = split_folder(tmp_path / "only-train", {"train": 2, "val": 1})
    with pytest.raises(CommandError) as exc:
        run(str(folder), "--name", "x")
    assert str(exc.value) == (f"{folder}: the files name the splits train (2 files), val (1 file) and none names test; "
                              "choose one with --split")
    assert not Benchmark.objects.exists()


def test_a_file_naming_no_split_beside_split_files_is_refused(tmp_path):
    folder = split_folder(tmp_path / "mixed", {"test": 1, "train": 1})
    write_jsonl(folder / "extra.jsonl", [make_row(99, id="extra")])
    with pytest.raises(CommandError) as exc:
        run(str(folder), "--name", "x")
    assert str(exc.value) == (f"{folder}: extra.jsonl names no split while other files do (test (1 file), train "
                              "(1 file)); name its split in its path, or move it out of the folder")


def test_a_folder_without_split_names_imports_every_file_without_a_note(tmp_path):
    (tmp_path / "plain").mkdir()
    write_jsonl(tmp_path / "plain" / "a.jsonl", [make_row(1)])
    write_jsonl(tmp_path / "plain" / "b.jsonl", [make_row(2)])
    assert run(str(tmp_path / "plain"), "--name", "plain").splitlines()[0].startswith("imported 2 items")


def test_personalrewardbench_rows_carry_their_own_split(tmp_path):
    from tests.pipeline.prb_data import prb_row

    folder = tmp_path / "prism_personalized_0125"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", [prb_row(1, 0, "train")])
    write_jsonl(folder / "test.jsonl", [prb_row(1, 1, "test")])  # read whole: the train file is history
    with pytest.raises(CommandError) as exc:
        run(str(folder), "--name", "x", "--split", "train")
    assert str(exc.value) == (f"{folder}: --split train: PersonalRewardBench rows carry their own split (test rows are "
                              "the items, train and val rows their history); only the test split can be imported")
    assert run(str(folder), "--name", "prism", "--split", "test").startswith("imported 1 items")


def test_the_help_names_every_format_and_split():
    text = " ".join(Command().create_parser("manage.py", "import_benchmark").format_help().split()).replace("- ", "-")
    for name in ("auto (detected", "personalized-rewardbench (Personalized-RewardBench", "personalrewardbench "
                 "(PersonalRewardBench", "--split {test,train,val}", "default: test"):
        assert name in text, name
