"""The declarative state schema of a PS task's store: each field once, with its codec.

Every component of :class:`~tfdist.ps.store.ParameterStore` lists its fields
(``FIELDS``): the name (the same in ``state()``, in checkpoints and in
``Status``), a codec (how it is copied, written as JSON and read back with
validation) and where it appears. From that one list:

* :func:`snapshot` — everything, copied (``state()``: what a refused request
  must leave unchanged);
* :func:`dump` — the checkpointed fields (checkpoint capture) or the shown
  ones (``Status``);
* :func:`parse` — a checkpoint's fields read back and *validated* (worker ids
  within the job, counts within their ranges) without touching anything; a
  bad value raises :class:`SchemaError`, so a restore can check the whole
  checkpoint before it assigns anything;
* :func:`assign` — the parsed values put in place.

No I/O, no TensorFlow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

__all__ = ["Field", "Limits", "SchemaError", "snapshot", "dump", "parse", "assign",
           "COUNT", "OPTIONAL_COUNT", "WORKERS", "WORKER_COUNTS", "OPTIONAL_WORKER", "TIMES", "NUMBER", "VALUE",
           "INCARNATION", "JOB_SIZE", "Choice", "MAX_COUNT", "MAX_WORKERS"]

#: Largest clock, step, version or count (exact in a float64 and in JSON).
MAX_COUNT = 2**53
#: Most workers a job may have (ids ``0 .. MAX_WORKERS - 1``).
MAX_WORKERS = 2**16


class SchemaError(ValueError):
    """A stored value does not fit its field (the message names the field and the value)."""


@dataclass(frozen=True)
class Limits:
    """What a checkpoint's values are checked against: the job's worker slots."""

    num_workers: int | None = None

    def check_worker(self, name: str, w: Any) -> int:
        n = self.num_workers or MAX_WORKERS
        if isinstance(w, bool) or not isinstance(w, int) or not 0 <= w < n:
            raise SchemaError(f"`{name}` holds {_short(w)}, not a worker id of this job (0..{n - 1})")
        return w


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _count(name: str, v: Any, low: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= MAX_COUNT:
        raise SchemaError(f"`{name}` must be an integer in [{low}, 2**53]; it holds {_short(v)}")
    return v


class Codec:
    """How one field is copied, dumped (JSON-able) and loaded back (validated)."""

    def copy(self, value):
        return value

    def dump(self, value):
        return value

    def load(self, name: str, raw, limits: Limits):
        return raw


class _Count(Codec):
    def __init__(self, low: int = 0, optional: bool = False):
        self.low, self.optional = low, optional

    def load(self, name, raw, limits):
        if raw is None and self.optional:
            return None
        return _count(name, raw, self.low)


class _Workers(Codec):
    """A set of worker ids, dumped sorted."""

    def copy(self, value):
        return set(value)

    def dump(self, value):
        return sorted(value)

    def load(self, name, raw, limits):
        if not isinstance(raw, (list, tuple)):
            raise SchemaError(f"`{name}` must be a list of worker ids; it holds {_short(raw)}")
        return {limits.check_worker(name, w) for w in raw}


class _WorkerCounts(Codec):
    """Worker id → count, dumped with string keys (JSON objects)."""

    def copy(self, value):
        return dict(value)

    def dump(self, value):
        return {str(w): n for w, n in sorted(value.items())}

    def load(self, name, raw, limits):
        if not isinstance(raw, Mapping):
            raise SchemaError(f"`{name}` must map worker ids to counts; it holds {_short(raw)}")
        out = {}
        for w, n in raw.items():
            try:
                wid = int(w)
            except (TypeError, ValueError):
                raise SchemaError(f"`{name}` has a key {_short(w)} that is not a worker id") from None
            out[limits.check_worker(name, wid)] = _count(name, n)
        return out


class _OptionalWorker(Codec):
    def load(self, name, raw, limits):
        return None if raw is None else limits.check_worker(name, raw)


class _Times(Codec):
    """Worker id → a time (liveness; never checkpointed)."""

    def copy(self, value):
        return dict(value)


class _Number(Codec):
    def load(self, name, raw, limits):
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
            raise SchemaError(f"`{name}` must be a finite number; it holds {_short(raw)}")
        return float(raw)


class _Value(Codec):
    """Any JSON-able value, copied one level deep (counters)."""

    def copy(self, value):
        return dict(value) if isinstance(value, dict) else value


class Choice(Codec):
    def __init__(self, options: tuple[str, ...]):
        self.options = options

    def load(self, name, raw, limits):
        if raw not in self.options:
            raise SchemaError(f"`{name}` must be one of {list(self.options)}; it holds {_short(raw)}")
        return raw


class _JobSize(Codec):
    """A job's number of workers, or ``None`` (not known yet)."""

    def load(self, name, raw, limits):
        if raw is None:
            return None
        if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= MAX_WORKERS:
            raise SchemaError(f"`{name}` must be a number of workers in [1, {MAX_WORKERS}]; it holds {_short(raw)}")
        return raw


COUNT = _Count()
JOB_SIZE = _JobSize()
OPTIONAL_COUNT = _Count(low=1, optional=True)
WORKERS = _Workers()
WORKER_COUNTS = _WorkerCounts()
OPTIONAL_WORKER = _OptionalWorker()
TIMES = _Times()
NUMBER = _Number()
VALUE = _Value()
INCARNATION = _Count()


@dataclass(frozen=True)
class Field:
    """One fact a component owns.

    Attributes:
        name: Its name in ``state()``, in checkpoints and in ``Status``.
        codec: How it is copied, dumped and loaded.
        checkpoint: Kept in checkpoints (else it starts afresh on restore).
        status: Shown in ``Status``.
        default: The value a checkpoint without the field loads (older formats).
    """

    name: str
    codec: Codec
    checkpoint: bool = True
    status: bool = True
    default: Any = None


def snapshot(obj, fields: Iterable[Field]) -> dict[str, Any]:
    """Every field of ``obj``, copied."""
    return {f.name: f.codec.copy(getattr(obj, f.name)) for f in fields}


def dump(obj, fields: Iterable[Field], which: str) -> dict[str, Any]:
    """The fields of ``obj`` kept in checkpoints (``which="checkpoint"``) or shown in ``Status`` (``"status"``)."""
    return {f.name: f.codec.dump(getattr(obj, f.name)) for f in fields if getattr(f, which)}


def parse(fields: Iterable[Field], meta: Mapping[str, Any], limits: Limits) -> dict[str, Any]:
    """A checkpoint's checkpointed fields, validated; raises :class:`SchemaError` (nothing is assigned)."""
    out = {}
    for f in fields:
        if f.checkpoint:
            raw = meta.get(f.name, f.default)
            out[f.name] = f.codec.load(f.name, raw, limits)
    return out


def assign(obj, values: Mapping[str, Any]) -> None:
    """Puts parsed values in place."""
    for name, value in values.items():
        setattr(obj, name, value)
