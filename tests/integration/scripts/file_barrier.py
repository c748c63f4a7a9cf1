"""A file barrier across a job's workers, for the integration test scripts (bounded wait)."""

import os
import time


def wait_for_all(out: str, name: str, worker_id: int, num_workers: int, timeout: float = 120.0,
                 poll_s: float = 0.02) -> None:
    """Marks ``worker_id`` as arrived at ``name`` in ``out``; waits until all ``num_workers`` have.

    Raises:
        TimeoutError: the others did not arrive within ``timeout`` seconds.
    """
    with open(os.path.join(out, f"{name}-{worker_id}"), "w"):
        pass
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(os.path.join(out, f"{name}-{w}")) for w in range(num_workers)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the other workers did not reach {name!r} within {timeout} s")
        time.sleep(poll_s)
