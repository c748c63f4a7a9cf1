"""Jobs across emulated hosts: every task in its own network namespace, with its own address.

``tfdist.testing.NetnsCluster`` makes one Linux network namespace per host,
joined by a bridge (veth pairs, addresses in 10.77.0.0/24 that exist only
inside the namespaces), and runs each task there with ``ip netns exec``. Tasks
reach each other only by those addresses, as on separate machines; a host's
link can be capped with ``tc ... tbf``. Needs root (skipped otherwise, saying
why); every namespace, link and process is removed when a test ends.

Each test starts few, small TensorFlow processes (2-3 s and a few hundred MB
each). Assertions are on exit codes, log lines and the results the worker
scripts write, never on sleeps.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from tfdist.testing import NetnsCluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "tests", "integration", "scripts")
EXAMPLE = os.path.join(ROOT, "examples", "train_digits.py")
EXAMPLE_ARGS = ["--dataset", "digits", "--epochs", "2", "--eval-interval", "0.5"]
TOKEN = "multihost-test-token"
PORT = 2222  # every host has its own address, so every task can use the same port

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not NetnsCluster.available(),
                       reason=f"multi-host tests need network namespaces: {NetnsCluster.unavailable_reason()}"),
]

PS_JOB_HOSTS = {"ps:0": "ps0", "ps:1": "ps1", "chief:0": "chief", "worker:0": "worker", "evaluator:0": "evaluator"}


def _env(**extra):
    """The environment of a task: this one's, without any job's variables, plus ``extra``.

    ``PYTHONPATH`` stays this process's, as for the tasks of every other test: they import the tfdist under
    test, and they match the import-time variables of this process's zygote, which forks the Python tasks
    into their hosts (NetnsCluster with fast start) instead of each importing TensorFlow.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG",) and not k.startswith("TFDIST_")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", TF_NUM_INTRAOP_THREADS="1", PYTHONUNBUFFERED="1", TFDIST_TOKEN=TOKEN)
    env.update(extra)
    return env


def _cluster_spec(net, hosts):
    """``{job: [host:port, ...]}`` of tasks named like ``ps:0`` placed on ``hosts[task]``."""
    jobs = {}
    for task, host in hosts.items():
        job, index = task.split(":")
        jobs.setdefault(job, []).append((int(index), f"{net.address(host)}:{PORT}"))
    return {job: [a for _, a in sorted(tasks)] for job, tasks in jobs.items()}


def _wait_job(net, training, others, train_timeout=180, end_timeout=30):
    """The training tasks exit 0, then the others (PS, evaluator) exit 0 by themselves."""
    codes = net.wait(training, train_timeout)
    assert all(c == 0 for c in codes.values()), f"exit codes {codes}\n{net.describe()}"
    codes = net.wait(others, end_timeout)
    assert all(c == 0 for c in codes.values()), (
        f"not every task exited 0 within {end_timeout} s of the workers (None: still running): {codes}\n"
        + net.describe())


def _check_ps_job_logs(net):
    for i in (0, 1):
        log = net.log(f"ps:{i}")
        assert "all 2 workers are done; stopping" in log, log[-2000:]
        # it says what it listens on: every interface (the workers reached it at its host's address)
        assert f"ps:{i} serving on every interface, port {PORT}" in log, log[-2000:]
    assert "worker 0: final test accuracy" in net.log("chief:0")
    assert "worker 1: final test accuracy" in net.log("worker:0")
    evaluator = net.log("evaluator:0")
    assert any(line.startswith("evaluator: PS version") for line in evaluator.splitlines()), evaluator[-3000:]
    assert "evaluator: training is over after" in evaluator


def _root_links():
    """Links of the root namespace named as a NetnsCluster names its links (bridge, ports, host ends)."""
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=10).stdout
    names = {line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line}
    return {n for n in names if n == "br0" or re.fullmatch(r"p\d+|eth\d+", n)}


