"""A PS task's whole state as the components' schemas describe it: ``state``, ``status``, capture, restore.

Derived, not listed by hand: each component of
:class:`~tfdist.ps.store.ParameterStore` declares its fields once
(:mod:`tfdist.ps._schema`), and these four views are built from those
declarations. :func:`restore` parses and validates *every* part of a
checkpoint — variables and their values (dtype, shape, finite under the job's
policy), tables and slots, the policy and its state, membership sets (worker
ids of this job), counters (in range) — before it assigns anything: a
malformed checkpoint raises ``DATA_LOSS`` and leaves the store as it was, so
the checkpointer can fall back to the previous one.

The functions run with the store's lock held, except :func:`restore`, which
takes it once parsing is done.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any, Mapping

import numpy as np

from tfdist.consistency import policy_from_spec
from tfdist.errors import ConfigError
from tfdist.ps import _schema as schema
from tfdist.ps._schema import Field, Limits, SchemaError
from tfdist.ps._barrier import GradientBarrier
from tfdist.ps._membership import Membership
from tfdist.ps._table_shards import TableShards
from tfdist.ps._variables import DenseVariables
from tfdist.ps._waits import StoreError
from tfdist.ps.protocol import short

__all__ = ["state", "status", "capture", "restore", "STORE_FIELDS", "KIND"]

logger = logging.getLogger(__name__)

#: What a PS shard's checkpoint says it is.
KIND = "tfdist-ps-shard"

#: The store's own facts (beside its components'): who this run of the task's state is.
STORE_FIELDS = (
    Field("incarnation", schema.INCARNATION, checkpoint=False),
    Field("restored_from", schema.VALUE, checkpoint=False),
    Field("stats", schema.VALUE, checkpoint=False),
)


def state(store) -> dict[str, Any]:
    """Everything the store holds, copied: what a refused request must leave unchanged."""
    return {
        **store.variables.state(), **store.barrier.state(), **store.members.state(), **store.table_shards.state(),
        **store.epoch_logs_barrier.state(),
        **schema.snapshot(store, STORE_FIELDS),
        "policy": store.policy.describe() if store.policy else None,
        "policy_state": store.policy.state() if store.policy else None,
    }


def status(store, brief: bool) -> dict[str, Any]:
    """What ``Status`` shows (``brief``: without the per-variable specs)."""
    return {
        **store.variables.status(brief), **store.barrier.status(), **store.members.status(),
        **schema.dump(store, STORE_FIELDS, "status"),
        "tables": store.table_shards.status(),
        "policy": store.policy.describe() if store.policy else None,
    }


def capture(store) -> tuple[int, dict[str, Any], dict[str, np.ndarray]]:
    """``(step, meta, arrays)`` of a checkpoint (copies; lock held, store initialised)."""
    variables_meta, arrays = store.variables.checkpoint()
    meta = {
        "kind": KIND,
        **variables_meta, **store.barrier.checkpoint(), **store.members.checkpoint(),
        "incarnation": store.incarnation,
        "policy": store.policy.spec(),
        "policy_state": store.policy.state(),
        "path": store.policy.path,
        "tables": store.table_shards.checkpoint(),
    }
    arrays.update(store.table_shards.arrays())
    return store._checkpoint_step(), meta, arrays


def _parse(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray], num_workers: int | None) -> dict[str, Any]:
    """Every part of a checkpoint, validated (raises :class:`SchemaError`); builds new objects, touches nothing."""
    if not isinstance(meta, Mapping) or meta.get("kind") != KIND:
        raise SchemaError(f"kind {short(meta.get('kind') if isinstance(meta, Mapping) else meta)}")
    theirs = schema.JOB_SIZE.load("num_workers", meta.get("num_workers"), Limits())
    limits = Limits(num_workers if num_workers is not None else theirs)
    variables = DenseVariables.parse_checkpoint(meta, arrays, limits)
    steps = schema.parse(GradientBarrier.FIELDS, meta, limits)
    members = schema.parse(Membership.FIELDS, meta, limits)
    tables = TableShards.parse_checkpoint(meta.get("tables"), arrays, variables["nonfinite"])
    if not isinstance(meta.get("policy"), Mapping):
        raise SchemaError(f"`policy` holds {short(meta.get('policy'))}")
    try:
        policy = policy_from_spec(meta["policy"], theirs or num_workers or 1)
        policy_state = meta.get("policy_state") or {}
        if not isinstance(policy_state, Mapping):
            raise ValueError(f"`policy_state` holds {short(policy_state)}")
        policy.restore(dict(policy_state))
    except (ConfigError, KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        raise SchemaError(f"the consistency policy or its state is malformed ({short(str(e), 200)})") from None
    return {"variables": variables, "steps": steps, "members": members, "tables": tables, "policy": policy,
            "num_workers": theirs}


def restore(store, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray], replace: bool) -> None:
    """Loads a checkpoint into ``store``, all or nothing (see :meth:`ParameterStore.restore`)."""
    try:
        parsed = _parse(meta, arrays, store.members.num_workers)
    except SchemaError as e:
        raise StoreError(f"Not a checkpoint of a parameter-server shard ({e}).", grpc_code="DATA_LOSS") from None
    variables = parsed["variables"]
    num_workers = parsed["num_workers"]
    with store._cond:
        if store.initialized and not replace:
            raise StoreError("A checkpoint is restored only into a parameter server that holds no values yet.",
                             grpc_code="FAILED_PRECONDITION")
        if store.initialized:
            store.variables.check_same_specs(variables["specs"].values())
        n = store.members.num_workers
        if n is not None and num_workers is not None and num_workers != n:
            raise StoreError(
                f"The checkpoint is of a job with {num_workers} workers; this one has {n}. "
                "Use another ps.checkpoint_dir for a job of another size.", grpc_code="FAILED_PRECONDITION")
        # -- every check passed: assign
        store.policy = parsed["policy"]
        store.variables.load(variables)
        store.table_shards.install(parsed["tables"])
        store.barrier.load(parsed["steps"])
        schema.assign(store.members, {**parsed["members"], "num_workers": n if n is not None else num_workers})
        if replace:
            store.incarnation = secrets.randbits(48)
        store.members.restart_after_restore()
        store.restored_from = store._checkpoint_step()
        store.policy.on_step_boundary(store._ctx())
        store._cond.notify_all()
    logger.info("restored from the checkpoint of step %d: %d variables, policy %s, version %d",
                store.restored_from, len(variables["specs"]), store.policy.spec(), store.version)
