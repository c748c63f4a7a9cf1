"""Runs one parameter-server task: ``python -m tfdist.ps [--task ps:0] [--config FILE] [--port P]``.

Without arguments the task and cluster come from ``TFDIST_CONFIG`` and
``TF_CONFIG`` (set by ``tfdist.launch``), resolved by
:func:`tfdist.cluster.resolve_cluster` (``TF_CONFIG``'s cluster and task win
over ``--config``'s; ``--config`` alone serves ``ps:0``); the token from
``TFDIST_TOKEN``.
The process stops when every training worker has said it is done or on a
``Shutdown`` call (exit 0), or on SIGTERM/SIGINT (exit 143/130: the job is
not over, and a supervisor starts the task again); a bad config exits 78
(:data:`tfdist.exit_status.EXIT_CONFIG_ERROR`, never restarted).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from tfdist import constants, exit_status
from tfdist.cluster.resolver import resolve_cluster
from tfdist.config import JobConfig, TaskSpec
from tfdist.errors import ConfigError, TfdistError
from tfdist.ps.server import PSServer, load_tls_server_credentials

logger = logging.getLogger("tfdist.ps")


def build_server(config: JobConfig, task: TaskSpec, host: str | None = None, port: int | None = None) -> PSServer:
    """Creates (not starts) the PS server for ``task`` of ``config``."""
    if task.job != "ps":
        raise ConfigError(f"Task {task} is not a parameter-server task. Received: task={task}. Use --task ps:N.")
    if task.index >= len(config.cluster.ps):
        raise ConfigError(f"Task {task} is not in the cluster, which has {len(config.cluster.ps)} ps task(s).")
    address = config.cluster.ps[task.index]
    addr_port = address.rpartition(":")[2]
    if host is None:
        host = "127.0.0.1" if config.cluster.is_local() else "[::]"
    token = config.security.resolve_token()
    if token is None:
        raise ConfigError(
            f"No job token for {task}: set the environment variable {config.security.token_env} "
            "(the same value on every task) or security.token. tfdist.launch sets it for local jobs."
        )
    config.ps.check_checkpoint_dir()  # a file there: a ConfigError now, not a failure at every checkpoint
    creds = None
    if config.security.tls_cert:
        config.security.check_tls_files(job="ps")  # a missing or non-PEM file: a ConfigError naming it
        creds = load_tls_server_credentials(config.security.tls_cert, config.security.tls_key)
    return PSServer(
        None,  # the chief's Init brings the consistency policy
        port=int(addr_port) if port is None else port,
        host=host,
        token=token,
        max_message_bytes=config.ps.max_message_bytes,
        num_workers=config.cluster.num_workers,
        starting_workers=config.starting_workers,
        exit_when_done=not config.elastic.enabled,
        max_updates_per_s=config.ps.max_updates_per_s,
        heartbeat_timeout_s=config.ps.heartbeat_timeout_s,
        tls_credentials=creds,
        task_index=task.index,
        startup_grace_s=config.ps.startup_timeout_s,
        tune_malloc=config.ps.tune_malloc,
        max_wait_s=config.ps.rpc_timeout_s,
        checkpoint_dir=config.ps.checkpoint_dir,
        checkpoint_every_s=config.ps.checkpoint_every_s,
        checkpoint_every_steps=config.ps.checkpoint_every_steps,
        checkpoint_keep=config.ps.checkpoint_keep,
        num_ps=len(config.cluster.ps),
        stream=config.ps.transport == "auto",
        stream_port=config.ps.stream_port or 0,
    )


def serve(config: JobConfig, task: TaskSpec, port: int | None = None) -> int:
    """Serves until done; returns the process exit code.

    Returns:
        0 when the task stopped because the job ended (every worker said
        ``Done``, or ``Shutdown``); 128 + the signal number (143, 130) when
        SIGTERM or SIGINT stopped it (its checkpoint written): the job is not
        over, so a supervisor (the launcher's ``launch.restart_ps``, a
        Kubernetes ``OnFailure`` policy) starts it again as it would a killed task.
    """
    stopped_by: list[int] = []
    server = None

    def _stop(signum, frame):
        logger.info("ps:%d got signal %d; stopping", task.index, signum)
        stopped_by.append(signum)
        if server is not None:
            server.stop(0.5)

    # Before the server starts (and says "serving on"): a signal from then on stops it the same way.
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    server = build_server(config, task, port=port).start()
    if stopped_by:  # a signal came while it started
        server.stop(0.5)
    server.wait()
    return 128 + stopped_by[0] if stopped_by else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfdist.ps", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="job config YAML (default: TFDIST_CONFIG / TF_CONFIG)")
    parser.add_argument("--task", help="JOB:INDEX of this task, e.g. ps:0 (default: from TF_CONFIG)")
    parser.add_argument("--port", type=int, help="override the port from the config")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get(constants.ENV_LOG_LEVEL, "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        resolved = resolve_cluster(task=args.task, config=args.config, required=not args.config)
        if resolved.task is None:  # --config without --task or TF_CONFIG: this process is ps:0
            resolved = resolve_cluster(task="ps:0", config=resolved.config)
        return serve(resolved.config, resolved.task, port=args.port)
    except TfdistError as e:  # a bad config or cluster: the same every time, so nothing restarts the task
        logger.error("%s", e)
        return exit_status.EXIT_CONFIG_ERROR


if __name__ == "__main__":
    sys.exit(main())
