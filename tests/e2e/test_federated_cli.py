"""``python -m tfdist.federated`` answers a config mistake with exit 2 and the field, not a traceback."""

import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.timeout(120)

BAD = [
    ("rounds", "simulation: {rounds: 0}\n", [], ["simulation.rounds", "rounds=0"]),
    ("deadline", "simulation: {round_deadline_s: .nan}\n", [], ["simulation.round_deadline_s", "nan"]),
    ("deadline-negative", "simulation: {round_deadline_s: -1}\n", [], ["simulation.round_deadline_s"]),
    ("dataset", "dataset: {name: cifar1000}\n", [], ["dataset.name", "cifar1000"]),
    ("unknown", "simulation: {round: 3}\n", [], ["simulation.round"]),
    ("strategy", "strategy: {name: fedmagic}\n", [], ["strategy.name", "fedmagic"]),
    ("strategy-arg", "strategy: {name: fedavg, mu: 0.1}\n", [], ["strategy", "mu"]),
    ("clients", "partition: {num_clients: 5}\nstrategy: {name: fedavg, clients_per_round: 20}\n", [],
     ["strategy.clients_per_round", "partition.num_clients"]),
    ("client", "client: {momentum: fast}\n", [], ["client.momentum", "fast"]),
    ("delays", "delays: {name: lognormal, network_s: -2}\n", [], ["delays", "network_s"]),
    ("list", "- a\n- b\n", [], ["mapping", "a list"]),
    ("latin1", "output: r\u00e9sultat.json\n".encode("latin-1"), [], ["not UTF-8"]),
    ("override", "simulation: {rounds: 3}\n", ["--rounds", "0"], ["simulation.rounds", "--rounds"]),
    ("missing", None, [], ["Cannot read"]),
]


@pytest.mark.parametrize("name, text, extra, words", BAD, ids=[b[0] for b in BAD])
def test_federated_cli_config_mistakes_exit_2(tmp_path, name, text, extra, words):
    path = tmp_path / f"{name}.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        path.write_text(text)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "tfdist.federated", "--config", str(path), *extra], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and r.stderr.startswith("python -m tfdist.federated: "), r.stderr[-2000:]
    for word in words:
        assert word in r.stderr, r.stderr
    assert time.monotonic() - t0 < 30  # refused before any data is loaded or model built


@pytest.mark.parametrize("where", ["--output", "config", "folder"])
def test_an_output_that_cannot_be_written_exits_2_before_the_experiment_runs(tmp_path, where):
    """Issue 26: an output folder that cannot be created failed after the whole run (a traceback, exit 1)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    target = str(blocker / "out" / "history.json")  # under a file: its folder cannot be created
    path = tmp_path / "exp.yaml"
    path.write_text(f"output: {target}\n" if where == "config" else "simulation: {rounds: 1}\n")
    extra = {"--output": ["--output", target], "config": [], "folder": ["--output", str(tmp_path)]}[where]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run([sys.executable, "-m", "tfdist.federated", "--config", str(path), *extra], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and r.stderr.startswith("python -m tfdist.federated: "), r.stderr[-2000:]
    setting = {"--output": "--output", "config": "output (in the config)", "folder": "--output"}[where]
    assert f"Invalid {setting}" in r.stderr, r.stderr
    assert ("is a folder" if where == "folder" else "cannot create the folder") in r.stderr, r.stderr
    assert "round" not in r.stdout  # nothing ran
