"""A real PS process (python -m tfdist.ps) refuses bad input and keeps its values."""

import subprocess
import time

import grpc
import numpy as np
import pytest

from tfdist.config import JobConfig
from tfdist.errors import AuthError, PSRejectedError, PSUnavailableError
from tfdist.ps.client import PSClient
from tfdist.ps.placement import RoundRobinPlacement, VariableSpec
from tfdist.ps.server import SERVICE
from tfdist.ps.session import WorkerSession
from tfdist.testing import LocalCluster

SPECS = [VariableSpec("0000/w", "float32", (4, 3)), VariableSpec("0001/b", "float32", (3,)), VariableSpec("0002/e", "float32", (64, 8))]


def _values():
    rng = np.random.default_rng(0)
    return {s.key: rng.standard_normal(s.shape).astype("float32") for s in SPECS}


@pytest.fixture
def cluster():
    cfg = JobConfig.from_dict({"ps": {"max_message_bytes": 64 * 1024, "startup_timeout_s": 20}})
    with LocalCluster(workers=2, ps=2, config=cfg) as c:
        c.start_ps()
        yield c


def _session(cluster, worker, chief, specs=SPECS, startup=20.0):
    plan = RoundRobinPlacement(partition_threshold_bytes=1024).place(specs, 2)
    return WorkerSession(cluster.client(), specs, plan, worker, chief, startup_timeout_s=startup, heartbeat_interval_s=None,
                         num_workers=2)


def _state(cluster):
    with cluster.client() as c:
        out = {}
        for ps in range(2):
            meta, tensors = c.call(ps, "Pull", {"worker": -1})
            out[ps] = (meta["version"], {k: v.copy() for k, v in tensors.items()})
        return out


def _assert_same(a, b):
    for ps in a:
        assert a[ps][0] == b[ps][0]
        for k in a[ps][1]:
            np.testing.assert_array_equal(a[ps][1][k], b[ps][1][k])


def test_init_pull_push_across_two_ps(cluster):
    chief, other = _session(cluster, 0, True), _session(cluster, 1, False)
    values = _values()
    assert chief.initialize(values) is None
    got = other.initialize({})
    for k in values:
        np.testing.assert_array_equal(got[k], values[k])
    # the partitioned variable really lives on both PS tasks
    assert {ps for _, ps, rows in chief.plan.as_table() if rows} == {0, 1}
    fresh = other.sync({k: v + 1 for k, v in got.items()})
    for k in values:
        np.testing.assert_allclose(fresh[k], values[k] + 1)
    np.testing.assert_allclose(chief.pull()["0002/e"], values["0002/e"] + 1)
    chief.close(done=False), other.close(done=False)


@pytest.mark.parametrize(
    "tensors, match",
    [
        ({"nope": np.zeros(3, np.float32)}, "Unknown variable"),
        ({"0000/w": np.zeros((4, 3), np.int32)}, "Wrong dtype"),
        ({"0000/w": np.zeros((3, 4), np.float32)}, "Wrong shape"),
        ({"0000/w": np.ones((4, 3), np.float32), "0002/e/part_0": np.zeros((5, 8), np.float32)}, "Wrong shape"),
    ],
)
def test_bad_push_is_refused_and_changes_nothing(cluster, tensors, match):
    chief = _session(cluster, 0, True)
    chief.initialize(_values())
    before = _state(cluster)
    with cluster.client() as c, pytest.raises(PSRejectedError, match=match) as e:
        c.call(0, "Push", {"worker": 1, "clock": 0}, tensors)
    assert "ps:0 at 127.0.0.1:" in str(e.value)
    _assert_same(before, _state(cluster))
    chief.close(done=False)


def test_oversize_message_refused(cluster):
    chief = _session(cluster, 0, True)
    chief.initialize(_values())
    before = _state(cluster)
    with cluster.client() as c, pytest.raises(PSRejectedError, match="(?i)larger than max|exceed|resource"):
        c.call(0, "Push", {"worker": 1}, {"0000/w": np.zeros((128, 1024), np.float32)})
    _assert_same(before, _state(cluster))
    chief.close(done=False)


def test_malformed_bytes_refused(cluster):
    with grpc.insecure_channel(cluster.config.cluster.ps[0]) as ch:
        call = ch.unary_unary(f"/{SERVICE}/Status")
        with pytest.raises(grpc.RpcError) as e:
            call(b"garbage", timeout=5, metadata=(("tfdist-token", cluster.token),))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "magic" in e.value.details()


@pytest.mark.parametrize("token", [None, "wrong-token-0000"])
def test_client_without_the_token_is_refused(cluster, token):
    chief = _session(cluster, 0, True)
    chief.initialize(_values())
    before = _state(cluster)
    with PSClient(cluster.config.cluster.ps, token, rpc_timeout_s=5) as bad:
        with pytest.raises(AuthError, match="token"):
            bad.call(0, "Push", {"worker": 1}, {"0001/b": np.ones(3, np.float32)})
        with pytest.raises(AuthError):
            bad.call(1, "Pull", {"worker": 1})
    _assert_same(before, _state(cluster))
    chief.close(done=False)


