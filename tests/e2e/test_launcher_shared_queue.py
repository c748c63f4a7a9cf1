"""The launcher starts an input task (the shared queue); workers under the PS strategy train from it."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "tests", "integration", "scripts")


@pytest.mark.timeout(400)
def test_input_task_feeds_every_worker_each_example_once_per_epoch(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    cfg = tmp_path / "queue.yaml"
    cfg.write_text(json.dumps({
        "name": "queue",
        "cluster": {"ps": 1, "worker": 2, "input": 1},
        "launch": {"input_args": ["--producer", "digits_producer:produce", "--num-epochs", "2"],
                   "env": {"PYTHONPATH": SCRIPTS}},
    }))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    r = subprocess.run([sys.executable, "-m", "tfdist.launch", "--config", str(cfg), "--log-dir",
                        str(tmp_path / "logs"), os.path.join(SCRIPTS, "queue_worker.py"), "--out", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=360)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    workers = [json.loads((out / f"worker-{i}.json").read_text()) for i in range(2)]
    ledger = (tmp_path / "logs" / "input-0.log").read_text()
    fits = [fit for w in workers for fit in w["seen"]]
    assert all(fit["epoch"] in (0, 1) or not fit["ids"] for fit in fits), fits
    for epoch in range(2):
        # the server acknowledged every example exactly once ...
        assert f"epoch {epoch} complete: 1797 examples acknowledged" in ledger
        # ... and the workers' pipelines (hence their training steps) saw each exactly once
        ids = sorted(i for fit in fits if fit["epoch"] == epoch for i in fit["ids"])
        assert ids == list(range(1797)), (epoch, len(ids), len(set(ids)))
    assert all(w["syncs"] > 0 for w in workers)  # both trained, through the PS
    assert any(fit["ids"] for fit in workers[0]["seen"]) and any(fit["ids"] for fit in workers[1]["seen"])
