"""NetnsCluster's checks that need no namespace: names, subnets, and the reason it is unavailable."""

import pytest

from tfdist.errors import LaunchError
from tfdist.testing import NetnsCluster, netns


def test_hosts_get_consecutive_addresses_and_unique_namespace_names():
    a, b = NetnsCluster(["ps0", "w0"]), NetnsCluster(["ps0", "w0"])
    assert [h.address for h in a.hosts.values()] == ["10.77.0.1", "10.77.0.2"]
    assert a.address("w0") == "10.77.0.2"
    assert a.id != b.id and not set(a.namespaces()) & set(b.namespaces())
    assert all(ns.startswith(a.id + "-") for ns in a.namespaces())
    assert [h.name for h in NetnsCluster(3, subnet="10.78.5.0/29").hosts.values()] == ["h0", "h1", "h2"]


@pytest.mark.parametrize("hosts, words", [
    ([], "at least one host"),
    (["a", "a"], "distinct"),
    (["Worker-1"], "lower-case"),
    (["bridge"], "not 'bridge'"),
])
def test_bad_host_names_are_refused(hosts, words):
    with pytest.raises(ValueError, match=words):
        NetnsCluster(hosts)


def test_a_public_or_too_small_subnet_is_refused():
    with pytest.raises(ValueError, match="private IPv4"):
        NetnsCluster(2, subnet="8.8.8.0/24")
    with pytest.raises(ValueError, match="larger subnet"):
        NetnsCluster(3, subnet="10.77.0.0/30")


def test_an_unknown_host_is_named():
    with pytest.raises(KeyError, match="its hosts are"):
        NetnsCluster(["a"]).address("b")


def test_without_root_it_is_unavailable_and_says_why(monkeypatch):
    monkeypatch.setattr(netns, "_availability", None)
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    assert not NetnsCluster.available()
    assert "needs root" in NetnsCluster.unavailable_reason()
    with pytest.raises(LaunchError, match="needs root"):
        NetnsCluster(["a"]).create()
