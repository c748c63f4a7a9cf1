"""Delay models and byzantine attacks."""

import numpy as np
import pytest

from tfdist.errors import ConfigError
from tfdist.federated import ByzantineConfig, ConstantDelay, LogNormalDelay, NoDelay, RandomNoise, ScaledUpdate, SignFlip
from tfdist.federated.delays import make_delay_model


def test_no_and_constant_delay():
    rng = np.random.default_rng(0)
    assert NoDelay().sample(0, 1, 10, rng).total_s == 0.0
    d = ConstantDelay(compute_s=[1.0, 5.0], network_s=0.5)
    assert d.sample(1, 1, 10, rng).total_s == 5.5
    assert d.sample(0, 1, 10, rng).compute_s == 1.0


def test_lognormal_is_reproducible_and_heterogeneous():
    a, b = LogNormalDelay(), LogNormalDelay()
    a.setup(50, seed=7)
    b.setup(50, seed=7)
    da = [a.sample(c, 1, 20, np.random.default_rng([7, c])).total_s for c in range(50)]
    db = [b.sample(c, 1, 20, np.random.default_rng([7, c])).total_s for c in range(50)]
    assert da == db
    speeds = [a.speed(c) for c in range(50)]
    assert max(speeds) / min(speeds) > 2  # some devices are much slower
    more_work = a.sample(0, 1, 200, np.random.default_rng([7, 0])).compute_s
    assert more_work == pytest.approx(10 * a.sample(0, 1, 20, np.random.default_rng([7, 0])).compute_s)


def test_make_delay_model_and_errors():
    assert isinstance(make_delay_model(None), NoDelay)
    assert isinstance(make_delay_model({"name": "lognormal", "network_s": 1.0}), LogNormalDelay)
    with pytest.raises(ConfigError, match="Unknown delay"):
        make_delay_model({"name": "gamma"})
    with pytest.raises(ConfigError, match="network_s"):
        LogNormalDelay(network_s=-1)


def test_attacks():
    delta = [np.array([1.0, -2.0], np.float32)]
    rng = np.random.default_rng(0)
    np.testing.assert_allclose(SignFlip(scale=1.0).apply(delta, rng)[0], [-1.0, 2.0])
    np.testing.assert_allclose(SignFlip().apply(delta, rng)[0], [-4.0, 8.0])
    np.testing.assert_allclose(ScaledUpdate(scale=10).apply(delta, rng)[0], [10.0, -20.0])
    noise = RandomNoise(std=2.0).apply(delta, np.random.default_rng(1))
    assert noise[0].shape == (2,) and noise[0].dtype == np.float32
    np.testing.assert_array_equal(noise[0], RandomNoise(std=2.0).apply(delta, np.random.default_rng(1))[0])


def test_byzantine_config_choice_is_seeded():
    cfg = ByzantineConfig(fraction=0.2, attack="sign_flip")
    assert len(cfg.choose(100, seed=0)) == 20
    assert cfg.choose(100, seed=0) == cfg.choose(100, seed=0)
    assert cfg.choose(100, seed=0) != cfg.choose(100, seed=1)
    assert ByzantineConfig(attack="random_noise", clients=[3, 4]).choose(10, 0) == {3, 4}
    assert isinstance(ByzantineConfig.from_spec({"fraction": 0.1, "attack": {"name": "scaled", "scale": 3}}).attack, ScaledUpdate)
    with pytest.raises(ConfigError, match="fraction"):
        ByzantineConfig(fraction=1.0)
    with pytest.raises(ConfigError, match="Unknown attack"):
        ByzantineConfig(attack="label_flip")
    with pytest.raises(ConfigError, match="Unknown byzantine"):
        ByzantineConfig.from_spec({"frac": 0.1})
