"""Config dataclasses: YAML files, dict round trip, ClusterSpec, TF_CONFIG, errors."""

import dataclasses
import glob
import json
import os

import pytest

from tfdist.config import ClusterConfig, JobConfig, TaskSpec, load_config, parse_task
from tfdist.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml"))), ids=os.path.basename)
def test_every_shipped_config_loads(path):
    if os.path.basename(path).startswith("fl_"):  # federated experiments: tfdist.federated.config
        from tfdist.federated.config import ExperimentConfig, load_experiment

        experiment = load_experiment(path)
        assert ExperimentConfig.from_dict(experiment.to_dict()).to_dict() == experiment.to_dict()
        return
    cfg = load_config(path)
    assert JobConfig.from_dict(cfg.to_dict()) == cfg
    from tfdist.cluster.local import check_local_task_count

    if cfg.cluster.is_local():
        check_local_task_count(cfg, limit=64)


def test_counts_become_unassigned_local_addresses():
    cfg = JobConfig.from_dict({"cluster": {"ps": 2, "worker": 3}})
    assert cfg.cluster.ps == ["127.0.0.1:0"] * 2
    assert cfg.cluster.num_workers == 3
    assert cfg.cluster.is_unassigned() and cfg.cluster.is_local()


def test_round_trip_dict_json_and_tf_config():
    cfg = JobConfig.from_dict(
        {"name": "j", "cluster": {"chief": ["h0:1"], "worker": ["h1:1", "h2:1"], "ps": ["h3:1"]}, "ps": {"placement": "greedy"}}
    )
    assert JobConfig.from_json(cfg.to_json()) == cfg
    tfc = cfg.tf_config(TaskSpec("worker", 1))
    assert tfc == {"cluster": {"chief": ["h0:1"], "worker": ["h1:1", "h2:1"], "ps": ["h3:1"]}, "task": {"type": "worker", "index": 1}}
    again, task = JobConfig.from_tf_config(json.dumps(tfc))
    assert again.cluster == cfg.cluster and task == TaskSpec("worker", 1)
    # chief is worker 0, workers follow
    assert [cfg.cluster.worker_id(j, i) for j, i in cfg.cluster.training_tasks()] == [0, 1, 2]
    assert cfg.cluster.worker_id("worker", 1) == 2


def test_cluster_spec_round_trip():
    import tensorflow as tf

    cluster = ClusterConfig(worker=["a:1", "b:2"], ps=["c:3"])
    spec = cluster.to_cluster_spec()
    assert isinstance(spec, tf.train.ClusterSpec)
    assert ClusterConfig.from_cluster_spec(spec) == cluster


