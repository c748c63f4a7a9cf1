"""``strategy.distribute_datasets_from_function``: the InputContext a dataset function sees (issue #15 item 6).

Only the context is inspected: the strategies are built for a job whose
parameter servers are never contacted.
"""

import numpy as np
import pytest

TOKEN = "a-token-123"


def _ps_strategy(monkeypatch, workers, task, **strategy):
    import tfdist

    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TFDIST_CONFIG", raising=False)
    cluster = {"worker": [f"127.0.0.1:{10 + i}" for i in range(workers)], "ps": ["127.0.0.1:1"],
               "evaluator": ["127.0.0.1:2"]}
    return tfdist.ParameterServerStrategy(config={"cluster": cluster, "strategy": strategy}, task=task, token=TOKEN)


def _contexts(strategy):
    """``(the InputContext the function saw, the distributed dataset's first local batch)``."""
    import tensorflow as tf

    seen = []

    def dataset_fn(ctx):
        seen.append(ctx)
        batch = ctx.get_per_replica_batch_size(8)
        return tf.data.Dataset.range(32).shard(ctx.num_input_pipelines, ctx.input_pipeline_id).batch(batch)

    dist = strategy.distribute_datasets_from_function(dataset_fn)
    first = next(iter(dist))
    return seen[0], np.asarray(first).tolist()


@pytest.mark.parametrize("consistency, workers, m, replicas", [
    ("bsp", 2, None, 2),
    ("sync_replicas", 3, 2, 2),  # N = 3 input pipelines, M = 2 replicas aggregated per step
    ("async", 2, None, 1),  # update path: every worker is its own replica (full-rate updates)
    ("ssp", 2, None, 1),
])
def test_ps_strategies_give_each_training_worker_its_own_pipeline(monkeypatch, consistency, workers, m, replicas):
    for worker in range(workers):
        extra = {} if m is None else {"replicas_to_aggregate": m}
        strategy = _ps_strategy(monkeypatch, workers, f"worker:{worker}", consistency=consistency, **extra)
        try:
            assert strategy.num_replicas_in_sync == replicas
            ctx, batch = _contexts(strategy)
            assert (ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync) == (
                workers, worker, replicas)
            assert ctx.get_per_replica_batch_size(8) == 8 // replicas
            assert batch == list(range(worker, 32, workers))[:8 // replicas]  # its shard, its share of the batch
        finally:
            strategy.shutdown()


def test_an_evaluator_reads_the_whole_dataset(monkeypatch):
    strategy = _ps_strategy(monkeypatch, 2, "evaluator:0", consistency="bsp")
    try:
        ctx, batch = _contexts(strategy)
        assert (ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync) == (1, 0, 2)
        assert batch == [0, 1, 2, 3]
    finally:
        strategy.shutdown()


def test_a_single_process_strategy_is_one_pipeline(monkeypatch):
    import tfdist

    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TFDIST_CONFIG", raising=False)
    strategy = tfdist.ParameterServerStrategy(consistency="bsp")  # in-process PS, one worker
    try:
        ctx, batch = _contexts(strategy)
        assert (ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync) == (1, 0, 1)
        assert batch == list(range(8))
    finally:
        strategy.shutdown()


@pytest.mark.parametrize("worker", [0, 1])
def test_all_reduce_strategy_gives_each_worker_its_own_pipeline(worker):
    import tfdist
    from tfdist.collective.group import WorkerGroup
    from tfdist.collective.membership import resolve_group

    # A group of two that never runs a collective (only the context is inspected).
    group = WorkerGroup(resolve_group({"worker": ["127.0.0.1:10", "127.0.0.1:11"]}, "worker", worker), enabled=False)
    strategy = tfdist.AllReduceStrategy(group)
    ctx, batch = _contexts(strategy)
    assert (ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync) == (2, worker, 2)
    assert batch == list(range(worker, 32, 2))[:4]
