"""``tfdist.launch`` for elastic jobs on this machine: servers from the launcher, workers from the engine."""

from __future__ import annotations

import logging
import os
from typing import Callable

from tfdist.cluster.local import TRAINING_JOBS, LocalJob
from tfdist.elastic.actuators import LocalActuator
from tfdist.elastic.engine import ElasticEngine, EngineResult, PSControl

__all__ = ["run_local_elastic"]

logger = logging.getLogger(__name__)


def run_local_elastic(job: LocalJob, timeout: float | None = None,
                      on_poll: Callable[[ElasticEngine], None] | None = None,
                      timeout_setting: str = "launch.job_timeout_s") -> EngineResult:
    """Starts the job's servers, lets the engine run the workers, returns what happened.

    Parameter servers, input and evaluator tasks start at once; training
    workers are started (and stopped, and replaced) by the
    :class:`~tfdist.elastic.engine.ElasticEngine` through a
    :class:`~tfdist.elastic.actuators.LocalActuator`. Decisions are appended
    to ``<log_dir>/elastic.jsonl``. The caller stops the job afterwards.

    Args:
        job: The launcher's job (not started).
        timeout: Bound on the whole job. Defaults to ``launch.job_timeout_s``.
        on_poll: Called with the engine after every poll (tests inject crashes here).
        timeout_setting: The setting ``timeout`` came from, named when it expires.

    Raises:
        LaunchError: a server task failed, the PS became unreachable, or the
            job ran past ``timeout``.
    """
    servers = [t for t in job.all_tasks() if t.job not in TRAINING_JOBS]
    job.start(servers)
    os.makedirs(job.log_dir, exist_ok=True)
    source = PSControl(job.config, job.token)
    job.wait_servers_ready(source.client, job.config.ps.startup_timeout_s)
    engine = ElasticEngine(job.config, LocalActuator(job), source, log_path=os.path.join(job.log_dir, "elastic.jsonl"))

    def watch(engine: ElasticEngine) -> None:
        job.check_servers(clean_exit_ok=True)  # raises LaunchError naming a failed server task
        if on_poll is not None:
            on_poll(engine)

    timeout = timeout if timeout is not None else job.config.launch.job_timeout_s
    try:
        return engine.run(timeout=timeout, on_poll=watch, timeout_setting=timeout_setting)
    finally:
        source.close()
