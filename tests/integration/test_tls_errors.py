"""Every TLS mistake says TLS and names the file or setting, at once, not after ``ps.startup_timeout_s`` (issue 26).

A parameter server on 127.0.0.1 serves TLS with a certificate made here by
``openssl``; a client (in this process, and a worker process) reaches it with
no CA, a CA that did not sign the certificate, a certificate for other names,
or an expired certificate. Before, each waited out the start-up timeout (120 s
by default) and then said "Could not reach parameter server ... Is the PS task
running and is the address right?". Each wait here is given 60 s: the error
type and message show the probe answered, not the timeout.
"""

import json
import os
import subprocess
import sys

import pytest

from tfdist.consistency import AsyncPolicy
from tfdist.errors import ConfigError, TLSConfigError
from tfdist.ps.client import PSClient
from tfdist.ps.server import PSServer, load_tls_server_credentials
from tfdist.testing import run_python
from tfdist.tls import certificate_info, diagnose

pytestmark = pytest.mark.integration

TOKEN = "tls-token-123"
WAIT_S = 60.0
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cert(tmp_path, name, names="DNS:localhost,IP:127.0.0.1", days="1"):
    """A self-signed certificate (its own CA) for ``names``; ``days`` -1 makes one that has expired."""
    key, csr, cert, ext = (tmp_path / f"{name}-{s}" for s in ("key.pem", "req.csr", "cert.pem", "ext"))
    ext.write_text(f"subjectAltName={names}\nbasicConstraints=critical,CA:TRUE\n")
    run = dict(check=True, capture_output=True, timeout=60)
    subprocess.run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
                    "-subj", "/CN=localhost"], **run)
    subprocess.run(["openssl", "x509", "-req", "-in", str(csr), "-signkey", str(key), "-out", str(cert),
                    "-days", days, "-extfile", str(ext)], **run)
    return str(cert), str(key)


@pytest.fixture
def tls_server(tmp_path):
    servers = []

    def start(cert, key):
        server = PSServer(AsyncPolicy(), token=TOKEN, tls_credentials=load_tls_server_credentials(cert, key)).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop(0)


def _wait_ready_error(address, tls_ca):
    with PSClient([address], TOKEN, rpc_timeout_s=5, tls_ca=tls_ca, tune_malloc=False) as client:
        with pytest.raises(TLSConfigError) as info:
            client.wait_ready(WAIT_S)
    return str(info.value)


def test_a_client_without_a_ca_is_told_the_ps_serves_tls(tmp_path, tls_server):
    server = tls_server(*_cert(tmp_path, "ps"))
    message = _wait_ready_error(server.address, None)
    assert "TLS" in message and "security.tls_ca is not set" in message and "ps:0" in message, message


def test_a_ca_that_did_not_sign_the_ps_certificate_is_named(tmp_path, tls_server):
    server = tls_server(*_cert(tmp_path, "ps"))
    other_ca, _ = _cert(tmp_path, "other")
    message = _wait_ready_error(server.address, other_ca)
    assert "TLS" in message and f"security.tls_ca={other_ca!r}" in message and "not signed" in message, message


def test_a_certificate_for_other_names_is_named_with_the_names_it_holds(tmp_path, tls_server):
    cert, key = _cert(tmp_path, "ps", names="DNS:digits-ps-0.digits")
    server = tls_server(cert, key)
    message = _wait_ready_error(server.address, cert)  # the right CA, the wrong name (127.0.0.1)
    assert "TLS" in message and "'127.0.0.1'" in message and "DNS:digits-ps-0.digits" in message, message
    assert "security.tls_cert" in message, message


def test_an_expired_certificate_is_named(tmp_path, tls_server):
    cert, key = _cert(tmp_path, "ps", days="-1")
    assert certificate_info(cert)["notAfter"]
    server = tls_server(cert, key)
    message = _wait_ready_error(server.address, cert)
    assert "TLS" in message and "expired" in message and "security.tls_cert" in message, message


def test_a_client_with_a_ca_against_a_plaintext_ps_is_told_so(tmp_path):
    cert, _ = _cert(tmp_path, "ps")
    with PSServer(AsyncPolicy(), token=TOKEN) as server:
        message = _wait_ready_error(server.address, cert)
    assert "TLS" in message and "does not answer a TLS handshake" in message and cert in message, message


def test_no_diagnosis_while_nothing_listens_and_when_tls_works(tmp_path, tls_server):
    from tfdist.cluster.local import free_port

    assert diagnose(f"127.0.0.1:{free_port()}", None) is None  # not up yet: keep waiting
    cert, key = _cert(tmp_path, "ps")
    server = tls_server(cert, key)
    assert diagnose(server.address, cert) is None
    with PSClient([server.address], TOKEN, rpc_timeout_s=5, tls_ca=cert, tune_malloc=False) as client:
        client.wait_ready(WAIT_S)
        assert client.call(0, "Status", {})[0]["initialized"] is False


def test_a_worker_process_with_the_wrong_ca_exits_78_naming_it(tmp_path, tls_server):
    """A real worker (TF_CONFIG by hand): a TLS mistake is a ConfigError (exit 78, not restarted), not a 120 s wait."""
    assert issubclass(TLSConfigError, ConfigError)
    cert, key = _cert(tmp_path, "ps")
    server = tls_server(cert, key)
    other_ca, _ = _cert(tmp_path, "other")
    from tfdist.cluster.local import free_port

    cluster = {"worker": [f"127.0.0.1:{free_port()}"], "ps": [server.address]}
    config = {"cluster": cluster, "security": {"tls_ca": other_ca, "tls_cert": cert, "tls_key": key},
              "ps": {"startup_timeout_s": 120}}
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TFDIST_CONFIG")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", TFDIST_TOKEN=TOKEN, TFDIST_CONFIG=json.dumps(config),
               TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}}))
    script = os.path.join(ROOT, "tests", "integration", "scripts", "crash_after_fit.py")
    r = run_python([sys.executable, script], env, timeout=110)
    assert r.returncode == 78, r.stderr[-3000:]
    assert "TLSConfigError: TLS" in r.stderr and other_ca in r.stderr, r.stderr[-3000:]
