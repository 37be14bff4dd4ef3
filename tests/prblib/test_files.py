"""The one atomic-write helper and the one keyed on-disk store (prblib.files)."""

import json
import os

import numpy as np
import pytest

from prblib.files import KeyedFiles, atomic_path, atomic_write

KEY = "ab" + "0" * 62


def test_atomic_write_replaces_the_file_only_when_the_block_succeeds(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old", encoding="utf-8")
    with pytest.raises(RuntimeError):
        with atomic_write(target) as fh:
            fh.write("half")
            raise RuntimeError("writer failed")
    assert target.read_text(encoding="utf-8") == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]  # no temporary file left
    with atomic_write(target, newline="\n") as fh:
        fh.write("new é\n")
    assert target.read_bytes() == "new é\n".encode("utf-8")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_atomic_path_gives_a_hidden_name_beside_the_target_with_ordinary_permissions(tmp_path):
    target = tmp_path / "table.npy"
    with atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".table.") and tmp.name.endswith(".tmp.npy")
        np.save(tmp, np.arange(3))
        assert not target.exists()
    assert np.load(target).tolist() == [0, 1, 2]
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask
    with pytest.raises(ValueError, match="mode"):
        with atomic_write(target, "a"):
            pass


def test_keyed_files_read_back_what_was_written_and_miss_on_missing_or_bad_entries(tmp_path):
    bad = []
    store = KeyedFiles(tmp_path / "c", ".json", shard=True, on_bad=lambda path, why: bad.append((path.name, why)))
    assert store.path(KEY) == tmp_path / "c" / "ab" / f"{KEY}.json"
    assert store.read(KEY, json.load) is None and bad == []  # missing: a plain miss
    assert store.write(KEY, lambda fh: fh.write(b'{"x": 1}')) is True
    assert store.read(KEY, json.load) == {"x": 1}
    store.path(KEY).write_bytes(b'{"x": ')  # a torn entry (cannot happen through write)
    assert store.read(KEY, json.load) is None
    assert bad and bad[0][0] == f"{KEY}.json" and bad[0][1].startswith("unreadable")
    assert KeyedFiles(tmp_path, ".json").path(KEY) == tmp_path / f"{KEY}.json"
    with pytest.raises(ValueError, match="hex digest"):
        store.path("../etc/passwd")


def test_a_refused_write_is_reported_not_raised(tmp_path):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x", encoding="utf-8")  # the store's folder is a file: every write fails
    bad = []
    store = KeyedFiles(not_a_folder, ".npy", shard=True, on_bad=lambda path, why: bad.append(why))
    assert store.write(KEY, lambda fh: fh.write(b"x")) is False
    assert len(bad) == 1 and bad[0].startswith("cannot be written")
    assert store.read(KEY, lambda fh: fh.read()) is None
