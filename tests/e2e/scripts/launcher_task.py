"""A training task for launcher tests that needs no TensorFlow (it starts in a fraction of a second).

Usage: launcher_task.py --out DIR --mode MODE [--tag T]

Every run appends one line ``<task> <mode>`` to ``DIR/runs`` (so a test counts
starts and restarts). Modes:

* ``wait``: prints ``ready`` and waits (bounded, 300 s) to be stopped.
* ``config-error``: raises a :class:`tfdist.errors.ConfigError` (deterministic).
* ``done-then-fail``: tells every PS task this worker is done, as a clean
  script end does, then exits 1 (a task whose interpreter shutdown failed
  after its training finished, e.g. the exit watchdog).
* ``crash``: exits 1 without saying anything to the PS tasks.
"""

import argparse
import json
import os
import sys
import threading


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--mode", required=True)
    p.add_argument("--tag", default="")
    args = p.parse_args()
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    me = f"{task['type']}:{task['index']}"
    with open(os.path.join(args.out, "runs"), "a") as f:
        f.write(f"{me} {args.mode}\n")
    if args.mode == "wait":
        print("ready", flush=True)
        threading.Event().wait(300)
        return 0
    if args.mode == "config-error":
        from tfdist.errors import ConfigError

        raise ConfigError("Invalid config field `model.kind`. Received: model.kind='tf_keras'. Use a Keras 3 model.")
    if args.mode == "done-then-fail":
        from tfdist.cluster import resolve_cluster
        from tfdist.ps.client import PSClient

        resolved = resolve_cluster(required=True)
        worker = resolved.config.cluster.worker_id(resolved.task.job, resolved.task.index)
        with PSClient(resolved.config.cluster.ps, resolved.config.security.resolve_token(), rpc_timeout_s=10,
                      tune_malloc=False) as client:
            client.wait_ready(60)
            client.call_all("Done", {"worker": worker}, timeout=10.0, parallel=False)
        print("said Done; now failing on the way out", flush=True)
        return 1
    if args.mode == "crash":
        return 1
    if args.mode == "killed":  # a crash the launcher restarts: a signal (the OOM killer, SIGSEGV, SIGKILL)
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    raise SystemExit(f"unknown mode {args.mode!r}")


if __name__ == "__main__":
    sys.exit(main())