@pytest.mark.parametrize(
    "data, field",
    [
        ({"cluster": {"ps": 1, "worker": 0}}, "cluster.worker"),
        ({"cluster": {"ps": ["nohost"], "worker": 1}}, "cluster.ps[0]"),
        ({"cluster": {"ps": 1, "worker": 1, "chief": 2}}, "cluster.chief"),
        ({"cluster": {"ps": 1, "worker": 1}, "ps": {"placement": "random"}}, "ps.placement"),
        ({"cluster": {"ps": 1, "worker": 1}, "ps": {"rpc_timeout_s": -1}}, "ps.rpc_timeout_s"),
        ({"cluster": {"ps": 1, "worker": 1}, "ps": {"partition_threshold_bytes": 0}}, "ps.partition_threshold_bytes"),
        ({"cluster": {"ps": 1, "worker": 1}, "ps": {"resident_threshold_bytes": 0}}, "ps.resident_threshold_bytes"),
        ({"cluster": {"ps": 1, "worker": 1}, "ps": {"resident_threshold_bytes": "1 MB"}}, "ps.resident_threshold_bytes"),
        ({"cluster": {"ps": 1, "worker": 1}, "ps": {"resident_threshold_bytes": True}}, "ps.resident_threshold_bytes"),
        ({"cluster": {"ps": 1, "worker": 1}, "strategy": {"consistency": "magic"}}, "strategy.consistency"),
        ({"cluster": {"ps": 1, "worker": 1}, "ps": {"placment": "greedy"}}, "ps.placment"),
        ({"cluster": {"ps": 1, "worker": 1}, "security": {"tls_cert": "a.pem"}}, "security.tls_cert"),
        ({"clutser": {}}, "clutser"),
        ({"cluster": {"ps": 1, "worker": 1}, "launch": {"threads_per_task": 0}}, "launch.threads_per_task"),
        ({"cluster": {"ps": 1, "worker": 1}, "strategy": {"exchange_every": 0}}, "strategy.exchange_every"),
        ({"cluster": {"ps": 1, "worker": 1}, "strategy": {"exchange_every": 2.5}}, "strategy.exchange_every"),
        ({"cluster": {"ps": 1, "worker": 2}, "strategy": {"consistency": "bsp", "exchange_every": 4}},
         "strategy.exchange_every"),
        ({"cluster": {"ps": 1, "worker": 1}, "launch": {"threads_per_task": "all"}}, "launch.threads_per_task"),
        ({"cluster": {"ps": 1, "worker": 1}, "strategy": {"exchange_every": "often"}}, "strategy.exchange_every"),
        ({"cluster": {"ps": 1, "worker": 2}, "strategy": {"consistency": "bsp", "exchange_every": "auto"}},
         "strategy.exchange_every"),
        ({"cluster": {"ps": 1, "worker": 1}, "strategy": {"exchange_every_max": 0}}, "strategy.exchange_every_max"),
        ({"cluster": {"ps": 1, "worker": 1}, "strategy": {"exchange_every_max": True}}, "strategy.exchange_every_max"),
        ({"cluster": {"ps": 1, "worker": 1}, "ps": {"stream_port": 0}}, "ps.stream_port"),
        ({"cluster": {"ps": 1, "worker": 1}, "ps": {"stream_port": 70000}}, "ps.stream_port"),
        ({"cluster": {"ps": 1, "worker": 1}, "ps": {"stream_port": "2223"}}, "ps.stream_port"),
        ({"cluster": {"ps": 1, "worker": 1}, "ps": {"stream_port": True}}, "ps.stream_port"),
        ({"cluster": {"ps": 1, "worker": 1}, "ps": {"shared_memory": "yes"}}, "ps.shared_memory"),
        ({"cluster": {"ps": 1, "worker": 1}, "ps": {"shared_memory": 1}}, "ps.shared_memory"),
    ],
)
def test_bad_fields_are_named(data, field):
    with pytest.raises(ConfigError) as e:
        JobConfig.from_dict(data)
    assert f"`{field}`" in str(e.value)


