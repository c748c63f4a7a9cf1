"""Collective group membership and address scheme (pure, no TF)."""

import json

import pytest

from tfdist.collective import ENV_COLLECTIVE_ADDRESSES, CollectiveSetupError, resolve_group
from tfdist.collective.membership import peers_in_message

CLUSTER = {"chief": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222", "10.0.0.3:2222"], "ps": ["10.0.0.9:2222"]}


def test_members_in_worker_id_order_with_cluster_addresses():
    spec = resolve_group(CLUSTER, "worker", 1, environ={})
    assert [(m.worker_id, m.job, m.index, m.address) for m in spec.members] == [
        (0, "chief", 0, "10.0.0.1:2222"), (1, "worker", 0, "10.0.0.2:2222"), (2, "worker", 1, "10.0.0.3:2222")]
    assert spec.worker_id == 2 and spec.size == 3 and spec.leader == "/job:chief/replica:0/task:0"
    assert spec.jobs() == {"chief": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222", "10.0.0.3:2222"]}
    assert spec.me.device == "/job:worker/replica:0/task:1/device:CPU:0"


def test_port_offset_env_and_explicit_addresses_in_precedence():
    assert [m.address for m in resolve_group(CLUSTER, "chief", 0, port_offset=100, environ={}).members] == [
        "10.0.0.1:2322", "10.0.0.2:2322", "10.0.0.3:2322"]
    env = {ENV_COLLECTIVE_ADDRESSES: json.dumps(["h:1", "h:2", "h:3"])}
    assert [m.address for m in resolve_group(CLUSTER, "chief", 0, port_offset=100, environ=env).members] == [
        "h:1", "h:2", "h:3"]
    explicit = resolve_group(CLUSTER, "chief", 0, addresses=["a:1", "a:2", "a:3"], environ=env)
    assert [m.address for m in explicit.members] == ["a:1", "a:2", "a:3"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"job": "ps", "index": 0}, "not a training task"),
        ({"job": "worker", "index": 5}, "not a training task"),
        ({"job": "worker", "index": 0, "addresses": ["a:1"]}, "one collective address per training task"),
        ({"job": "worker", "index": 0, "addresses": ["a:1", "a:1", "a:2"]}, "must differ"),
        ({"job": "worker", "index": 0, "addresses": ["a:0", "a:1", "a:2"]}, "port in 1..65535"),
        ({"job": "worker", "index": 0, "port_offset": 70000}, "port_offset"),
    ],
)
def test_bad_groups_fail_fast(kwargs, match):
    with pytest.raises(CollectiveSetupError, match=match):
        resolve_group(CLUSTER, environ={}, **kwargs)


def test_unassigned_local_ports_are_rejected_with_a_fix():
    with pytest.raises(CollectiveSetupError, match="tfdist.launch"):
        resolve_group({"worker": ["127.0.0.1:0", "127.0.0.1:0"]}, "worker", 0, environ={})


def test_bad_env_json():
    with pytest.raises(CollectiveSetupError, match=ENV_COLLECTIVE_ADDRESSES):
        resolve_group(CLUSTER, "worker", 0, environ={ENV_COLLECTIVE_ADDRESSES: "[oops"})


def test_peers_named_in_tf_errors():
    spec = resolve_group(CLUSTER, "worker", 0, environ={})
    msg = ("{{function_node __wrapped__CollectiveGatherV2_device_/job:worker/replica:0/task:0/device:CPU:0}} "
           "Collective ops is aborted by: Error reported from /job:worker/task:1: The following tasks are "
           "unhealthy (stopped sending heartbeats):\n/job:chief/replica:0/task:0")
    assert peers_in_message(msg, spec) == (2, 0)
    assert peers_in_message("no task here", spec) == ()
