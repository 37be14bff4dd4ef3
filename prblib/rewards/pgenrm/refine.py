"""History-aware refinement of P-GenRM user prototypes (the paper's prototype optimisation), on torch.

Notation: d = embedding size; prototype a_k (unit vector, from K-means); a training sample is one of a
member user's preference pairs: query embedding q, chosen and rejected answer embeddings r+ and r-, and
the user's OTHER pairs as history events (h_i, r+_i, r-_i) (leave-one-out).

Per sample (prototype k of the user):
    o_i    = tanh(W_h [h_i ; r+_i - r-_i])                       history event encodings, (L, d)
    alpha  = softmax_i((o_i . a_k + rho * o_i . q) / sqrt(d))    attention over the user's history
    s      = sum_i alpha_i o_i                                   (zero vector without history)
    z      = a_k + lambda_q W_q q + lambda_s W_s s               the user's preference direction here
    delta  = z . r+ - z . r-
Loss of prototype k over its samples (all three terms are in the optimised loss):
    L_k = mean(softplus(-delta))                                 pairwise: -log sigmoid(delta)
        + lambda_centre * mean((a_k - mu_k)^2)                   cluster-centre regulariser, mu_k = mean
                                                                 of the members' user embeddings
        + lambda_smooth * mean((a_k - abar_k)^2)                 temporal smoothing, abar_k = exponential
                                                                 moving average of a_k (decay ema_decay),
                                                                 updated after every step
Each epoch takes one full-batch AdamW step per prototype (in prototype order), then renormalises a_k
to unit length. Defaults follow the authors' release (rho 0.5, lambda_q = lambda_s = 1, lambda_centre =
lambda_smooth = 1e-3, lr 1e-3, ema 0.98, 1 epoch); the release defines both regularisers but optimises
the pairwise term alone, which is the fault this module does not copy. Deterministic for a seed (CPU).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class RefineSettings:
    epochs: int = 1
    lr: float = 1e-3
    rho: float = 0.5
    lambda_q: float = 1.0
    lambda_s: float = 1.0
    lambda_centre: float = 1e-3
    lambda_smooth: float = 1e-3
    ema_decay: float = 0.98
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, int) or self.epochs < 1:
            raise ValueError(f"epochs must be a whole number >= 1, not {self.epochs!r}")
        for name in ("lr", "rho", "lambda_q", "lambda_s", "lambda_centre", "lambda_smooth"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, not {value!r}")
        if not 0 <= self.ema_decay < 1:
            raise ValueError(f"ema_decay must be in [0, 1), not {self.ema_decay!r}")


@dataclass(frozen=True)
class UserPairs:
    """One user's preference pairs as embeddings: queries, chosen and rejected answers, each (P, d)."""

    queries: np.ndarray
    chosen: np.ndarray
    rejected: np.ndarray


