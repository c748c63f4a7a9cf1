"""init_worker_group in one process: no cluster, non-training tasks, one task, called too late."""

import numpy as np
import pytest

from tfdist.collective import CollectiveSetupError, get_worker_group, init_worker_group
from tfdist.collective.group import _reset_for_tests


@pytest.fixture(autouse=True)
def _fresh_group():
    _reset_for_tests()
    yield
    _reset_for_tests()


def test_no_tf_config_means_no_group(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert init_worker_group() is None and get_worker_group() is None


def test_ps_and_evaluator_join_no_group():
    cluster = {"worker": ["127.0.0.1:5001"], "ps": ["127.0.0.1:5002"], "evaluator": ["127.0.0.1:5003"]}
    assert init_worker_group(cluster, "ps:0") is None
    assert init_worker_group(cluster, "evaluator:0") is None


def test_single_training_task_is_a_local_group(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["127.0.0.1:5001"], "ps": ["127.0.0.1:5002"]}, '
                       '"task": {"type": "worker", "index": 0}}')
    group = init_worker_group()
    assert group is get_worker_group() and group.size == 1 and group.worker_id == 0
    assert group.all_gather([1.0, 2.0]).tolist() == [[1.0, 2.0]]
    assert np.array_equal(group.all_reduce_min([3.0]), [3.0])
    assert init_worker_group() is group  # idempotent with the same spec


def test_called_after_a_tf_op_fails_with_the_fix():
    import tensorflow as tf

    tf.constant(1.0)  # the process's TF context now exists
    with pytest.raises(CollectiveSetupError, match="top of the training script"):
        init_worker_group({"worker": ["127.0.0.1:5001", "127.0.0.1:5002"]}, "worker:0")
    assert get_worker_group() is None


@pytest.mark.parametrize("kwargs, match", [({"timeout_s": 0}, "timeout_s"), ({"task": None}, "without the task")])
def test_bad_arguments(kwargs, match):
    args = {"cluster": {"worker": ["127.0.0.1:5001", "127.0.0.1:5002"]}, "task": "worker:0", **kwargs}
    with pytest.raises(CollectiveSetupError, match=match):
        init_worker_group(**args)
