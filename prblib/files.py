"""Writing files so that a reader never sees half of one, and the one on-disk keyed store.

- `atomic_path` / `atomic_write`: write to a temporary file beside the target and rename it
  into place (`os.replace`, atomic on POSIX and Windows within one file system), so a crash,
  a full disk or a concurrent writer leaves either the old file or the new one, never a
  mixture; on any error the temporary file is removed and the target is untouched.
- `KeyedFiles`: one file per key (a hex digest) under a folder, written with `atomic_path`;
  a missing or unreadable entry reads as None (the caller recomputes it and writes it again),
  a failed write is reported as False, never raised: a cache must not stop the work it speeds
  up. Used by the LLM answer cache (llm.CachedBackend) and the embedding cache (retrieval).

Plain Python, no Django. (diskcache was considered: it stores pickles in SQLite, which would
load pickled objects and orphan the existing JSON / .npy caches.)
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, TypeVar

T = TypeVar("T")


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A fresh temporary path in `path`'s folder (".<stem>.<random>.tmp<suffix>": hidden, and
    ending like the target, since some writers add a suffix they miss, as numpy.save does
    ".npy"), for any writer that wants a file name (pyarrow, numpy); it is renamed onto `path` when the block ends without
    an exception, and removed in every case where it was not. The folder must exist (OSError
    otherwise, from the writer). The new file gets the usual permissions (umask), unlike
    tempfile.mkstemp's 0600."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.{uuid.uuid4().hex[:12]}.tmp{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", *, encoding: str | None = "utf-8",
                 newline: str | None = None) -> Iterator[IO[Any]]:
    """`open(path, mode)` that replaces `path` only once the block has finished without error
    (see `atomic_path`). mode "w" (text, `encoding`, `newline`) or "wb" (bytes)."""
    if mode not in ("w", "wb"):
        raise ValueError("atomic_write opens files for writing only: mode 'w' or 'wb'")
    text = {"encoding": encoding, "newline": newline} if mode == "w" else {}
    with atomic_path(path) as tmp, open(tmp, mode, **text) as fh:
        yield fh


class KeyedFiles:
    """Files keyed by a hex digest under `folder`: `<folder>/<key><suffix>`, or with `shard`
    `<folder>/<key[:2]>/<key><suffix>` (256 sub-folders, for stores of millions of entries).

    `read(key, load)` returns `load(binary file)`, or None when the entry is missing or `load`
    raises OSError, ValueError, KeyError, TypeError or EOFError (unreadable entry: `on_bad`
    hears of it); `write(key, dump)` calls `dump(binary file)` inside `atomic_path` and returns
    False (`on_bad` hears of it) when the disk refuses. Safe for many threads and processes: an
    entry is always whole, and the last writer of a key wins.
    """

    def __init__(self, folder: str | os.PathLike, suffix: str, *, shard: bool = False,
                 on_bad: Callable[[Path, str], None] | None = None):
        self.folder = Path(folder)
        self.suffix = suffix
        self.shard = shard
        self.on_bad = on_bad

    def path(self, key: str) -> Path:
        if not key or not all(c in "0123456789abcdef" for c in key):
            raise ValueError(f"a key is a lower-case hex digest, not {key!r}")
        name = f"{key}{self.suffix}"
        return self.folder / key[:2] / name if self.shard else self.folder / name

    def read(self, key: str, load: Callable[[IO[bytes]], T]) -> T | None:
        path = self.path(key)
        try:
            with open(path, "rb") as fh:
                return load(fh)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, EOFError) as exc:
            self._bad(path, f"unreadable ({exc})")
            return None

    def write(self, key: str, dump: Callable[[IO[bytes]], None]) -> bool:
        path = self.path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_write(path, "wb") as fh:
                dump(fh)
        except OSError as exc:
            self._bad(path, f"cannot be written ({exc})")
            return False
        return True

    def _bad(self, path: Path, why: str) -> None:
        if self.on_bad is not None:
            self.on_bad(path, why)
