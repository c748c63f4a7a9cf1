"""Federated simulator scenarios, run in-process (``num_workers=0``) to stay fast.

The process pool is exercised in ``test_federated_processes.py``; it gives the
same results as these in-process runs (tested there).
"""

import math

import numpy as np
import pytest

from tfdist import federated as fl

pytestmark = pytest.mark.integration

LR = {"learning_rate": 0.3, "batch_size": 16, "local_epochs": 1}


@pytest.fixture(scope="module")
def digits():
    (x, y), test = fl.load_digits_split(test_fraction=0.2, seed=0)
    return x, y, test


@pytest.fixture(scope="module")
def noniid(digits):
    x, y, _ = digits
    return fl.partition(x, y, num_clients=100, scheme="dirichlet", alpha=0.5, seed=0)


def _run(data, test, **kwargs):
    kwargs.setdefault("client", LR)
    kwargs.setdefault("num_workers", 0)
    kwargs.setdefault("progress", False)
    return fl.Simulation(fl.make_mlp, data, test_data=test, **kwargs).run()


@pytest.fixture(scope="module")
def clean_fedavg(noniid, digits):
    return _run(noniid, digits[2], strategy=fl.FedAvg(clients_per_round=20), rounds=30)


def test_fedavg_on_noniid_digits_reaches_085_within_30_rounds(clean_fedavg):
    acc = clean_fedavg.accuracy
    assert len(acc) == 31 and acc[0] < 0.2
    assert max(acc) >= 0.85, acc
    assert clean_fedavg.final_accuracy >= 0.8
    assert all(u.staleness == 0 for u in clean_fedavg.updates)  # no delays: synchronous


def test_same_config_gives_the_same_accuracy_curve(clean_fedavg, noniid, digits):
    again = _run(noniid, digits[2], strategy=fl.FedAvg(clients_per_round=20), rounds=5)
    assert again.accuracy == clean_fedavg.accuracy[:6]


def test_median_survives_20pct_sign_flip_where_fedavg_degrades(clean_fedavg, noniid, digits):
    attack = {"fraction": 0.2, "attack": {"name": "sign_flip", "scale": 4.0}}
    fedavg = _run(noniid, digits[2], strategy=fl.FedAvg(clients_per_round=20), rounds=30, byzantine=attack)
    median = _run(noniid, digits[2], strategy=fl.FedMedian(clients_per_round=20), rounds=30, byzantine=attack)
    assert sum(u.byzantine for u in median.updates) > 0.1 * len(median.updates)
    assert fedavg.final_accuracy <= 0.3, fedavg.accuracy
    assert median.final_accuracy >= 0.7, median.accuracy
    assert clean_fedavg.final_accuracy - fedavg.final_accuracy >= 0.5


