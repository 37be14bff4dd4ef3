"""Prototype refinement: attention over member histories, pairwise loss, both regularisers in the loss."""

import numpy as np
import pytest

from prblib.rewards.pgenrm.refine import RefineSettings, UserPairs, refine

D = 8


def world(seed=0):
    """Two prototypes; users 0-2 prefer answers along +e0, users 3-5 along +e1; 3 pairs each."""
    rng = np.random.default_rng(seed)
    centroids = np.eye(2, D, dtype=np.float32)
    labels = np.array([0, 0, 0, 1, 1, 1])
    users = (centroids[labels] + 0.1 * rng.standard_normal((6, D))).astype(np.float32)
    pairs = {}
    for user in range(6):
        direction = centroids[labels[user]]
        queries = rng.standard_normal((3, D)).astype(np.float32)
        noise = rng.standard_normal((3, D)).astype(np.float32)
        pairs[user] = UserPairs(queries=queries, chosen=noise + direction, rejected=noise - direction)
    pairs[5] = UserPairs(queries=pairs[5].queries[:1], chosen=pairs[5].chosen[:1], rejected=pairs[5].rejected[:1])
    return centroids, labels, users, pairs


def run(**settings):
    centroids, labels, users, pairs = world()
    return refine(centroids, labels, users, pairs, RefineSettings(**settings))


def test_refined_prototypes_are_unit_vectors_that_move_and_are_reproducible():
    refined, log = run(epochs=3, lr=0.05)
    assert refined.shape == (2, D)
    np.testing.assert_allclose(np.linalg.norm(refined, axis=1), 1.0, atol=1e-6)
    assert not np.allclose(refined, np.eye(2, D), atol=1e-4)
    np.testing.assert_array_equal(refined, run(epochs=3, lr=0.05)[0])
    assert log["samples"] == 16  # 5 users x 3 pairs + 1 user with 1 pair (no history: s = 0)
    assert len(log["losses"]) == 3 and all(np.isfinite(v) for e in log["losses"] for v in e.values())
    assert log["losses"][-1]["pairwise"] < log["losses"][0]["pairwise"]


def test_each_regulariser_is_in_the_loss_and_changes_the_result():
    base = dict(epochs=3, lr=0.05, lambda_centre=1.0, lambda_smooth=1.0)
    both, log = run(**base)
    assert log["losses"][0]["centre"] > 0  # the K-means centre is unit length, the members' mean is not
    assert log["losses"][1]["smooth"] > 0  # the moving average lags the moved prototype
    without_centre, _ = run(**{**base, "lambda_centre": 0.0})
    without_smooth, _ = run(**{**base, "lambda_smooth": 0.0})
    assert np.abs(both - without_centre).max() > 1e-4
    assert np.abs(both - without_smooth).max() > 1e-4


def test_refinement_needs_pairs_and_sane_settings():
    centroids, labels, users, _ = world()
    with pytest.raises(ValueError, match="needs preference pairs"):
        refine(centroids, labels, users, {})
    with pytest.raises(ValueError, match="epochs"):
        RefineSettings(epochs=0)
