"""The PS store's one-owner-per-fact rule and its declarative schema, checked mechanically.

* every fact a component declares is declared once, by one component;
* outside its component's module no code of the PS assigns it (the store
  asks the component: ``add_progress``, ``store_state``, ...);
* ``state()``, ``status()`` and checkpoint capture hold exactly what the
  schemas declare, and a checkpoint restores to the same checkpoint.
"""

import ast
import pathlib

import numpy as np
import pytest

from tfdist.consistency import DTSSPPolicy, SSPPolicy
from tfdist.consistency.sync_replicas import SyncReplicasPolicy
from tfdist.ps import _shard_state
from tfdist.ps._barrier import GradientBarrier
from tfdist.ps._membership import Membership
from tfdist.ps._variables import DenseVariables
from tfdist.ps.placement import VariableSpec
from tfdist.ps.server import ParameterService
from tfdist.ps.store import ParameterStore

PS_DIR = pathlib.Path(__file__).resolve().parents[2] / "tfdist" / "ps"
#: Component → the module that owns (and alone assigns) its facts.
OWNERS = {
    DenseVariables: "_variables.py", GradientBarrier: "_barrier.py", Membership: "_membership.py",
}
SPECS = [VariableSpec("a", "float32", (2, 2)), VariableSpec("b", "float32", (3,))]
TABLE = {"key": "t", "rows": 6, "dim": 2, "shard": 0, "num_shards": 1, "optimizer": {"kind": "adam"}}


def test_every_fact_has_one_owner():
    names = [f.name for c in OWNERS for f in c.FIELDS] + [f.name for f in _shard_state.STORE_FIELDS]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def _assignments(path: pathlib.Path):
    """(attribute name, line) of every ``x.attr = / += ...`` in a file."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store):
                    yield sub.attr, node.lineno


@pytest.mark.parametrize("component", list(OWNERS), ids=lambda c: c.__name__)
def test_no_ps_module_but_the_owner_assigns_a_components_facts(component):
    facts = {f.name for f in component.FIELDS}
    server_side = [p for p in PS_DIR.glob("*.py") if p.name not in ("session.py", "client.py", "__init__.py")]
    offenders = [f"{p.name}:{line} assigns .{name}" for p in server_side if p.name != OWNERS[component]
                 for name, line in _assignments(p) if name in facts]
    assert not offenders, offenders


def _busy_store(policy):
    store = ParameterStore(policy, num_workers=3)
    svc = ParameterService(store)
    svc.call("Init", {"a": np.ones((2, 2), np.float32), "b": np.zeros(3, np.float32)}, worker=0,
             specs=[s.to_dict() for s in SPECS], num_workers=3, tables=[TABLE])
    svc.call("Heartbeat", worker=1)
    svc.call("Done", worker=2)
    svc.call("Control", drain=[1], total_batches=50)
    svc.call("SetExcluded", worker=0, excluded=[1])
    if policy.path == "update":
        svc.call("Push", {"b": np.ones(3, np.float32)}, worker=1, clock=1, loss=0.5, steps=3)
    else:
        svc.call("PushGradients", {"b": np.ones(3, np.float32)}, worker=0, step=0)
        # the snapshot workers re-sync from (a restore starts the barrier at it: the step in progress is redone)
        svc.call("PutState", {"b": np.full(3, 2.0, np.float32)}, worker=0, step=store.global_step)
    svc.call("PushRows", {"rows": np.array([1, 1, 4], np.int64), "grads": np.ones((3, 2), np.float32)},
             worker=0, key="t", **({"step": store.global_step} if policy.path == "gradient" else {}))
    return store


@pytest.mark.parametrize("policy", [SSPPolicy(2), DTSSPPolicy(), SyncReplicasPolicy(2, num_workers=3)],
                         ids=["ssp", "dtssp", "sync_replicas"])
def test_views_hold_what_the_schemas_declare_and_a_checkpoint_round_trips(policy):
    store = _busy_store(policy)
    components = {DenseVariables: store.variables, GradientBarrier: store.barrier, Membership: store.members}
    state, status = store.state(), store.status()
    step, meta, arrays = store.checkpoint_state()
    for component in components:
        for f in component.FIELDS:
            assert f.name in state
            assert (f.name in status) == f.status, f.name
            assert (f.name in meta) == f.checkpoint, f.name
    fresh = ParameterStore(None, num_workers=3)
    fresh.restore(meta, arrays)
    step2, meta2, arrays2 = fresh.checkpoint_state()
    assert step2 == step
    assert {k: v for k, v in meta2.items() if k != "incarnation"} == \
        {k: v for k, v in meta.items() if k != "incarnation"}
    assert set(arrays2) == set(arrays) and all(np.array_equal(arrays[k], arrays2[k]) for k in arrays)
