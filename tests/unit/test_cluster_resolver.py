"""tfdist.cluster.resolve_cluster: one precedence rule for every entry point; the call sites use it."""

import doctest
import json

import pytest

from tfdist.cluster import resolver
from tfdist.cluster.resolver import resolve_cluster
from tfdist.config import JobConfig, TaskSpec
from tfdist.errors import ConfigError

CLUSTER = {"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "ps": ["p:1"], "evaluator": ["e:1"]}
TF_CONFIG = json.dumps({"cluster": {"worker": ["a:1", "b:1"], "ps": ["p:9"]}, "task": {"type": "worker", "index": 1}})


def test_doctests():
    assert doctest.testmod(resolver).failed == 0


def test_no_cluster_is_a_single_process():
    r = resolve_cluster(env={})
    assert r.task is None and r.is_single_process and r.worker_id is None and r.num_workers == 1
    assert r.source == "none" and isinstance(r.config, JobConfig)
    with pytest.raises(ConfigError, match="TF_CONFIG is not set"):
        resolve_cluster(env={}, required=True)


def test_arguments_win_over_the_environment():
    env = {"TF_CONFIG": TF_CONFIG}
    r = resolve_cluster(CLUSTER, "worker:1", env=env)
    assert r.source == "arguments" and r.task == TaskSpec("worker", 1) and r.worker_id == 2  # chief is 0
    assert r.config.cluster.ps == ["p:1"] and r.num_workers == 3
    assert resolve_cluster(task="worker:0", env=env).task == TaskSpec("worker", 0)  # task argument wins


def test_tf_config_cluster_wins_over_a_config_file_cluster_and_keeps_its_options():
    options = JobConfig.from_dict({"cluster": {"worker": ["x:1"], "ps": ["y:1"]}, "ps": {"rpc_timeout_s": 7}})
    r = resolve_cluster(config=options, env={"TF_CONFIG": TF_CONFIG})
    assert r.source == "tf_config" and r.task == TaskSpec("worker", 1) and r.worker_id == 1
    assert r.config.cluster.worker == ["a:1", "b:1"] and r.config.ps.rpc_timeout_s == 7
    env = {"TF_CONFIG": TF_CONFIG, "TFDIST_CONFIG": options.to_json()}  # the launcher sets both
    r = resolve_cluster(env=env)
    assert r.config.cluster.ps == ["p:9"] and r.config.ps.rpc_timeout_s == 7


def test_a_config_with_a_task_and_no_tf_config():
    r = resolve_cluster(task="ps:0", config={"cluster": CLUSTER}, env={})
    assert r.source == "config" and r.task == TaskSpec("ps", 0) and r.worker_id is None
    assert resolve_cluster(config={"cluster": CLUSTER}, env={}).task is None  # no task: no cluster


@pytest.mark.parametrize("kwargs, match", [
    ({"cluster": CLUSTER}, "without the task"),
    ({"cluster": CLUSTER, "task": 3}, "TaskSpec"),
    ({"cluster": CLUSTER, "task": "worker"}, "JOB:INDEX"),
    ({"cluster": {"boss": ["a:1"]}, "task": "worker:0"}, "unknown job names"),
])
def test_bad_arguments_say_how_to_fix(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        resolve_cluster(env={}, **kwargs)


def test_bad_tf_config_is_refused():
    with pytest.raises(ConfigError, match="not valid JSON"):
        resolve_cluster(env={"TF_CONFIG": "{nope"})


def test_call_sites_resolve_the_same_way(monkeypatch):
    from tfdist.collective.group import _training_tasks as _training_tasks_in_tf_config
    from tfdist.ps.__main__ import main as ps_main
    from tfdist.strategies.parameter_server import _resolve

    monkeypatch.setenv("TF_CONFIG", TF_CONFIG)
    monkeypatch.delenv("TFDIST_CONFIG", raising=False)
    config, task = _resolve(None, None, None)
    assert task == TaskSpec("worker", 1) and config.cluster.worker == ["a:1", "b:1"]
    assert _training_tasks_in_tf_config() == 2
    monkeypatch.setenv("TF_CONFIG", "{nope")
    assert _training_tasks_in_tf_config() == 0  # the detector stays lenient: it runs as one process
    monkeypatch.delenv("TF_CONFIG")
    assert _resolve(None, None, None)[1] is None
    assert ps_main([]) == 78  # no cluster: an error that says how to start one; exit 78 (a config error, never restarted)