def test_yaml_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster: {ps: [1, 2\n")
    with pytest.raises(ConfigError, match="bad.yaml"):
        load_config(bad)
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("cluster:\n  ps: 1\n  worker: 1\nps:\n  placement: diagonal\n")
    with pytest.raises(ConfigError, match=r"wrong.yaml.*ps.placement.*diagonal"):
        load_config(wrong)
    with pytest.raises(ConfigError, match="Cannot read"):
        load_config(tmp_path / "missing.yaml")


def test_token_never_shown_in_repr():
    cfg = JobConfig.from_dict({"cluster": {"ps": 1, "worker": 1}, "security": {"token": "supersecret123"}})
    assert "supersecret123" not in repr(cfg)
    with pytest.raises(ConfigError) as e:
        JobConfig.from_dict({"cluster": {"ps": 1, "worker": 1}, "security": {"token": "short"}})
    assert "short" not in str(e.value)


def test_explicit_token_wins_over_environment(monkeypatch):
    monkeypatch.setenv("TFDIST_TOKEN", "from-the-env-123")
    assert JobConfig().security.resolve_token() == "from-the-env-123"
    cfg = JobConfig.from_dict({"security": {"token": "explicit-token-1"}})
    assert cfg.security.resolve_token() == "explicit-token-1"


def test_parse_task():
    assert parse_task("worker:3") == TaskSpec("worker", 3)
    for bad in ("worker", "worker:x", "boss:0"):
        with pytest.raises(ConfigError):
            parse_task(bad)


def test_tf_config_errors(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ConfigError, match="TF_CONFIG is not set"):
        JobConfig.from_tf_config()
    with pytest.raises(ConfigError, match="not valid JSON"):
        JobConfig.from_tf_config("{nope")
    with pytest.raises(ConfigError, match='"cluster"'):
        JobConfig.from_tf_config("{}")
    with pytest.raises(ConfigError, match="unknown job names"):
        JobConfig.from_tf_config({"cluster": {"boss": ["a:1"], "ps": ["b:1"], "worker": ["c:1"]}})


@pytest.mark.parametrize(
    "name, expected",
    [
        ("local_async.yaml", {"policy": "async"}),
        ("local_bsp.yaml", {"policy": "bsp", "replicas_to_aggregate": 2}),
        ("local_sync_replicas.yaml", {"policy": "sync_replicas", "replicas_to_aggregate": 3}),
        ("local_ssp.yaml", {"policy": "ssp", "staleness": 3, "refresh_every_step": False}),
        ("local_dtssp.yaml", {"policy": "dtssp", "min_staleness": 3, "max_staleness": 10, "window": 10, "delta": 0.01}),
    ],
)
def test_mode_configs_select_their_policy(name, expected):
    from tfdist.consistency import policy_from_spec

    cfg = load_config(os.path.join(ROOT, "configs", name))
    spec = cfg.strategy.policy_spec(cfg.cluster.num_workers)
    assert spec == expected
    assert policy_from_spec(spec, cfg.cluster.num_workers).spec() == expected


def test_more_replicas_to_aggregate_than_workers_is_refused():
    strategy = JobConfig.from_dict({"strategy": {"consistency": "sync_replicas"}}).strategy
    strategy.replicas_to_aggregate = 3
    with pytest.raises(ConfigError, match="accumulating across steps"):
        strategy.policy_spec(2)


def test_slowdown_and_input_args_validated():
    cfg = JobConfig.from_dict({"launch": {"slowdown": {"worker:1": {"factor": 3}}, "input_args": ["--queue", "fifo"]}})
    assert cfg.launch.slowdown == {"worker:1": {"factor": 3}} and cfg.launch.input_args == ["--queue", "fifo"]
    with pytest.raises(ConfigError, match="launch.slowdown.worker:1"):
        JobConfig.from_dict({"launch": {"slowdown": {"worker:1": {"factor": 0.5}}}})
    with pytest.raises(ConfigError, match="JOB:INDEX"):
        JobConfig.from_dict({"launch": {"slowdown": {"workerone": {"factor": 2}}}})


def test_a_cluster_without_ps_is_valid_but_the_ps_strategy_refuses_it():
    import tfdist

    cluster = ClusterConfig(worker=["127.0.0.1:1"])  # an all-reduce job
    assert cluster.jobs() == {"worker": ["127.0.0.1:1"]}
    with pytest.raises(ConfigError, match="cluster.ps.*needs at least one parameter-server task"):
        tfdist.ParameterServerStrategy(cluster=cluster, task="worker:0", token="a-token-123")


def test_local_threads_per_task_divides_the_cores_among_training_tasks():
    from tfdist.cluster.local import local_threads_per_task

    two = JobConfig.from_dict({"cluster": {"ps": 2, "worker": 2}})
    assert local_threads_per_task(two, cpus=2) == 1
    assert local_threads_per_task(two, cpus=16) == 8
    with_chief = JobConfig.from_dict({"cluster": {"ps": 1, "chief": 1, "worker": 2, "evaluator": 1}})
    assert local_threads_per_task(with_chief, cpus=16) == 4  # PS tasks do not run TensorFlow
    assert local_threads_per_task(with_chief, cpus=2) == 1  # never below one thread
    alone = JobConfig.from_dict({"cluster": {"ps": 1, "worker": 1}})
    assert local_threads_per_task(alone, cpus=2) is None  # one training task keeps TF's default
    fixed = JobConfig.from_dict({"cluster": {"ps": 1, "worker": 1}, "launch": {"threads_per_task": 3}})
    assert local_threads_per_task(fixed, cpus=2) == 3
    off = JobConfig.from_dict({"cluster": {"ps": 2, "worker": 2}, "launch": {"threads_per_task": None}})
    assert local_threads_per_task(off, cpus=2) is None


def test_local_launch_sets_intra_op_threads_only_on_training_tasks(monkeypatch, tmp_path):
    from tfdist.cluster.local import LocalJob

    monkeypatch.delenv("TF_NUM_INTRAOP_THREADS", raising=False)
    config = JobConfig.from_dict({"cluster": {"ps": 1, "worker": 2}, "launch": {"threads_per_task": 2}})
    job = LocalJob(config, script="train.py", log_dir=str(tmp_path), forward=False)
    assert job._make(TaskSpec("worker", 1)).env["TF_NUM_INTRAOP_THREADS"] == "2"
    assert "TF_NUM_INTRAOP_THREADS" not in job._make(TaskSpec("ps", 0)).env
    # The user's own setting wins, from the environment or from launch.env.
    monkeypatch.setenv("TF_NUM_INTRAOP_THREADS", "5")
    assert job._make(TaskSpec("worker", 0)).env["TF_NUM_INTRAOP_THREADS"] == "5"
    monkeypatch.delenv("TF_NUM_INTRAOP_THREADS")
    config = JobConfig.from_dict({"cluster": {"ps": 1, "worker": 2},
                                  "launch": {"env": {"TF_NUM_INTRAOP_THREADS": "7"}}})
    job = LocalJob(config, script="train.py", log_dir=str(tmp_path), forward=False)
    assert job._make(TaskSpec("worker", 0)).env["TF_NUM_INTRAOP_THREADS"] == "7"


# ----------------------------------------------------------------------------------------------------------
# Issue #12: every value a user types is checked at load, and the message names the field and the fix.

TWO = {"ps": 1, "worker": 2}


def _error(data) -> str:
    with pytest.raises(ConfigError) as e:
        JobConfig.from_dict(data)
    return str(e.value)


def test_replicas_to_aggregate_above_the_workers_is_refused_at_load():
    message = _error({"cluster": TWO, "strategy": {"consistency": "sync_replicas", "replicas_to_aggregate": 3}})
    assert "`strategy.replicas_to_aggregate`" in message and "replicas_to_aggregate=3" in message
    assert "2 worker" in message
    # the chief counts as a worker; an elastic job counts the workers it starts with
    JobConfig.from_dict({"cluster": {"ps": 1, "chief": 1, "worker": 2},
                         "strategy": {"consistency": "sync_replicas", "replicas_to_aggregate": 3}})
    assert "`strategy.replicas_to_aggregate`" in _error({
        "cluster": {"ps": 1, "worker": 4}, "strategy": {"consistency": "sync_replicas", "replicas_to_aggregate": 2},
        "elastic": {"min_workers": 1, "max_workers": 4, "initial_workers": 1}})


@pytest.mark.parametrize("cluster, field, other", [
    ({"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2222"]}, "cluster.ps[0]", "cluster.worker[0]"),
    ({"worker": ["h1:1", "h2:1", "h1:1"]}, "cluster.worker[2]", "cluster.worker[0]"),
    ({"chief": ["localhost:5000"], "worker": ["127.0.0.1:5000"]}, "cluster.worker[0]", "cluster.chief[0]"),
    ({"ps": ["Host-A:7"], "evaluator": ["host-a:7"], "worker": 1}, "cluster.evaluator[0]", "cluster.ps[0]"),
])
def test_the_same_address_twice_is_refused(cluster, field, other):
    message = _error({"cluster": cluster})
    assert f"`{field}`" in message and other in message and "own port" in message


def test_port_zero_and_counts_may_repeat():
    cfg = JobConfig.from_dict({"cluster": {"ps": 2, "worker": ["10.0.0.1:0", "10.0.0.2:0"]}})
    assert cfg.cluster.ps == ["127.0.0.1:0"] * 2


TIME_FIELDS = [
    ("ps", "rpc_timeout_s"), ("ps", "startup_timeout_s"), ("ps", "heartbeat_interval_s"),
    ("ps", "heartbeat_timeout_s"), ("launch", "job_timeout_s"), ("elastic", "drain_timeout_s"), ("elastic", "poll_s"),
]


@pytest.mark.parametrize("section, name", TIME_FIELDS)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), -1, 0, "30", True, [30], 1e12])
def test_timeouts_must_be_finite_positive_numbers(section, name, value):
    message = _error({section: {name: value}})
    assert f"`{section}.{name}`" in message and "seconds" in message


