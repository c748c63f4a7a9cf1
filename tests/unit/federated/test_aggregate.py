"""Aggregation rules on tiny literal arrays."""

import numpy as np
import pytest

from tfdist.errors import ConfigError
from tfdist.federated import aggregate as agg


def _u(*values):
    return [[np.array([v], dtype=np.float32), np.array([[v, -v]], dtype=np.float32)] for v in values]


def test_weighted_average_weights_by_examples():
    out = agg.weighted_average(_u(1.0, 3.0), [1, 3])
    np.testing.assert_allclose(out[0], [2.5])
    np.testing.assert_allclose(out[1], [[2.5, -2.5]])
    assert out[0].dtype == np.float32


def test_weighted_average_equal_weights_by_default_and_inputs_untouched():
    updates = _u(1.0, 2.0, 6.0)
    before = [[a.copy() for a in u] for u in updates]
    np.testing.assert_allclose(agg.weighted_average(updates)[0], [3.0])
    for u, b in zip(updates, before):
        for a, c in zip(u, b):
            np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("weights", [[1, -1], [0, 0], [1]])
def test_weighted_average_rejects_bad_weights(weights):
    with pytest.raises(ValueError, match="Received"):
        agg.weighted_average(_u(1.0, 2.0), weights)


def test_empty_and_ragged_updates_are_rejected():
    with pytest.raises(ValueError, match="empty"):
        agg.weighted_average([])
    with pytest.raises(ValueError, match="same number"):
        agg.coordinate_median([[np.zeros(1)], [np.zeros(1), np.zeros(1)]])


def test_median_ignores_outlier():
    out = agg.coordinate_median(_u(1.0, 2.0, 100.0))
    np.testing.assert_allclose(out[0], [2.0])
    np.testing.assert_allclose(out[1], [[2.0, -2.0]])


def test_median_is_coordinate_wise():
    updates = [[np.array([1.0, 9.0])], [np.array([2.0, 8.0])], [np.array([3.0, -50.0])]]
    np.testing.assert_allclose(agg.coordinate_median(updates)[0], [2.0, 8.0])


def test_trimmed_mean_drops_both_ends():
    out = agg.trimmed_mean(_u(0.0, 1.0, 2.0, 3.0, 100.0), beta=0.2)
    np.testing.assert_allclose(out[0], [2.0])
    np.testing.assert_allclose(agg.trimmed_mean(_u(1.0, 3.0), beta=0.0)[0], [2.0])
    with pytest.raises(ConfigError, match="beta"):
        agg.trimmed_mean(_u(1.0), beta=0.5)


def test_krum_picks_the_clustered_update():
    updates = [[np.array([0.0, 0.0])], [np.array([0.1, 0.0])], [np.array([0.0, 0.1])],
               [np.array([0.1, 0.1])], [np.array([50.0, -50.0])]]
    out = agg.krum(updates, num_byzantine=1)
    assert np.abs(out[0]).max() <= 0.1
    with pytest.raises(ConfigError, match="2f"):
        agg.krum(updates, num_byzantine=2)


def test_flatten_unflatten_round_trip():
    like = [np.zeros((2, 3), np.float32), np.zeros(4, np.float32)]
    vec = np.arange(10, dtype=np.float32)
    back = agg.unflatten(vec, like)
    assert [b.shape for b in back] == [(2, 3), (4,)]
    np.testing.assert_array_equal(agg.flatten(back), vec)


def test_staleness_discount():
    assert agg.staleness_discount(0, 0.5) == 1.0
    assert agg.staleness_discount(3, 0.5) == pytest.approx(0.5)
    assert agg.staleness_discount(7, 0.0) == 1.0
    np.testing.assert_allclose(agg.staleness_discount(np.array([0, 3]), 1.0), [1.0, 0.25])