def test_netns_cluster_connects_its_hosts_and_removes_everything_when_the_test_fails(tmp_path):
    """The helper itself: hosts reach each other by address (loopback up too), the root namespace gets no
    link, two instances never share a name, and an exception inside the block still kills every task and
    deletes every namespace."""
    root_before = _root_links()
    client = ("import socket, sys\n"
              "s = socket.create_server(('0.0.0.0', 5001)); c = socket.create_connection(('127.0.0.1', 5001))\n"
              "print('loopback ok', flush=True)\n"
              "peer = socket.create_connection((sys.argv[1], 5000), timeout=10); print('peer ok', flush=True)\n"
              "assert peer.recv(16) == b'hello'\n")
    server = ("import socket, time\n"
              "s = socket.create_server(('0.0.0.0', 5000)); print('listening', flush=True)\n"
              "c, _ = s.accept(); c.sendall(b'hello'); print('accepted', flush=True); time.sleep(600)\n")
    with pytest.raises(RuntimeError, match="the test failed"):
        with NetnsCluster(["a", "b"], log_dir=str(tmp_path / "logs")) as net, NetnsCluster(["a"]) as other:
            assert other.id != net.id and not set(other.namespaces()) & set(net.namespaces())
            assert net.address("a") == "10.77.0.1" and net.address("b") == "10.77.0.2"
            assert _root_links() == root_before
            names = net.namespaces()
            server_task = net.run("b", "server", [sys.executable, "-c", server])
            net.wait_for_output("server", "listening", 30)
            net.run("a", "client", [sys.executable, "-c", client, net.address("b")])
            assert net.wait(["client"], 30) == {"client": 0}, net.describe()
            assert "loopback ok" in net.log("client") and "peer ok" in net.log("client")
            net.wait_for_output("server", "accepted", 10)
            assert server_task.running  # sleeps on: the teardown must kill it
            raise RuntimeError("the test failed")
    assert not server_task.running
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    assert not any(name in listed for name in names), listed
    assert _root_links() == root_before


def test_a_task_forked_into_a_host_lives_in_its_namespace_as_under_ip_netns_exec(tmp_path):
    """Fast start: a ``python script.py`` task forked from the zygote (TensorFlow imported once) enters its
    host's network namespace before it runs a line, threads included, as the same task started with
    ``ip netns exec`` does; and it reaches another host by address."""
    script = tmp_path / "where.py"
    script.write_text(
        "import os, socket, sys, threading\n"
        "seen = {}\n"
        "def look(): seen['thread'] = os.stat(f'/proc/self/task/{threading.get_native_id()}/ns/net').st_ino\n"
        "t = threading.Thread(target=look); t.start(); t.join()\n"
        "print('netns', os.stat('/proc/self/ns/net').st_ino, seen['thread'], flush=True)\n"
        "socket.create_connection((sys.argv[1], 5000), timeout=10).close(); print('peer ok', flush=True)\n")
    server = ("import socket\n"
              "s = socket.create_server(('0.0.0.0', 5000)); print('listening', flush=True)\n"
              "s.accept()[0].close()\n")
    for fast_start in (True, False):
        with NetnsCluster(["a", "b"], log_dir=str(tmp_path / f"logs-{fast_start}"), fast_start=fast_start) as net:
            net.run("b", "server", [sys.executable, "-c", server])
            net.wait_for_output("server", "listening", 30)
            task = net.run("a", "task", [sys.executable, str(script), net.address("b")], env=_env())
            assert net.wait(["task", "server"], 60) == {"task": 0, "server": 0}, net.describe()
            assert task.forked == fast_start, net.describe()
            inode = os.stat(os.path.join("/var/run/netns", net.host("a").namespace)).st_ino
            assert f"netns {inode} {inode}" in net.log("task") and "peer ok" in net.log("task"), net.describe()