def test_timeouts_that_may_be_null_and_good_timeouts():
    assert JobConfig.from_dict({"launch": {"job_timeout_s": None}}).launch.job_timeout_s is None
    assert "`ps.rpc_timeout_s`" in _error({"ps": {"rpc_timeout_s": None}})
    cfg = JobConfig.from_dict({"ps": {"rpc_timeout_s": 0.5, "heartbeat_interval_s": 1, "heartbeat_timeout_s": 3},
                               "launch": {"job_timeout_s": 3600}, "elastic": {"poll_s": 0.1}})
    assert JobConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("data, field", [
    ({"strategy": {"delta": float("nan")}}, "strategy.delta"),
    ({"strategy": {"delta": True}}, "strategy.delta"),
    ({"ps": {"max_updates_per_s": float("nan")}}, "ps.max_updates_per_s"),
    ({"ps": {"max_updates_per_s": float("inf")}}, "ps.max_updates_per_s"),
    ({"elastic": {"efficiency_threshold": float("nan")}}, "elastic.efficiency_threshold"),
    ({"elastic": {"price_per_worker_s": float("inf")}}, "elastic.price_per_worker_s"),
    ({"security": {"token_env": 5}}, "security.token_env"),
    ({"security": {"token_env": ""}}, "security.token_env"),
    ({"launch": {"log_dir": 5}}, "launch.log_dir"),
    ({"launch": {"log_all_tasks": "yes"}}, "launch.log_all_tasks"),
    ({"launch": {"on_worker_failure": "ignore"}}, "launch.on_worker_failure"),
    ({"cluster": {"worker": 10 ** 12}}, "cluster.worker"),
])
def test_more_bad_values_are_named(data, field):
    assert f"`{field}`" in _error(data)


