"""Simulated compute and network delays of clients.

A delay model is asked once per dispatched client update; the update then
*arrives* at the server (or at the peer) ``compute_s + network_s`` simulated
seconds after it was sent out. The simulator applies updates in arrival order,
so slow clients' updates arrive late and stale, as in Algorithm 1 of the seed
paper (Yu, Park and Moon, "Fast Federated Learning Simulator based on
Multiprocessing Technique").

To add a model, subclass :class:`DelayModel` and implement :meth:`DelayModel.sample`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tfdist.errors import ConfigError

__all__ = ["Delay", "DelayModel", "NoDelay", "ConstantDelay", "LogNormalDelay", "make_delay_model"]


@dataclasses.dataclass(frozen=True)
class Delay:
    """Simulated seconds one client update takes: local compute + upload."""

    compute_s: float
    network_s: float

    @property
    def total_s(self) -> float:
        return self.compute_s + self.network_s


class DelayModel:
    """Base class: draws the simulated delay of one client update.

    Implementations must be deterministic given ``rng`` (the simulator passes a
    generator seeded from the run's seed, the round and the client id), so the
    same config gives the same schedule whatever the number of workers.
    """

    def setup(self, num_clients: int, seed: int) -> None:
        """Called once before the first round (draw per-client traits here)."""

    def sample(self, client_id: int, round_num: int, work: float, rng: np.random.Generator) -> Delay:
        """Returns the delay of ``client_id``'s update dispatched in ``round_num``.

        Args:
            client_id: the client.
            round_num: 1-based round in which the update was dispatched.
            work: local training examples processed (examples x local epochs).
            rng: generator to draw from.
        """
        raise NotImplementedError

    def to_dict(self) -> dict:
        return {"name": type(self).__name__, **dataclasses.asdict(self)} if dataclasses.is_dataclass(self) else {
            "name": type(self).__name__
        }


@dataclasses.dataclass
class NoDelay(DelayModel):
    """Every update arrives at once (a synchronous, staleness-free simulation)."""

    def sample(self, client_id, round_num, work, rng):
        return Delay(0.0, 0.0)


@dataclasses.dataclass
class ConstantDelay(DelayModel):
    """Fixed per-client delays, e.g. ``ConstantDelay(compute_s=[1, 1, 5])``.

    Args:
        compute_s: seconds of compute, one number for all clients or one per client.
        network_s: seconds of upload, one number or one per client.
    """

    compute_s: float | list = 1.0
    network_s: float | list = 0.0

    def _pick(self, value, client_id):
        if np.ndim(value) == 0:
            return float(value)
        return float(value[client_id])

    def sample(self, client_id, round_num, work, rng):
        return Delay(self._pick(self.compute_s, client_id), self._pick(self.network_s, client_id))


@dataclasses.dataclass
class LogNormalDelay(DelayModel):
    """Heterogeneous devices: log-normal speeds and log-normal network times.

    Every client gets a persistent speed factor ``exp(N(0, device_sigma))``
    (drawn once from the seed). An update's compute time is
    ``seconds_per_example * work * speed * exp(N(0, jitter_sigma))`` and its
    upload time ``network_s * exp(N(0, network_sigma))``.

    Args:
        seconds_per_example: median compute seconds per example processed. Defaults to 0.01.
        device_sigma: spread of the per-device speed factor. Defaults to 0.5.
        jitter_sigma: round-to-round spread of one device's compute time. Defaults to 0.2.
        network_s: median upload seconds. Defaults to 0.5.
        network_sigma: spread of upload times. Defaults to 0.5.
    """

    seconds_per_example: float = 0.01
    device_sigma: float = 0.5
    jitter_sigma: float = 0.2
    network_s: float = 0.5
    network_sigma: float = 0.5

    def __post_init__(self):
        for name in ("seconds_per_example", "device_sigma", "jitter_sigma", "network_s", "network_sigma"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value >= 0):
                raise ConfigError(f"LogNormalDelay.{name} must be a number >= 0. Received: {name}={value!r}")
        self._speed = None

    def setup(self, num_clients, seed):
        rng = np.random.default_rng([seed, 0x5EED])
        self._speed = np.exp(rng.normal(0.0, self.device_sigma, size=num_clients))

    def speed(self, client_id: int) -> float:
        """The persistent slowness factor of a client (1 = median device)."""
        if self._speed is None:
            raise RuntimeError("LogNormalDelay.setup(num_clients, seed) must be called first.")
        return float(self._speed[client_id])

    def sample(self, client_id, round_num, work, rng):
        compute = self.seconds_per_example * work * self.speed(client_id) * float(np.exp(rng.normal(0.0, self.jitter_sigma)))
        network = self.network_s * float(np.exp(rng.normal(0.0, self.network_sigma)))
        return Delay(compute, network)

    def to_dict(self):
        return {"name": "lognormal", **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}}


_BY_NAME = {"none": NoDelay, "constant": ConstantDelay, "lognormal": LogNormalDelay}


def make_delay_model(spec: "DelayModel | dict | str | None") -> DelayModel:
    """Builds a delay model from an instance, ``None``, a name or ``{"name": ..., **kwargs}``."""
    if spec is None:
        return NoDelay()
    if isinstance(spec, DelayModel):
        return spec
    if isinstance(spec, str):
        spec = {"name": spec}
    if isinstance(spec, dict):
        kwargs = dict(spec)
        name = str(kwargs.pop("name", "lognormal")).lower()
        if name not in _BY_NAME:
            raise ConfigError(f"Unknown delay model. Received: name={name!r}. Use one of {sorted(_BY_NAME)}.")
        return _BY_NAME[name](**kwargs)
    raise ConfigError(f"delays must be a DelayModel, a dict or None. Received: delays={spec!r}")