def test_ps_job_started_one_task_per_host_with_the_launcher(tmp_path):
    """README "Many machines": the same config on every host, ``python -m tfdist.launch --config F --task T``."""
    with NetnsCluster(list(PS_JOB_HOSTS.values()), log_dir=str(tmp_path / "logs")) as net:
        cluster = _cluster_spec(net, PS_JOB_HOSTS)
        config = tmp_path / "multi.yaml"
        config.write_text(json.dumps({"name": "multi-host", "cluster": cluster, "ps": {"placement": "greedy"}}))
        for task, host in PS_JOB_HOSTS.items():
            script = [] if task.startswith("ps:") else [EXAMPLE, *EXAMPLE_ARGS]
            net.run(host, task, [sys.executable, "-m", "tfdist.launch", "--config", str(config), "--task", task,
                                 *script], env=_env())
        _wait_job(net, ["chief:0", "worker:0"], ["ps:0", "ps:1", "evaluator:0"])
        _check_ps_job_logs(net)


def test_ps_job_started_from_tf_config_by_hand(tmp_path):
    """Each host runs its task with its own ``TF_CONFIG`` and the token: ps:0 ``python -m tfdist.ps``,
    every other task (ps:1 included) the example script, as under a scheduler that sets TF_CONFIG."""
    with NetnsCluster(list(PS_JOB_HOSTS.values()), log_dir=str(tmp_path / "logs")) as net:
        cluster = _cluster_spec(net, PS_JOB_HOSTS)
        for task, host in PS_JOB_HOSTS.items():
            job, index = task.split(":")
            tf_config = json.dumps({"cluster": cluster, "task": {"type": job, "index": int(index)}})
            argv = [sys.executable, "-m", "tfdist.ps"] if task == "ps:0" else [sys.executable, EXAMPLE, *EXAMPLE_ARGS]
            net.run(host, task, argv, env=_env(TF_CONFIG=tf_config))
        _wait_job(net, ["chief:0", "worker:0"], ["ps:0", "ps:1", "evaluator:0"])
        _check_ps_job_logs(net)


def _results(out, n):
    return [json.load(open(os.path.join(out, f"worker-{i}.json"))) for i in range(n)]


def _events(result, detector="dynamic_threshold"):
    return [(e["kind"], e["worker"], e["step"]) for e in result["straggler_history"]["events"]
            if e["detector"] == detector]


def _start_tf_config_job(net, hosts, script, args):
    """Every task with its own TF_CONFIG: PS tasks ``python -m tfdist.ps``, training tasks ``script args``."""
    cluster = _cluster_spec(net, hosts)
    for task, host in hosts.items():
        job, index = task.split(":")
        tf_config = json.dumps({"cluster": cluster, "task": {"type": job, "index": int(index)}})
        argv = ([sys.executable, "-m", "tfdist.ps"] if job == "ps"
                else [sys.executable, os.path.join(SCRIPTS, script), *args])
        net.run(host, task, argv, env=_env(TF_CONFIG=tf_config))


def test_all_reduce_with_straggler_detection_across_hosts(tmp_path):
    """AllReduceStrategy + StragglerDetector on 3 hosts: TF collectives between the hosts' addresses; worker 2
    computes 3x slower (emulated) in the first of 2 epochs: it is left out, and re-admitted at the next epoch
    start, where it is fast again; every worker
    reaches the same verdicts, and the members of every step hold bit-identical training state."""
    hosts = {f"worker:{i}": f"w{i}" for i in range(3)}
    out = tmp_path / "out"
    out.mkdir()
    steps = 20
    with NetnsCluster(list(hosts.values()), log_dir=str(tmp_path / "logs")) as net:
        _start_tf_config_job(net, hosts, "allreduce_worker.py",
                             ["--out", str(out), "--epochs", "2", "--steps", str(steps), "--base", "0.03",
                              "--factor", "3", "--slow-worker", "2", "--slow-until", str(steps),
                              "--limit", "3", "--timeout", "30"])
        _wait_job(net, list(hosts), [])
    results = _results(out, 3)
    for r in results:  # the update is the mean gradient of the members, computed over the hosts' links
        full = r["mean"]["checks"][0]
        assert full["members"] == [0, 1, 2] and full["max_abs_error"] < 1e-5 < full["max_abs_update"], full
    events = [_events(r) for r in results]
    assert events[0] == events[1] == events[2], events
    assert {w for _, w, _ in events[0]} == {2}, events
    assert [k for k, _, _ in events[0]] == ["detected", "recovered"], events
    assert events[0][0][2] < steps <= events[0][1][2] <= steps + 3, events  # recovered in the next profiling
    assert all(r["straggler_history"]["participation"] == results[0]["straggler_history"]["participation"]
               for r in results)
    members = [tuple(s["members"]) for s in results[0]["steps"]]
    assert (0, 1) in members and members[-1] == (0, 1, 2), members  # left out, then re-admitted
    for t, m in enumerate(members):
        assert len({results[w]["steps"][t]["hash"] for w in m}) == 1, (t, m)
    loss = results[0]["keras_history"]["loss"]
    assert loss[-1] < loss[0], loss