def test_worker_with_a_different_model_is_refused(cluster):
    _session(cluster, 0, True).initialize(_values())
    other_specs = [VariableSpec("0000/w", "float32", (4, 4))] + SPECS[1:]
    with pytest.raises(PSRejectedError, match="differ"):
        _session(cluster, 1, False, specs=other_specs).initialize({})


def test_worker_waits_for_the_chief_with_a_bound(cluster):
    start = time.monotonic()
    with pytest.raises(PSUnavailableError, match="not initialised by the chief within 1 s"):
        _session(cluster, 1, False, startup=1.0).initialize({})
    assert time.monotonic() - start < 30


def test_brief_status_leaves_out_only_the_specs(cluster):
    chief = _session(cluster, 0, True)
    chief.initialize(_values())
    with cluster.client() as c:
        full, _ = c.call(0, "Status", {})
        brief, _ = c.call(0, "Status", {"brief": True})
    assert full["specs"]  # the variables (or pieces) this PS holds
    assert "specs" not in brief and set(full) - set(brief) == {"specs"}
    assert brief["initialized"] is True and brief["task_index"] == 0
    chief.close(done=False)


def test_unreachable_ps_fails_in_bounded_time_naming_the_address():
    from tfdist.cluster.local import free_port

    addr = f"127.0.0.1:{free_port()}"
    with PSClient([addr], "tok-tok-tok", rpc_timeout_s=1.0) as c:
        with pytest.raises(PSUnavailableError, match=f"ps:0 at {addr}.*ps.startup_timeout_s"):
            c.wait_ready(1.0)
        with pytest.raises(PSUnavailableError, match=f"ps:0 at {addr}.*ps.rpc_timeout_s"):
            c.call(0, "Status", {})


def test_dead_ps_is_reported_not_hung(cluster):
    chief = _session(cluster, 0, True)
    chief.initialize(_values())
    cluster.kill("ps:1")
    start = time.monotonic()
    with pytest.raises(PSUnavailableError, match="ps:1"):
        chief.sync({k: v + 1 for k, v in _values().items()})
    assert time.monotonic() - start < 60
    chief.close(done=False)


def test_ps_stops_when_every_worker_is_done(cluster):
    a, b = _session(cluster, 0, True), _session(cluster, 1, False)
    a.initialize(_values())
    b.initialize({})
    a.close(done=True)
    assert cluster.process("ps:0").running
    b.close(done=True)
    assert cluster.process("ps:0").wait(10) == 0 and cluster.process("ps:1").wait(10) == 0


def test_tls(tmp_path):
    from tfdist.consistency import AsyncPolicy
    from tfdist.ps.server import PSServer, load_tls_server_credentials

    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )
    creds = load_tls_server_credentials(str(cert), str(key))
    with PSServer(AsyncPolicy(), token="tls-token-123", tls_credentials=creds) as server:
        with PSClient([server.address], "tls-token-123", rpc_timeout_s=5, tls_ca=str(cert)) as c:
            meta, _ = c.call(0, "Status", {})
            assert meta["initialized"] is False
            # TLS keeps every call on gRPC: the server offers no plain stream port, the client never uses one
            assert meta["stream_port"] is None and server._stream is None and not c.stream
        with PSClient([server.address], "tls-token-123", rpc_timeout_s=2) as plain:  # no TLS: cannot talk
            with pytest.raises(PSUnavailableError):
                plain.call(0, "Status", {})


def _self_signed(tmp_path, name):
    key, cert = tmp_path / f"{name}-key.pem", tmp_path / f"{name}-cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )
    return str(cert), str(key)


def test_a_wrong_tls_ca_is_named_when_the_ps_cannot_be_reached(tmp_path):
    from tfdist.consistency import AsyncPolicy
    from tfdist.errors import TLSConfigError
    from tfdist.ps.server import PSServer, load_tls_server_credentials

    cert, key = _self_signed(tmp_path, "ps")
    other_ca, _ = _self_signed(tmp_path, "other")  # did not sign the PS's certificate
    with PSServer(AsyncPolicy(), token="tls-token-123", tls_credentials=load_tls_server_credentials(cert, key)) as server:
        with PSClient([server.address], "tls-token-123", rpc_timeout_s=2, tls_ca=other_ca) as c:
            t0 = time.monotonic()
            with pytest.raises(TLSConfigError) as e:  # a TLS probe names it (test_tls_errors.py has every case)
                c.wait_ready(2.0)
            assert time.monotonic() - t0 < 10
    message = str(e.value)
    assert "TLS" in message and other_ca in message and "not signed" in message, message


def test_start_ps_names_a_parameter_server_that_died_at_start():
    import socket

    from tfdist.errors import LaunchError

    cfg = JobConfig.from_dict({"ps": {"startup_timeout_s": 120}})
    with LocalCluster(workers=1, ps=1, config=cfg) as c:
        host, port = c.config.cluster.ps[0].rsplit(":", 1)
        with socket.socket() as taken:  # someone else holds the PS's port: the PS cannot bind and exits
            taken.bind((host, int(port)))
            taken.listen()
            with pytest.raises(LaunchError, match=r"ps:0") as e:
                c.start_ps(ready_timeout=120)  # fails as soon as the PS exits, not after 120 s
    assert "Could not bind" in str(e.value) or "exit" in str(e.value)