def refine(centroids: np.ndarray, labels: Sequence[int], user_embeddings: np.ndarray,
           pairs: Mapping[int, UserPairs], settings: RefineSettings = RefineSettings()
           ) -> tuple[np.ndarray, dict[str, Any]]:
    """Refined prototypes (k, d), unit rows, float32, and a log {"settings", "losses": per epoch
    [{"pairwise", "centre", "smooth"}] summed over prototypes, "samples"}.

    centroids: (k, d) initial prototypes; labels: each user's prototype (index by user row);
    user_embeddings: (users, d); pairs: {user row: UserPairs} (users without pairs only shape mu_k).
    ValueError when no user has a pair or the shapes disagree."""
    import torch
    import torch.nn.functional as F

    a0 = np.asarray(centroids, dtype=np.float32)
    users = np.asarray(user_embeddings, dtype=np.float32)
    labels = np.asarray(labels, dtype=np.int64)
    k, d = a0.shape
    if users.ndim != 2 or users.shape[1] != d or labels.shape != (users.shape[0],):
        raise ValueError(f"user embeddings {users.shape} and labels {labels.shape} do not fit prototypes {a0.shape}")
    samples = _samples(labels, pairs, d)
    if not any(samples.values()):
        raise ValueError("refinement needs preference pairs (a query with a chosen and a rejected answer), "
                         "and no user has one")

    torch.manual_seed(settings.seed)
    w_hist, w_q, w_s = torch.nn.Linear(2 * d, d), torch.nn.Linear(d, d), torch.nn.Linear(d, d)
    protos = torch.nn.Parameter(torch.from_numpy(a0.copy()))
    average = protos.detach().clone()  # abar: the moving average of each prototype
    centre = torch.stack([torch.from_numpy(users[labels == j].mean(axis=0)) if np.any(labels == j)
                          else torch.from_numpy(a0[j]) for j in range(k)])
    params = [protos, *w_hist.parameters(), *w_q.parameters(), *w_s.parameters()]
    optimiser = torch.optim.AdamW(params, lr=settings.lr)
    scale = math.sqrt(d)
    losses = []
    for _ in range(settings.epochs):
        totals = {"pairwise": 0.0, "centre": 0.0, "smooth": 0.0}
        for j in range(k):
            batch = samples.get(j)
            if not batch:
                continue
            q, pos, neg, hist, diff, mask = (torch.from_numpy(x) for x in batch)
            a = protos[j]
            events = torch.tanh(w_hist(torch.cat([hist, diff], dim=-1)))  # (B, L, d)
            logits = (events @ a + settings.rho * (events @ q.unsqueeze(-1)).squeeze(-1)) / scale
            # Padding gets a huge negative logit (not -inf: a user without history would give NaN) and
            # zero weight; without history the summary s is the zero vector.
            weights = torch.softmax(logits.masked_fill(~mask, -1e9), dim=-1) * mask
            summary = (weights.unsqueeze(-1) * events).sum(dim=1)
            z = a + settings.lambda_q * w_q(q) + settings.lambda_s * w_s(summary)
            delta = (z * pos).sum(-1) - (z * neg).sum(-1)
            pairwise = F.softplus(-delta).mean()
            centre_term = settings.lambda_centre * torch.mean((a - centre[j]) ** 2)
            smooth_term = settings.lambda_smooth * torch.mean((a - average[j]) ** 2)
            optimiser.zero_grad()
            (pairwise + centre_term + smooth_term).backward()
            optimiser.step()
            with torch.no_grad():
                protos[j] = F.normalize(protos[j], dim=0)
                average[j] = settings.ema_decay * average[j] + (1 - settings.ema_decay) * protos[j]
            totals["pairwise"] += pairwise.item()
            totals["centre"] += centre_term.item()
            totals["smooth"] += smooth_term.item()
        losses.append(totals)
    refined = F.normalize(protos.detach(), dim=1).numpy().astype(np.float32)
    return refined, {"settings": asdict(settings), "losses": losses,
                     "samples": sum(len(batch[0]) for batch in samples.values() if batch)}


def _samples(labels: np.ndarray, pairs: Mapping[int, UserPairs], d: int) -> dict[int, tuple[np.ndarray, ...]]:
    """{prototype: (q, r+, r-, history h, history r+ - r-, mask)} with histories padded to the longest."""
    rows: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]] = {}
    for user, user_pairs in sorted(pairs.items()):
        q = np.asarray(user_pairs.queries, dtype=np.float32).reshape(-1, d)
        pos = np.asarray(user_pairs.chosen, dtype=np.float32).reshape(-1, d)
        neg = np.asarray(user_pairs.rejected, dtype=np.float32).reshape(-1, d)
        if not (len(q) == len(pos) == len(neg)):
            raise ValueError(f"user row {user}: queries, chosen and rejected differ in number")
        for i in range(len(q)):
            others = [t for t in range(len(q)) if t != i]
            rows.setdefault(int(labels[user]), []).append((q[i], pos[i], neg[i], q[others], pos[others] - neg[others]))
    batches = {}
    for proto, entries in rows.items():
        width = max(1, max(len(h) for *_, h, _ in entries))
        hist = np.zeros((len(entries), width, d), dtype=np.float32)
        diff = np.zeros_like(hist)
        mask = np.zeros((len(entries), width), dtype=bool)
        for b, (*_, h, delta) in enumerate(entries):
            hist[b, :len(h)], diff[b, :len(h)], mask[b, :len(h)] = h, delta, True
        batches[proto] = (np.stack([e[0] for e in entries]), np.stack([e[1] for e in entries]),
                          np.stack([e[2] for e in entries]), hist, diff, mask)
    return batches
