"""Server-side strategies: sampling and aggregation on literal arrays."""

import numpy as np
import pytest

from tfdist.errors import ConfigError
from tfdist.federated import (
    ClientConfig,
    ClientResult,
    FedAdam,
    FedAvg,
    FedMedian,
    FedProx,
    FedTrimmedMean,
    ProximalClientUpdate,
    RingDistillation,
    make_strategy,
)


def _r(cid, delta, n=1, staleness=0):
    return ClientResult(cid, n, [np.array(delta, np.float32)], 1, 0.0, staleness)


W = [np.zeros(2, np.float32)]


def test_sampling_is_seeded_sorted_and_bounded():
    s = FedAvg(clients_per_round=5)
    a = s.sample_clients(np.arange(100), 1, np.random.default_rng([0, 1]))
    b = s.sample_clients(np.arange(100), 1, np.random.default_rng([0, 1]))
    assert list(a) == list(b) == sorted(a) and len(set(a)) == 5
    assert len(s.sample_clients(np.array([3, 4]), 1, np.random.default_rng(0))) == 2


def test_fedavg_weights_by_examples_and_discounts_stale():
    out = FedAvg().aggregate(1, W, [_r(0, [1, 1], n=1), _r(1, [4, 4], n=3)])
    np.testing.assert_allclose(out[0], [3.25, 3.25])
    out = FedAvg(staleness_exponent=1.0).aggregate(1, W, [_r(0, [0, 0]), _r(1, [3, 3], staleness=2)])
    np.testing.assert_allclose(out[0], [0.75, 0.75])  # weights 1 and 1/3
    out = FedAvg(max_staleness=1).aggregate(1, W, [_r(0, [1, 1]), _r(1, [9, 9], staleness=2)])
    np.testing.assert_allclose(out[0], [1, 1])
    assert FedAvg(max_staleness=0).aggregate(1, W, [_r(1, [9, 9], staleness=2)]) is W


def test_server_learning_rate():
    out = FedAvg(server_learning_rate=0.5).aggregate(1, [np.ones(2, np.float32)], [_r(0, [2, 2])])
    np.testing.assert_allclose(out[0], [2, 2])


def test_robust_strategies_resist_one_outlier():
    results = [_r(0, [1, 1]), _r(1, [1.2, 1.2]), _r(2, [0.8, 0.8]), _r(3, [1.1, 1.1]), _r(4, [-100, -100])]
    assert FedAvg().aggregate(1, W, results)[0][0] < -10
    assert FedMedian().aggregate(1, W, results)[0][0] == pytest.approx(1.0)
    assert FedTrimmedMean(beta=0.2).aggregate(1, W, results)[0][0] == pytest.approx((0.8 + 1.0 + 1.1) / 3, abs=1e-5)


def test_fedadam_first_step_is_lr_times_sign():
    s = FedAdam(server_learning_rate=0.1, tau=1e-9)
    s.initialize(W, 10)
    out = s.aggregate(1, W, [_r(0, [2, -3])])
    # m = 0.1 d, v = 0.01 d^2 -> step = 0.1 * 0.1 d / (0.1 |d|) = 0.1 sign(d)
    np.testing.assert_allclose(out[0], [0.1, -0.1], rtol=1e-5)


def test_fedprox_ships_proximal_client_update():
    update = FedProx(mu=0.1).client_update(ClientConfig())
    assert isinstance(update, ProximalClientUpdate) and update.mu == 0.1
    with pytest.raises(ConfigError, match="mu"):
        FedProx(mu=-1)


def test_ring_neighbours_and_gossip():
    assert RingDistillation.neighbours(0, 5) == (4, 1)
    assert RingDistillation.neighbours(4, 5) == (3, 0)
    with pytest.raises(ConfigError, match="3 nodes"):
        RingDistillation.neighbours(0, 2)
    own = [np.zeros(2, np.float32)]
    nb = [[np.ones(2, np.float32)], [np.full(2, 3.0, np.float32)]]
    assert RingDistillation().start_weights(own, nb) is own
    np.testing.assert_allclose(RingDistillation(gossip=0.5).start_weights(own, nb)[0], [1.0, 1.0])


def test_make_strategy_and_validation():
    assert isinstance(make_strategy({"name": "median", "clients_per_round": 3}), FedMedian)
    assert isinstance(make_strategy("fedavg"), FedAvg)
    with pytest.raises(ConfigError, match="Unknown strategy"):
        make_strategy("fedsgd")
    with pytest.raises(ConfigError, match="Bad arguments"):
        make_strategy({"name": "fedavg", "mu": 1})
    with pytest.raises(ConfigError, match="clients_per_round"):
        FedAvg(clients_per_round=0)
    with pytest.raises(ConfigError, match="exceeds"):
        FedAvg(clients_per_round=11).initialize(W, 10)