def test_a_host_behind_a_10_mbit_link_is_detected_as_a_straggler(tmp_path):
    """Asynchronous PS training on 3 worker hosts and a PS host; worker 2's link is capped to 10 Mbit/s (tbf)
    in both directions. Every step a worker pushes and pulls ~180 KB (a 4096-unit layer): ~0.3 s on the
    capped link, a few ms on the others. No compute is slowed: the detector sees the link."""
    hosts = {"ps:0": "ps0", "worker:0": "w0", "worker:1": "w1", "worker:2": "w2"}
    out = tmp_path / "out"
    out.mkdir()
    with NetnsCluster(list(hosts.values()), log_dir=str(tmp_path / "logs")) as net:
        net.cap("w2", rate="10mbit")
        _start_tf_config_job(net, hosts, "straggler_worker.py",
                             ["--out", str(out), "--strategy", "ps", "--width", "4096", "--epochs", "2",
                              "--steps", "15", "--limit", "3"])
        _wait_job(net, ["worker:0", "worker:1", "worker:2"], ["ps:0"])
    results = _results(out, 3)
    events = [_events(r) for r in results]
    assert events[0] == events[1] == events[2], events
    detected = [(w, step) for kind, w, step in events[0] if kind == "detected"]
    assert detected and {w for w, _ in detected} == {2}, events
    assert detected[0][1] < 15, events  # within the first epoch
    # it is the link: worker 2 spent far longer exchanging with the PS than the others
    seconds = [r["sync_stats"]["sync_seconds"] for r in results]
    assert seconds[2] > 10 * max(seconds[:2]), seconds


def test_sync_replicas_with_a_slowed_host_completes(tmp_path):
    """SyncReplicas (M=2 of 3 workers) from one config with ``--task`` per host; ``launch.slowdown`` makes
    worker 2 3x slower. The job ends by itself, the slow worker's late gradients are dropped, and after
    ``strategy.pull()`` every worker holds the same model."""
    hosts = {"ps:0": "ps0", "worker:0": "w0", "worker:1": "w1", "worker:2": "w2"}
    out = tmp_path / "out"
    out.mkdir()
    with NetnsCluster(list(hosts.values()), log_dir=str(tmp_path / "logs")) as net:
        config = tmp_path / "sync.yaml"
        config.write_text(json.dumps({
            "name": "multi-host-sync", "cluster": _cluster_spec(net, hosts),
            "strategy": {"consistency": "sync_replicas", "replicas_to_aggregate": 2},
            "ps": {"heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 5},
            "launch": {"slowdown": {"worker:2": {"factor": 3.0, "delay_s": 0.02}}},
        }))
        args = ["--out", str(out), "--mode", "sync_replicas", "--m", "2", "--epochs", "2", "--record",
                "--pull-after"]
        for task, host in hosts.items():
            script = [] if task.startswith("ps:") else [os.path.join(SCRIPTS, "consistency_worker.py"), *args]
            net.run(host, task, [sys.executable, "-m", "tfdist.launch", "--config", str(config), "--task", task,
                                 *script], env=_env())
        _wait_job(net, ["worker:0", "worker:1", "worker:2"], ["ps:0"])
    results = _results(out, 3)
    assert all(r["num_replicas_in_sync"] == 2 for r in results)
    assert results[2]["sync_stats"]["dropped"] > 0, results[2]["sync_stats"]
    after = [r["after_pull"] for r in results]
    assert len({a["hash"] for a in after}) == 1 and len({a["global_step"] for a in after}) == 1, after
