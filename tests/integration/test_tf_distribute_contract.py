"""The tf.distribute contract a tutorial's script relies on, answered as MultiWorkerMirroredStrategy answers it (#25).

Each strategy runs ``scripts/contract_worker.py`` on 2 real worker processes
(``LocalCluster``); TF's ``MultiWorkerMirroredStrategy`` runs the same probes
in the same test session as the reference. Asserted per strategy: ``reduce``
SUM/MEAN across workers (eager, in ``tf.function``, with ``axis=0`` and
unequal batches), ``replica_id_in_sync_group``, ``num_replicas_in_sync``, the
cluster resolver, ``should_checkpoint``, ``strategy.run`` of a function
returning ``None`` or a nested structure, ``is_chief``, ``strategy.barrier``,
and (AllReduce) a model built after the first training step starting from
worker 0's weights.
"""

import json
import os

import pytest

from tfdist.testing import LocalCluster

pytestmark = pytest.mark.timeout(300)

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "contract_worker.py")


def _run(name, root):
    out = root / name
    out.mkdir()
    ps = 0 if name in ("mwms", "all_reduce") else 1  # MWMS refuses a TF_CONFIG with a ps job
    with LocalCluster(workers=2, ps=ps, log_dir=str(out / "logs")) as cluster:
        cluster.start(SCRIPT, ["--strategy", name, "--out", str(out)])
        try:
            cluster.wait(240)
        finally:
            logs = {t: cluster.log(t)[-3000:] for t in ("worker:0", "worker:1")}
    results = []
    for me in (0, 1):
        path = out / f"{name}-worker-{me}.json"
        assert path.exists(), logs
        results.append(json.loads(path.read_text()))
    return results


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("contract")
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = _run(name, root)
        return cache[name]

    return get


#: What every strategy answers exactly as MultiWorkerMirroredStrategy does.
SAME_AS_MWMS = ("resolver", "num_replicas_in_sync", "should_checkpoint", "should_save_summary", "replica_id",
                "eager", "graph", "axis0", "run_none_ok", "nested", "none_eager", "dataset_DATA", "dataset_OFF")


@pytest.mark.parametrize("name", ["all_reduce", "bsp"])
def test_synchronous_strategies_answer_as_multi_worker_mirrored(runs, name):
    mwms, mine = runs("mwms"), runs(name)
    assert mwms[0]["eager"]["sum"] == 3.0 and mwms[1]["replica_id"] == [1]  # the reference itself
    for me in (0, 1):
        for key in SAME_AS_MWMS:
            assert mine[me][key] == mwms[me][key], (name, me, key, mine[me][key], mwms[me][key])
        assert mine[me]["is_chief"] == (me == 0) and mine[me]["barrier"], mine[me]
        # An explicit auto-shard policy gets MultiWorkerMirroredStrategy's input (asserted equal above):
        # DATA: this worker's half of each global batch, every other one; OFF: the half, of every batch.
        assert mine[me]["dataset_DATA"] == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]][me], mine[me]
        assert mine[me]["dataset_default"] == [[0, 1, 2, 3], [4, 5, 6, 7]], mine[me]  # AUTO: as the script built it


def test_all_reduce_copies_a_model_built_after_the_first_step_from_worker_0(runs):
    w0, w1 = runs("all_reduce")
    for i in (0, 1):  # each worker seeded its model differently; after fit they are one model
        assert w0[f"model_{i}_kernel"] == w1[f"model_{i}_kernel"], i


def test_async_workers_are_sync_groups_of_one(runs):
    """Update path: num_replicas_in_sync = 1, so a reduce is over this worker's one replica (README)."""
    for me, r in enumerate(runs("async")):
        assert r["num_replicas_in_sync"] == 1 and r["replica_id"] == [0], r
        assert r["eager"] == {"sum": 1.0, "mean": 1.0, "local": [1.0]}, r
        assert r["resolver"] == {"task_type": "worker", "task_id": me, "workers": 2}, r
        assert r["should_checkpoint"] == (me == 0) and r["is_chief"] == (me == 0) and r["barrier"], r
        assert r["run_none_ok"] and r["none_eager"] and r["nested"] == {"a": 1.0, "b0": [2.0, 3.0], "b1": 4}, r
        # One replica per worker: no batch split; an explicit DATA policy shards whole batches between workers.
        assert r["dataset_DATA"] == [[[0, 1, 2, 3]], [[4, 5, 6, 7]]][me], r
        assert r["dataset_default"] == r["dataset_OFF"] == [[0, 1, 2, 3], [4, 5, 6, 7]], r