def test_a_heartbeat_interval_not_below_its_timeout_is_refused_naming_both():
    for interval, timeout in ((30, 30), (40, 30), (5, 2)):
        message = _error({"ps": {"heartbeat_interval_s": interval, "heartbeat_timeout_s": timeout}})
        assert "ps.heartbeat_interval_s" in message and "ps.heartbeat_timeout_s" in message
        assert f"ps.heartbeat_interval_s={interval}" in message and f"ps.heartbeat_timeout_s={timeout}" in message


ODD_VALUES = [None, True, -1, 0, 2.5, float("nan"), float("inf"), "x", "", [], [1], {}, {"a": 1}, 10 ** 30]


@pytest.mark.parametrize("section", ["cluster", "strategy", "ps", "security", "launch", "elastic", "kubernetes"])
def test_no_field_answers_an_odd_value_with_anything_but_a_config_error(section):
    """Every field, every odd value: the config loads or raises ConfigError naming the field; never a traceback."""
    from tfdist.config import _SECTIONS

    for f in dataclasses.fields(_SECTIONS[section]):
        for value in ODD_VALUES:
            data = {section: {f.name: value}}
            try:
                cfg = JobConfig.from_dict(data)
            except ConfigError as e:  # this field, or the one it is checked against
                assert f"`{section}." in str(e) or "`cluster.worker`" in str(e), (data, str(e))
            else:
                assert JobConfig.from_dict(cfg.to_dict()) == cfg, data