class _RecordingFedAvg(fl.FedAvg):
    """FedAvg that records what reaches aggregate() (an extension-point example)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = []

    def aggregate(self, round_num, weights, results):
        self.seen.append((round_num, [(r.client_id, r.arrival_time, r.staleness, r.metrics) for r in results]))
        return super().aggregate(round_num, weights, results)


def test_stale_updates_are_applied_in_simulated_arrival_order(noniid, digits):
    # client c needs (c % 5) * 0.7 simulated seconds; rounds close after 1 s.
    delays = fl.ConstantDelay(compute_s=[(c % 5) * 0.7 for c in range(100)], network_s=0.05)
    strategy = _RecordingFedAvg(clients_per_round=20, staleness_exponent=0.5)
    h = _run(noniid, digits[2], strategy=strategy, rounds=8, delays=delays, round_deadline_s=1.0)
    arrivals = [u.arrival_time for u in h.updates]
    assert arrivals == sorted(arrivals)
    dispatch_order = sorted(h.updates, key=lambda u: (u.dispatch_time, u.client_id))
    assert [u.client_id for u in dispatch_order] != [u.client_id for u in h.updates]
    for u in h.updates:
        assert (u.round_applied - 1) * 1.0 < u.arrival_time <= u.round_applied * 1.0 + 1e-9
        assert u.staleness == u.round_applied - u.round_dispatched
    assert max(u.staleness for u in h.updates) >= 2
    # the strategy sees each round's updates in arrival order, stale ones included
    for round_num, seen in strategy.seen:
        times = [t for _, t, _, _ in seen]
        assert times == sorted(times)
        assert all((round_num - 1) < t <= round_num + 1e-9 for t in times)
    busy_at_end = {u.client_id for u in h.updates if u.round_dispatched == 8} 
    assert h.rounds[-1].sim_time == pytest.approx(8.0)
    assert h.final_accuracy > 0.3 and busy_at_end


def test_local_epochs_and_batch_size_are_the_devices(noniid, digits):
    epochs = [1 + c % 3 for c in range(100)]
    batch = [4 if c % 2 else 16 for c in range(100)]
    strategy = _RecordingFedAvg(clients_per_round=10)
    _run(noniid, None, strategy=strategy, rounds=2, client={"learning_rate": 0.1, "local_epochs": epochs, "batch_size": batch})
    for _, seen in strategy.seen:
        for cid, _, _, metrics in seen:
            n = noniid[cid].num_examples
            assert metrics["steps"] == math.ceil(n / batch[cid]) * epochs[cid]


def test_fedprox_and_fedadam_learn(noniid, digits):
    prox = _run(noniid, digits[2], strategy=fl.FedProx(clients_per_round=20, mu=0.01), rounds=10)
    adam = _run(noniid, digits[2], strategy=fl.FedAdam(clients_per_round=20, server_learning_rate=0.03), rounds=10)
    assert prox.final_accuracy >= 0.6, prox.accuracy
    assert adam.final_accuracy >= 0.6, adam.accuracy


def test_p2p_ring_with_distillation_converges(digits):
    x, y, test = digits
    nodes = fl.partition(x, y, num_clients=20, scheme="dirichlet", alpha=0.5, seed=0)
    h = _run(nodes, test, strategy=fl.RingDistillation(temperature=2.0, kd_weight=0.5), rounds=15)
    acc = h.accuracy
    loss = [r.metrics["loss"] for r in h.rounds]
    assert acc[-1] >= 0.45 and acc[-1] >= acc[0] + 0.35, acc
    assert loss[-1] < 0.7 * loss[0], loss
    assert np.mean(acc[-3:]) > np.mean(acc[5:8])  # still rising or flat, not collapsing
    assert len(h.updates) == 20 * 15  # every node trained every round
    assert h.rounds[-1].metrics["accuracy_max"] >= h.rounds[-1].metrics["accuracy_min"]


# --- the extension-point example of docs/federated.md -------------------------------
class FedCenteredClip(fl.FedAvg):
    """Clips every delta to the median norm before averaging."""

    def combine(self, deltas, weights):
        norms = np.array([np.sqrt(sum(float(np.sum(d * d)) for d in delta)) for delta in deltas])
        cap = np.median(norms)
        clipped = [fl.aggregate.scale(delta, min(1.0, cap / max(n, 1e-12))) for delta, n in zip(deltas, norms)]
        return fl.aggregate.weighted_average(clipped, weights)


class Zero(fl.Attack):
    def apply(self, delta, rng):
        return [np.zeros_like(d) for d in delta]


class LabelSmoothing(fl.KerasClientUpdate):
    def compute_loss(self, y, outputs, targets):
        import keras

        onehot = keras.ops.one_hot(y, outputs.shape[-1]) * 0.9 + 0.01
        return keras.ops.mean(keras.losses.categorical_crossentropy(onehot, outputs, from_logits=self.from_logits))


class EveryoneTakesTwoSeconds(fl.DelayModel):
    def sample(self, client_id, round_num, work, rng):
        return fl.Delay(compute_s=1.5, network_s=0.5)


def test_documented_extension_points_plug_in(noniid, digits):
    h = _run(noniid, digits[2], strategy=FedCenteredClip(clients_per_round=10), client_update=LabelSmoothing(),
             byzantine=fl.ByzantineConfig(fraction=0.1, attack=Zero()), delays=EveryoneTakesTwoSeconds(), rounds=4)
    assert h.accuracy[-1] > h.accuracy[0]
    assert h.rounds[-1].sim_time == pytest.approx(8.0)
    assert any(u.byzantine for u in h.updates) or len(h.updates) == 40
