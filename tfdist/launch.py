"""``python -m tfdist.launch``: run a job from one config, locally or one task per machine.

Local (every task a subprocess on free 127.0.0.1 ports)::

    python -m tfdist.launch --config configs/local_async.yaml examples/train_digits.py --epochs 5

One task of a multi-machine job (the config lists real addresses; every
machine runs the same command with its own ``--task`` and the same
``TFDIST_TOKEN`` in its environment)::

    TFDIST_TOKEN=... python -m tfdist.launch --config configs/multi_machine.yaml --task worker:1 train.py

Kubernetes manifests instead of a launch (a Kubeflow TFJob, plain Jobs and a
headless Service, or a JobSet; see :mod:`tfdist.cluster.k8s`,
:mod:`tfdist.cluster.jobset` and docs/kubernetes.md)::

    python -m tfdist.launch --config configs/multi_machine.yaml --emit kubeflow --image IMAGE train.py > job.yaml

Exit codes: 0 when the chief (worker 0) and every worker the job did not go
on without exited 0, or exited non-zero after its training finished (it had
told the parameter servers it was done, or they had ended the job); 1 when a
task failed that the job cannot do without (see ``launch.on_worker_failure``;
the others are stopped and the failed task is named) or the job ran past
``--timeout`` / ``launch.job_timeout_s``; 2 for a bad config or command line,
before any task starts, or when a task exits with code 78 (its script raised
a ``ConfigError``: deterministic, so never restarted) (``--emit``: 0 when
the manifests are written, 2 for a bad config or option); 130 on SIGINT
(Ctrl-C) and 143 on SIGTERM, after every task was stopped. The launcher installs its
own SIGINT and SIGTERM handlers, whatever it inherited (``nohup`` or a
background job of a non-interactive shell start it with SIGINT ignored).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys

from tfdist import constants
from tfdist.cluster import k8s, zygote
from tfdist.cluster.local import LocalJob, task_argv, task_environment
from tfdist.config import MAX_SECONDS, load_config, parse_task
from tfdist.errors import ConfigError, LaunchError, TaskConfigError, TfdistError, TLSConfigError

__all__ = ["main"]

logger = logging.getLogger("tfdist.launch")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tfdist.launch",
        description="Start a tfdist job: every task locally, or one task (--task) of a multi-machine job.",
    )
    p.add_argument("--config", required=True, help="job config YAML (see configs/)")
    p.add_argument("--task", help="run only this task, JOB:INDEX (e.g. worker:1); the multi-machine path")
    p.add_argument("--log-all", action="store_true", help="show every task's stdout, not only the chief's")
    p.add_argument("--log-dir", help="directory for per-task logs (default runs/<name>-<time>)")
    p.add_argument("--timeout", type=float,
                   help="stop every task and exit 1 if the local job runs longer than this many seconds "
                        "(overrides launch.job_timeout_s; with --emit: activeDeadlineSeconds)")
    emit = p.add_argument_group("Kubernetes manifests (written instead of launching anything)")
    emit.add_argument("--emit", choices=("kubeflow", "k8s", "jobset"),
                      help="write a Kubeflow TFJob (kubeflow), plain Jobs + a headless Service (k8s) or a JobSet "
                           "(jobset) for the config; "
                           "SCRIPT is its path inside the image (without one, training pods run the image's "
                           "entrypoint)")
    emit.add_argument("--image", help="container image with Python, tfdist and the script (required with --emit)")
    emit.add_argument("--namespace", help="namespace of every object (default: default)")
    emit.add_argument("--output", metavar="FILE", help="write the YAML here (default: stdout)")
    emit.add_argument("--emit-secret", action="store_true",
                      help="also write the token Secret <name>-token with a random token into --output, which it "
                           "needs (default: only say how to create it)")
    emit.add_argument("--checkpoint-claim", metavar="CLAIM",
                      help=f"PersistentVolumeClaim mounted at {k8s.CHECKPOINT_MOUNT_PATH} on PS pods and the chief "
                           "(default: <name>-checkpoints)")
    emit.add_argument("--no-checkpoint-volume", action="store_true", help="mount no checkpoint volume")
    emit.add_argument("--checkpoint-claim-per-ps", action="store_true",
                      help="each PS task mounts its own claim CLAIM-ps-<i> (--emit k8s; a TFJob or JobSet cannot)")
    p.add_argument("script", nargs="?", help="training script run by chief/worker/evaluator tasks")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    return p


def _check_timeout_option(timeout: float | None) -> None:
    if timeout is not None and not (math.isfinite(timeout) and 0 < timeout <= MAX_SECONDS):
        raise ConfigError(f"Invalid option --timeout. Received: --timeout={timeout:g}. Give a number of seconds "
                          f"above 0 and at most {MAX_SECONDS} (one year), or leave it out for no limit.")


#: Options that only --emit uses, by their attribute in the parsed arguments.
_EMIT_OPTIONS = {"image": "--image", "namespace": "--namespace", "output": "--output", "emit_secret": "--emit-secret",
                 "checkpoint_claim": "--checkpoint-claim", "no_checkpoint_volume": "--no-checkpoint-volume",
                 "checkpoint_claim_per_ps": "--checkpoint-claim-per-ps"}
#: Launch options that mean nothing to --emit.
_LAUNCH_OPTIONS = {"task": "--task", "log_all": "--log-all", "log_dir": "--log-dir"}


def _check_emit_options(args) -> None:
    """Refuses --emit options without --emit, and launch options with it."""
    if not args.emit:
        given = [flag for name, flag in _EMIT_OPTIONS.items() if getattr(args, name)]
        if given:
            raise ConfigError(f"{given[0]} is an option of --emit (Kubernetes manifests). Received: {given[0]} "
                              "without --emit. Add --emit kubeflow, k8s or jobset, or leave it out.")
        return
    given = [(flag, getattr(args, name)) for name, flag in _LAUNCH_OPTIONS.items() if getattr(args, name)]
    if given:
        flag, value = given[0]
        shown = flag if value is True else f"{flag} {value}"
        raise ConfigError(f"{flag} is an option of a launch, and --emit launches nothing: it writes manifests "
                          f"for every task. Received: --emit {args.emit} {shown}. Leave {flag} out.")
    if not args.image:
        raise ConfigError(f"--emit needs the container image the pods run. Received: --emit {args.emit} without "
                          "--image. Add e.g. --image registry.example.com/digits:1 (an image with Python, tfdist "
                          "and your script).")
    if args.emit_secret and not args.output:
        raise ConfigError("--emit-secret writes the job token into the manifests, and without --output they go to "
                          "standard output (a terminal, a CI log). Received: --emit-secret without --output. Add "
                          "--output FILE (created readable by you only), or leave --emit-secret out and create the "
                          "Secret with kubectl.")
    if args.checkpoint_claim and args.no_checkpoint_volume:
        raise ConfigError("--checkpoint-claim and --no-checkpoint-volume contradict each other. Received: "
                          f"--checkpoint-claim {args.checkpoint_claim} --no-checkpoint-volume. Give one: a claim to "
                          "mount, or no volume.")


def _emit(config, args) -> int:
    """Writes the Kubernetes manifests of ``config`` (``--emit``)."""
    if args.timeout is not None:
        config.launch.job_timeout_s = args.timeout  # becomes activeDeadlineSeconds
    namespace = args.namespace or "default"
    options = dict(namespace=namespace, checkpoint_claim=args.checkpoint_claim,
                   checkpoint_volume=not args.no_checkpoint_volume,
                   checkpoint_claim_per_ps=args.checkpoint_claim_per_ps)
    from tfdist.cluster import jobset

    build = {"kubeflow": k8s.kubeflow_tfjob, "k8s": k8s.kubernetes_jobs, "jobset": jobset.kubernetes_jobset}[args.emit]
    docs = build(config, args.image, args.script, args.script_args, **options)
    docs = [docs] if isinstance(docs, dict) else docs
    if args.emit_secret:
        docs.insert(0, k8s.token_secret(config, namespace))
    notes = k8s.prerequisites(config, namespace, checkpoint_claim=args.checkpoint_claim,
                              checkpoint_volume=not args.no_checkpoint_volume, token_secret_included=args.emit_secret,
                              checkpoint_claim_per_ps=args.checkpoint_claim_per_ps)
    text = k8s.dump_yaml(docs, comment=notes)
    if not args.output:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        try:  # the file may hold the token (--emit-secret): readable by its owner only
            fd = os.open(args.output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            raise ConfigError(f"Cannot write --output {args.output!r}: {e.strerror or e}. Give a writable file "
                              "path, or leave --output out to print the manifests.") from None
        logger.info("wrote %d manifest(s) for job %r to %s", len(docs), config.name, args.output)
    for line in notes[1:]:
        logger.info("%s", line)
    return 0


class _Stopped(BaseException):
    """Raised in the main thread by the launcher's SIGINT/SIGTERM handler (a BaseException: nothing swallows it)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class _StopSignals:
    """The launcher's own SIGINT and SIGTERM handlers, installed whatever the process inherited.

    Python installs its KeyboardInterrupt handler only when SIGINT was not
    inherited as ignored (``nohup``, a background job of a non-interactive
    shell), and leaves SIGTERM at its default (die at once, leaving the tasks
    to ``PR_SET_PDEATHSIG``). The first signal raises :class:`_Stopped` in the
    main thread, which stops every task; later ones are logged and ignored
    while the bounded stop runs.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self._previous: dict[int, object] = {}
        self.received: int | None = None

    def install(self) -> "_StopSignals":
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.received is not None:
            logger.info("got %s again; already stopping every task", signal.Signals(signum).name)
            return
        self.received = signum
        raise _Stopped(signum)

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()


def _run_one_task(config, task, script, script_args) -> int:
    config.security.check_tls_files(job=task.job)
    if config.cluster.is_unassigned():
        raise ConfigError(
            "--task needs every task's real address in cluster (host:port); this config uses counts "
            "or port 0, which only a local launch can fill in. Write the addresses, e.g. "
            'worker: ["10.0.0.2:2222", "10.0.0.3:2222"].'
        )
    token = config.security.resolve_token()
    if token is None:
        raise ConfigError(
            f"--task needs the job token: set the environment variable {config.security.token_env} "
            "to the same secret on every machine (or security.token in the config)."
        )
    env = task_environment(config, task, token)
    argv = task_argv(task, script, script_args, config)
    logger.info("starting %s: %s", task, " ".join(argv))
    if zygote.can_become(argv, env):  # forked from a zygote (fast start): TensorFlow is imported already
        logging.root.handlers.clear()  # what basicConfig above added: the task's logging starts as a fresh one's
        logging.root.setLevel(logging.WARNING)
        zygote.become(argv, env)  # never returns, as execve
    os.execve(argv[0], argv, env)
    return 1  # not reached


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=os.environ.get(constants.ENV_LOG_LEVEL, "INFO"),
        format="[launch] %(message)s",
    )
    try:
        _check_timeout_option(args.timeout)
        _check_emit_options(args)
        config = load_config(args.config)
        if args.emit:
            return _emit(config, args)
        if args.log_all:
            config.launch.log_all_tasks = True
        if args.script and not os.path.exists(args.script):
            raise ConfigError(f"Script not found: {args.script!r}.")
        if args.task:
            return _run_one_task(config, parse_task(args.task), args.script, args.script_args)
        if not args.script:
            raise ConfigError("Give the training script to run, e.g. examples/train_digits.py.")
        config.security.check_tls_files()  # every task runs here
        config.ps.check_checkpoint_dir()
        job = LocalJob(config, args.script, args.script_args, log_dir=args.log_dir)
    except TfdistError as e:
        print(f"tfdist.launch: {e}", file=sys.stderr)
        return 2
    if args.timeout is not None:
        timeout, timeout_setting = args.timeout, "--timeout"
    else:
        timeout, timeout_setting = config.launch.job_timeout_s, "launch.job_timeout_s"
    cluster = job.config.cluster
    logger.info(
        "job %r: %s; logs in %s",
        config.name,
        ", ".join(f"{job_name} x{len(a)}" for job_name, a in cluster.jobs().items()),
        job.log_dir,
    )

    stop_signals = _StopSignals().install()
    try:
        if job.config.elastic.enabled:
            from tfdist.elastic.local import run_local_elastic

            result = run_local_elastic(job, timeout=timeout, timeout_setting=timeout_setting)
            logger.info("elastic job: %d batches in %.1f s, %.1f worker-seconds, settled at %s worker(s) after %s s",
                        result.progress, result.completion_s, result.worker_seconds, result.settled_workers,
                        "-" if result.settled_s is None else f"{result.settled_s:.1f}")
        else:
            job.start()
            job.wait(timeout, timeout_setting=timeout_setting)
    except (_Stopped, KeyboardInterrupt) as e:
        signum = e.signum if isinstance(e, _Stopped) else signal.SIGINT
        print(f"tfdist.launch: got {signal.Signals(signum).name}; stopping every task", file=sys.stderr)
        job.stop(grace=3.0)
        return 128 + signum
    except (TaskConfigError, TLSConfigError) as e:  # TLS: the elastic engine's own client reaches the PS tasks
        print(f"tfdist.launch: {e}", file=sys.stderr)
        return 2
    except LaunchError as e:
        print(f"tfdist.launch: {e}", file=sys.stderr)
        return 1
    finally:
        job.stop()
        stop_signals.restore()
    if job.failed_workers:
        logger.warning("job %r finished without %s, which failed (launch.on_worker_failure=%s); logs in %s",
                       config.name, ", ".join(map(str, job.failed_workers)), config.launch.on_worker_failure,
                       job.log_dir)
    else:
        logger.info("job %r finished; logs in %s", config.name, job.log_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
