"""Byzantine client behaviour: attacks on the update a client sends.

An attack rewrites the *delta* (trained weights minus the weights the client
started from) that a byzantine client sends. The simulator trains byzantine
clients honestly and applies the attack to their delta before it is
aggregated (client-server) or handed to the neighbours (P2P ring).

To add an attack, subclass :class:`Attack` and implement :meth:`Attack.apply`.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from tfdist.errors import ConfigError

__all__ = ["Attack", "SignFlip", "RandomNoise", "ScaledUpdate", "ByzantineConfig", "make_attack", "ATTACKS"]


class Attack:
    """Base class: turns an honest delta into the one a byzantine client sends."""

    def apply(self, delta: Sequence[np.ndarray], rng: np.random.Generator) -> list:
        """Returns the malicious delta.

        Args:
            delta: the client's honest update, one array per variable.
            rng: generator seeded from (run seed, round, client) for reproducibility.
        """
        raise NotImplementedError


@dataclasses.dataclass
class SignFlip(Attack):
    """Sends ``-scale * delta``: pushes the model against the honest direction.

    Args:
        scale: magnitude of the flipped update. ``1`` is the plain flip; the
            default ``4`` (as in many robustness papers) lets 20% of attackers
            cancel the honest majority under plain averaging.
    """

    scale: float = 4.0

    def apply(self, delta, rng):
        return [(-self.scale * d).astype(d.dtype, copy=False) for d in delta]


@dataclasses.dataclass
class RandomNoise(Attack):
    """Sends Gaussian noise ``N(0, std^2)`` instead of the update."""

    std: float = 1.0

    def apply(self, delta, rng):
        return [rng.normal(0.0, self.std, size=d.shape).astype(d.dtype) for d in delta]


@dataclasses.dataclass
class ScaledUpdate(Attack):
    """Sends ``scale * delta`` (model-replacement style boosting)."""

    scale: float = 10.0

    def apply(self, delta, rng):
        return [(self.scale * d).astype(d.dtype, copy=False) for d in delta]


ATTACKS = {"sign_flip": SignFlip, "random_noise": RandomNoise, "scaled": ScaledUpdate}


def make_attack(spec: "Attack | str | dict") -> Attack:
    """Builds an attack from an instance, a name (``"sign_flip"``, ``"random_noise"``,
    ``"scaled"``) or ``{"name": ..., **kwargs}``."""
    if isinstance(spec, Attack):
        return spec
    if isinstance(spec, str):
        spec = {"name": spec}
    if isinstance(spec, dict):
        kwargs = dict(spec)
        name = kwargs.pop("name", None)
        if name not in ATTACKS:
            raise ConfigError(f"Unknown attack. Received: attack={name!r}. Use one of {sorted(ATTACKS)}.")
        return ATTACKS[name](**kwargs)
    raise ConfigError(f"attack must be an Attack, a name or a dict. Received: attack={spec!r}")


@dataclasses.dataclass
class ByzantineConfig:
    """Which clients are byzantine and what they do.

    Args:
        fraction: share of all clients that are byzantine, in ``[0, 1)``. The
            byzantine set is drawn once from the simulation seed. Defaults to 0.
        attack: an :class:`Attack`, a name or a dict. Defaults to ``"sign_flip"``.
        clients: explicit byzantine client ids (overrides ``fraction``).

    Example:
        >>> ByzantineConfig(fraction=0.2, attack={"name": "sign_flip", "scale": 4}).num_byzantine(100)
        20
    """

    fraction: float = 0.0
    attack: object = "sign_flip"
    clients: list | None = None

    def __post_init__(self):
        if not 0.0 <= float(self.fraction) < 1.0:
            raise ConfigError(f"byzantine fraction must be in [0, 1). Received: fraction={self.fraction}")
        self.attack = make_attack(self.attack)

    @classmethod
    def from_spec(cls, spec: "ByzantineConfig | dict | None") -> "ByzantineConfig | None":
        if spec is None or isinstance(spec, ByzantineConfig):
            return spec
        if isinstance(spec, dict):
            unknown = set(spec) - {"fraction", "attack", "clients"}
            if unknown:
                raise ConfigError(
                    f"Unknown byzantine settings. Received: {sorted(unknown)}. Use fraction, attack, clients."
                )
            return cls(**spec)
        raise ConfigError(f"byzantine must be a dict, a ByzantineConfig or None. Received: byzantine={spec!r}")

    def num_byzantine(self, num_clients: int) -> int:
        return len(self.clients) if self.clients is not None else int(round(self.fraction * num_clients))

    def choose(self, num_clients: int, seed: int) -> frozenset:
        """The byzantine client ids (deterministic in ``seed``)."""
        if self.clients is not None:
            bad = [int(c) for c in self.clients]
            if any(not 0 <= c < num_clients for c in bad):
                raise ConfigError(f"byzantine clients must be in [0, {num_clients}). Received: clients={self.clients}")
            return frozenset(bad)
        rng = np.random.default_rng([seed, 0xBAD])
        return frozenset(int(c) for c in rng.permutation(num_clients)[: self.num_byzantine(num_clients)])

    def to_dict(self) -> dict:
        params = dataclasses.asdict(self.attack) if dataclasses.is_dataclass(self.attack) else {
            k: v for k, v in vars(self.attack).items() if not k.startswith("_")
        }
        return {"fraction": self.fraction, "attack": {"name": _attack_name(self.attack), **params}, "clients": self.clients}


def _attack_name(attack: Attack) -> str:
    for name, cls in ATTACKS.items():
        if type(attack) is cls:
            return name
    return type(attack).__name__
