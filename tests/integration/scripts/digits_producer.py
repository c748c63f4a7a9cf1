"""Server-side producer for the shared-queue launcher test: digits with an id per example.

Epoch 0 holds back all but its first example until every worker of the job
has asked the queue for data, so that both workers take part whatever their
start-up times (a bounded wait on the server's real state, not a sleep).
"""

import time

import numpy as np

#: Longest wait for the workers to connect; the test then fails on "both trained".
WORKERS_BOUND_S = 120.0


def _wait_for_workers():
    from tfdist.config import JobConfig
    from tfdist.data import SharedQueue

    config, _ = JobConfig.from_tf_config()
    want = len(config.cluster.worker)
    deadline = time.monotonic() + WORKERS_BOUND_S
    with SharedQueue.from_cluster() as queue:  # this input task's own address, from TF_CONFIG
        while len(queue.stats()["workers"]) < want and time.monotonic() < deadline:
            time.sleep(0.05)  # polls the ledger; bounded by WORKERS_BOUND_S


def produce(epoch):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.data / 16.0).astype("float32")
    for i in range(len(x)):
        yield {"x": x[i], "y": np.int64(d.target[i]), "id": np.int64(i)}
        if epoch == 0 and i == 0:  # the first example lets workers learn the element structure
            _wait_for_workers()