# ------------------------------------------------------------------------------------------------- TLS
def _pem(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(body)
    return str(path)


CERT = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
KEY = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"


def test_tls_files_are_checked(tmp_path):
    cert, key, ca = _pem(tmp_path, "cert.pem", CERT), _pem(tmp_path, "key.pem", KEY), _pem(tmp_path, "ca.pem", CERT)
    good = JobConfig.from_dict({"security": {"tls_cert": cert, "tls_key": key, "tls_ca": ca}})
    good.security.check_tls_files()
    cases = [
        ({"tls_ca": str(tmp_path / "missing.pem")}, "security.tls_ca", "does not exist"),
        ({"tls_ca": str(tmp_path)}, "security.tls_ca", "not a file"),
        ({"tls_ca": _pem(tmp_path, "junk.pem", "hello\n")}, "security.tls_ca", "not PEM"),
        ({"tls_cert": key, "tls_key": cert}, "security.tls_cert", "swap"),
        ({"tls_key": _pem(tmp_path, "ca-as-key.pem", CERT)}, "security.tls_key", "PRIVATE KEY"),
    ]
    for change, field, words in cases:
        sec = {"tls_cert": cert, "tls_key": key, "tls_ca": ca, **change}
        cfg = JobConfig.from_dict({"security": sec})
        with pytest.raises(ConfigError) as e:
            cfg.security.check_tls_files()
        message = str(e.value)
        assert f"`{field}`" in message and "TLS" in message and words in message, message
        assert repr(sec[field.split(".")[1]]) in message  # names the file
    # a parameter server needs only its certificate and key, a worker only the CA
    cfg = JobConfig.from_dict({"security": {"tls_cert": cert, "tls_key": key, "tls_ca": str(tmp_path / "no.pem")}})
    cfg.security.check_tls_files(job="ps")
    with pytest.raises(ConfigError, match="security.tls_ca"):
        cfg.security.check_tls_files(job="worker")


def test_an_unreadable_tls_file_is_named(tmp_path):
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        pytest.skip("root reads every file")
    ca = _pem(tmp_path, "ca.pem", CERT)
    os.chmod(ca, 0)
    cfg = JobConfig.from_dict({"security": {"tls_ca": ca, "tls_cert": ca, "tls_key": _pem(tmp_path, "k.pem", KEY)}})
    with pytest.raises(ConfigError, match=r"`security.tls_cert`.*TLS.*cannot be read"):
        cfg.security.check_tls_files()


def test_tls_needs_both_sides():
    assert "`security.tls_key`" in _error({"security": {"tls_cert": "c.pem", "tls_ca": "ca.pem"}})
    assert "`security.tls_cert`" in _error({"security": {"tls_key": "k.pem", "tls_ca": "ca.pem"}})
    message = _error({"security": {"tls_ca": "ca.pem"}})
    assert "`security.tls_ca`" in message and "TLS" in message and "tls_cert" in message
    message = _error({"security": {"tls_cert": "c.pem", "tls_key": "k.pem"}})
    assert "`security.tls_ca`" in message and "TLS" in message


# ------------------------------------------------------------------------------------------------ files
def test_a_config_file_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\u00e9\ncluster: {ps: 1, worker: 1}\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1.yaml.*not UTF-8.*line 1.*UTF-8"):
        load_config(path)
    bom = tmp_path / "bom.yaml"
    bom.write_bytes(b"\xef\xbb\xbfname: bom\n")
    assert load_config(bom).name == "bom"


@pytest.mark.parametrize("text, words", [
    ("- cluster\n- ps\n", "a list"),
    ("just words\n", "a str"),
    ("42\n", "an int"),
    ("1: 2\ncluster: {ps: 1, worker: 1}\n", "`1`"),
])
def test_a_config_file_that_is_not_a_mapping_is_named(tmp_path, text, words):
    path = tmp_path / "odd.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert "odd.yaml" in str(e.value) and words in str(e.value)


def test_an_empty_config_file_is_the_default_job(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing\n")
    assert load_config(path) == JobConfig()


def _laughs(levels=9, width=9):
    lines = ['a0: &a0 ["lol"]']
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + f"\nname: *a{levels}\n"


def test_a_yaml_alias_bomb_is_refused_quickly(tmp_path):
    import time

    path = tmp_path / "laughs.yaml"
    path.write_text(_laughs())
    assert len(path.read_text()) < 600
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"laughs.yaml.*alias"):
        load_config(path)
    assert time.monotonic() - t0 < 5
    recursive = tmp_path / "loop.yaml"
    recursive.write_text("name: &x [*x]\n")
    with pytest.raises(ConfigError, match=r"loop.yaml.*alias"):
        load_config(recursive)
    fine = tmp_path / "anchors.yaml"  # ordinary anchors and merges still work
    fine.write_text("cluster: {ps: &n 2, worker: *n}\nlaunch: &l {log_all_tasks: true}\n")
    assert load_config(fine).cluster.num_workers == 2


def test_a_huge_or_deep_config_file_is_refused(tmp_path):
    from tfdist.config import MAX_CONFIG_BYTES

    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(ConfigError, match=r"big.yaml.*larger than"):
        load_config(big)
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match=r"deep.yaml.*nest"):
        load_config(deep)


