"""Partitioners: coverage, reproducibility, skew and group integrity."""

import numpy as np
import pytest

from tfdist.errors import ConfigError
from tfdist.federated import partition


def _data(n=600, classes=10, seed=0):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(classes), n // classes)
    x = rng.normal(size=(len(y), 3)).astype(np.float32)
    x[:, 0] = np.arange(len(y))  # example id, to check coverage
    return x, y


@pytest.mark.parametrize("scheme", ["iid", "dirichlet"])
def test_every_example_lands_on_exactly_one_client(scheme):
    x, y = _data()
    data = partition(x, y, num_clients=20, scheme=scheme, alpha=0.5, seed=1)
    ids = np.concatenate([c.x[:, 0] for c in data])
    assert sorted(ids.astype(int).tolist()) == list(range(len(y)))
    assert len(data) == 20 and data.sizes.sum() == len(y)
    for c in data:  # labels travel with their features
        np.testing.assert_array_equal(y[c.x[:, 0].astype(int)], c.y)


@pytest.mark.parametrize("scheme", ["iid", "dirichlet"])
def test_same_seed_same_partition_other_seed_differs(scheme):
    x, y = _data()
    a = partition(x, y, num_clients=10, scheme=scheme, seed=3)
    b = partition(x, y, num_clients=10, scheme=scheme, seed=3)
    c = partition(x, y, num_clients=10, scheme=scheme, seed=4)
    assert all(np.array_equal(p.x, q.x) for p, q in zip(a, b))
    assert not all(np.array_equal(p.x, q.x) for p, q in zip(a, c))


def test_dirichlet_small_alpha_is_skewed_large_alpha_is_not():
    x, y = _data(2000)
    def mean_classes(alpha):
        hist = partition(x, y, num_clients=20, scheme="dirichlet", alpha=alpha, seed=0).label_histogram(10)
        return float((hist > 0).sum(axis=1).mean())
    assert mean_classes(0.1) < 5 < mean_classes(100.0)


def test_iid_sizes_are_balanced():
    x, y = _data()
    sizes = partition(x, y, num_clients=7, scheme="iid").sizes
    assert sizes.max() - sizes.min() <= 1


def test_min_examples_is_honoured():
    x, y = _data()
    data = partition(x, y, num_clients=30, scheme="dirichlet", alpha=0.3, min_examples=5, seed=0)
    assert data.sizes.min() >= 5


def test_group_scheme_keeps_each_writer_on_one_client():
    x, y = _data(300)
    writers = np.arange(300) % 12
    data = partition(x, y, scheme="group", groups=writers, seed=0)
    assert len(data) == 12
    for c in data:
        assert len(np.unique(writers[c.x[:, 0].astype(int)])) == 1
    data4 = partition(x, y, num_clients=4, scheme="group", groups=writers, seed=0)
    seen = [set(np.unique(writers[c.x[:, 0].astype(int)]).tolist()) for c in data4]
    assert all(len(s) == 3 for s in seen) and set().union(*seen) == set(range(12))
    assert all(not (a & b) for i, a in enumerate(seen) for b in seen[i + 1:])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"scheme": "bogus", "num_clients": 2}, "scheme"),
        ({"scheme": "group", "num_clients": 2}, "groups"),
        ({"scheme": "iid", "num_clients": 0}, "num_clients"),
        ({"scheme": "iid", "num_clients": 601}, "Cannot give"),
        ({"scheme": "dirichlet", "num_clients": 5, "alpha": 0.0}, "alpha"),
    ],
)
def test_bad_arguments_say_what_and_how(kwargs, match):
    x, y = _data()
    with pytest.raises(ConfigError, match=match) as err:
        partition(x, y, **kwargs)
    assert "Received" in str(err.value)


def test_float_labels_rejected():
    x, y = _data()
    with pytest.raises(ConfigError, match="integer"):
        partition(x, y.astype(float), num_clients=2)
