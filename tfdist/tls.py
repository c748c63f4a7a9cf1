"""Says why a TLS connection to a tfdist server fails, in seconds, naming the file or setting to fix.

gRPC reports a failed TLS handshake only as a channel that never becomes
ready, so a worker with a wrong ``security.tls_ca`` (or none, against a PS
that serves TLS) used to wait out ``ps.startup_timeout_s`` and then blame the
address. :func:`diagnose` opens one TCP connection to the server and runs
the handshake gRPC would run (Python's :mod:`ssl`, the same CA file, the same
host name check, ALPN ``h2``), and turns its outcome into a sentence: no CA,
a CA that did not sign the server's certificate, a certificate for other
names, an expired certificate, a server that does not speak TLS. A server
that does not accept connections yet is not a TLS problem (``None``: keep
waiting).

Importing this module does not import TensorFlow or gRPC.
"""

from __future__ import annotations

import os
import socket
import ssl
import tempfile
from typing import Any

__all__ = ["diagnose", "certificate_info"]

#: OpenSSL verification codes (``X509_V_ERR_*``) gRPC's handshake fails with, by meaning.
_EXPIRED = {10}  # CERT_HAS_EXPIRED
_NOT_YET_VALID = {9}  # CERT_NOT_YET_VALID
_WRONG_NAME = {62, 64}  # HOSTNAME_MISMATCH, IP_ADDRESS_MISMATCH
_UNTRUSTED = {2, 18, 19, 20, 21}  # unable to get issuer / self-signed / self-signed in chain / local issuer / leaf


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def certificate_info(pem_or_der: bytes | str) -> dict[str, Any]:
    """``subjectAltName``, ``notBefore``, ``notAfter``, ``subject`` of a certificate (a PEM file path or DER bytes).

    Uses the decoder CPython's own tests use (``ssl._ssl._test_decode_cert``); an empty dict if it is missing.
    """
    decode = getattr(getattr(ssl, "_ssl", None), "_test_decode_cert", None)
    if decode is None:
        return {}
    if isinstance(pem_or_der, str):
        try:
            return decode(pem_or_der)
        except (ssl.SSLError, OSError, ValueError):
            return {}
    fd, path = tempfile.mkstemp(suffix=".pem")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(ssl.DER_cert_to_PEM_cert(pem_or_der))
        return decode(path)
    except (ssl.SSLError, OSError, ValueError):
        return {}
    finally:
        os.unlink(path)


def _presented(host: str, port: int, timeout: float) -> dict[str, Any]:
    """The certificate the server presents, unverified (for the names and dates in a message)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout) as sock, ctx.wrap_socket(sock) as tls:
            der = tls.getpeercert(binary_form=True)
    except (OSError, ssl.SSLError):
        return {}
    return certificate_info(der) if der else {}


def _names(info: dict[str, Any]) -> str:
    names = [f"{kind}:{value}" for kind, value in info.get("subjectAltName", ())]
    return ", ".join(names) if names else "no subjectAltName (gRPC ignores the CN)"


def server_credentials(cert_path: str, key_path: str):
    """A PEM certificate chain and key read into gRPC server credentials (the PS, the shared queue)."""
    import grpc

    with open(cert_path, "rb") as f:
        cert = f.read()
    with open(key_path, "rb") as f:
        key = f.read()
    return grpc.ssl_server_credentials([(key, cert)])


def channel_credentials(ca_path: str):
    """gRPC channel credentials that verify a server against the PEM CA file ``ca_path``."""
    import grpc

    with open(ca_path, "rb") as f:
        return grpc.ssl_channel_credentials(root_certificates=f.read())


def diagnose(address: str, tls_ca: str | None, *, what: str = "the parameter server",
             ca_setting: str = "security.tls_ca", server_settings: str = "security.tls_cert and security.tls_key",
             timeout: float = 2.0) -> str | None:
    """Why TLS to ``address`` fails, or ``None`` (not reachable yet, or TLS is not the problem).

    Args:
        address: ``host:port`` the client dials (the name its certificate must hold).
        tls_ca: The client's CA file (``None``: the client does not use TLS).
        what: The server, for the message.
        ca_setting: The client's CA setting, for the message.
        server_settings: The server's certificate settings, for the message.
        timeout: Bound of the connection and of the handshake.

    Returns:
        A message that says TLS and names the file or setting to fix.
    """
    host, port = _split(address)
    try:
        sock = socket.create_connection((host, port), timeout)
    except OSError:
        return None  # nothing listens yet: keep waiting
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.set_alpn_protocols(["h2"])
    if tls_ca:
        try:
            ctx.load_verify_locations(tls_ca)
        except (ssl.SSLError, OSError) as e:
            sock.close()
            return (f"TLS: the CA file {ca_setting}={tls_ca!r} cannot be used ({e}). Give the PEM file of the CA "
                    f"that signed {what}'s certificate.")
    else:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    try:
        with sock, ctx.wrap_socket(sock, server_hostname=host) as tls:
            tls.getpeercert(binary_form=True)
    except ssl.SSLCertVerificationError as e:
        code = getattr(e, "verify_code", None)
        reason = getattr(e, "verify_message", None) or str(e)
        info = _presented(host, port, timeout)
        if code in _EXPIRED:
            return (f"TLS: the certificate of {what} at {address} has expired (not after {info.get('notAfter', '?')}; "
                    f"{reason}). Renew {what}'s certificate ({server_settings}); if it is valid, the CA in "
                    f"{ca_setting}={tls_ca!r} has expired.")
        if code in _NOT_YET_VALID:
            return (f"TLS: the certificate of {what} at {address} is not valid yet (not before "
                    f"{info.get('notBefore', '?')}). Check the clocks, or issue it again ({server_settings}).")
        if code in _WRONG_NAME:
            return (f"TLS: the certificate of {what} at {address} is not for {host!r} (it names {_names(info)}). "
                    f"Issue {what}'s certificate ({server_settings}) with a subjectAltName for {host!r}: one per "
                    "PS address (gRPC accepts no single-label wildcard such as *.svc for a pod's DNS name).")
        if code in _UNTRUSTED:
            return (f"TLS: the certificate of {what} at {address} is not signed by the CA in "
                    f"{ca_setting}={tls_ca!r} ({reason}). Give the CA that signed {what}'s certificate "
                    f"({server_settings}), or sign that certificate with this CA.")
        return (f"TLS: the certificate of {what} at {address} was refused ({reason}); check {ca_setting} and "
                f"{server_settings}.")
    except ssl.SSLError as e:
        if tls_ca:
            return (f"TLS: {what} at {address} does not answer a TLS handshake ({e.reason or e}), but this client "
                    f"uses TLS ({ca_setting}={tls_ca!r}). Start {what} with {server_settings}, or drop {ca_setting}.")
        return None  # a plaintext server refusing a TLS probe: as expected without a CA
    except OSError:
        return None  # closed or timed out mid-handshake: not conclusive
    if not tls_ca:
        return (f"TLS: {what} at {address} serves TLS, but this client does not use it ({ca_setting} is not set). "
                f"Set {ca_setting} to the PEM file of the CA that signed its certificate.")
    return None