@pytest.mark.parametrize("under", ["", "/sub/dir"])
def test_a_checkpoint_dir_that_is_a_file_or_under_one_is_refused_where_a_ps_starts(tmp_path, under):
    from tfdist.ps.__main__ import build_server

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    cfg = JobConfig.from_dict({"cluster": {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]},
                               "ps": {"checkpoint_dir": str(blocker) + under}, "security": {"token": "t" * 16}})
    with pytest.raises(ConfigError, match=r"(?s)`ps.checkpoint_dir`.*(is a file|which is a file).*every checkpoint"):
        cfg.ps.check_checkpoint_dir()
    with pytest.raises(ConfigError, match="ps.checkpoint_dir"):
        build_server(cfg, TaskSpec("ps", 0))


@pytest.mark.parametrize("path", ["gs://bucket/run", "relative/new/dir", None])
def test_a_checkpoint_dir_that_can_be_a_directory_passes(tmp_path, monkeypatch, path):
    monkeypatch.chdir(tmp_path)
    JobConfig.from_dict({"ps": {"checkpoint_dir": path}}).ps.check_checkpoint_dir()
    (tmp_path / "existing").mkdir()
    JobConfig.from_dict({"ps": {"checkpoint_dir": str(tmp_path / "existing")}}).ps.check_checkpoint_dir()


def test_the_launcher_refuses_a_checkpoint_dir_that_is_a_file_with_exit_2(tmp_path, capsys):
    from tfdist.launch import main

    blocker = tmp_path / "file"
    blocker.write_text("x")
    cfg = tmp_path / "job.yaml"
    cfg.write_text(f"cluster: {{ps: 1, worker: 1}}\nps: {{checkpoint_dir: {blocker}/ckpt}}\n")
    script = tmp_path / "train.py"
    script.write_text("")
    assert main(["--config", str(cfg), str(script)]) == 2
    assert "Invalid config field `ps.checkpoint_dir`" in capsys.readouterr().err
