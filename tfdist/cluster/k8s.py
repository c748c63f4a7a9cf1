"""Kubernetes manifests for a job: a Kubeflow ``TFJob``, or plain Jobs behind a headless Service (no operator).

``python -m tfdist.launch --config FILE --emit {kubeflow,k8s} --image IMAGE script.py`` prints them;
docs/kubernetes.md describes what they contain. Everything here is a pure function of a
:class:`~tfdist.config.JobConfig`: nothing talks to a cluster or imports TensorFlow.

Every task gets a stable DNS name in place of the addresses (or counts) the
config lists, and one port for all (:data:`DEFAULT_PORT`; each pod has its own IP):

* plain manifests (:func:`kubernetes_jobs`): ``<name>-<job>-<index>.<name>:<port>``,
  the pod's ``hostname`` under the job's headless Service (its ``subdomain``);
* Kubeflow (:func:`kubeflow_tfjob`): ``<name>-<job>-<index>.<namespace>.svc:<port>``,
  the per-replica Service the training operator creates.

:func:`kubernetes_config` and :func:`kubeflow_config` return the config with
those addresses. A pod of the plain manifests gets ``TF_CONFIG`` =
``json.dumps(kubernetes_config(config).tf_config(task))``; in a TFJob the
operator writes ``TF_CONFIG`` itself and it names the same addresses, every
replica type included (the operator's ``genClusterSpec`` lists ``evaluator``
too, v1.2 to v1.9), plus ``"environment": "cloud"``. Every pod also
gets ``TFDIST_CONFIG`` (the rest of the config, as the local launcher sets it)
and the job token as a file from the Secret ``<name>-token`` (key ``token``,
mounted at :data:`TOKEN_MOUNT_PATH` with mode 0400; ``security.token_file``
points there), never as an environment variable. Every pod has resource
requests and a memory limit (``kubernetes.resources``), ``imagePullPolicy``
(``kubernetes.image_pull_policy``) and a securityContext that Pod Security
"restricted" admits (``kubernetes.run_as_user``).

Example:

>>> from tfdist.config import JobConfig
>>> cfg = JobConfig.from_dict({"name": "digits", "cluster": {"ps": 1, "worker": 2}})
>>> kubernetes_config(cfg).cluster.ps
['digits-ps-0.digits:2222']
>>> [d["kind"] for d in kubernetes_jobs(cfg, "registry/digits:1", "train.py")]
['Service', 'Job', 'Job', 'Job']
"""

from __future__ import annotations

import copy

import dataclasses
import math
import re
import secrets
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from tfdist import constants
from tfdist.cluster.failure import ENDED_BY_ITSELF_EXIT_CODES
from tfdist.cluster.local import task_argv, task_environment
from tfdist.config import JOB_NAMES, ClusterConfig, JobConfig, TaskSpec
from tfdist.errors import ConfigError

__all__ = [
    "DEFAULT_PORT",
    "CHECKPOINT_MOUNT_PATH",
    "TLS_MOUNT_PATH",
    "TOKEN_MOUNT_PATH",
    "SECRET_FILE_MODE",
    "TLS_SECRET_KEYS",
    "TOKEN_SECRET_KEY",
    "KUBEFLOW_REPLICA_TYPES",
    "RESTART_LIMIT",
    "check_job_name",
    "task_host",
    "token_secret_name",
    "tls_secret_name",
    "checkpoint_claim_name",
    "ps_checkpoint_claim",
    "kubernetes_config",
    "kubeflow_config",
    "kubernetes_jobs",
    "kubeflow_tfjob",
    "token_secret",
    "prerequisites",
    "dump_yaml",
]

#: The port every task listens on (Kubeflow's default ``tfjob-port``).
DEFAULT_PORT = 2222
#: Where the checkpoint volume is mounted (PS pods and the chief's).
CHECKPOINT_MOUNT_PATH = "/checkpoints"
#: Where the TLS Secret ``<name>-tls`` is mounted (read-only, files mode 0400).
TLS_MOUNT_PATH = "/etc/tfdist/tls"
#: Where the token Secret ``<name>-token`` is mounted (read-only, mode 0400); the token is file ``token`` there.
TOKEN_MOUNT_PATH = "/etc/tfdist/token"
#: Mode of the secret files in the pods: readable by their owner only (with ``fsGroup`` set, the kubelet adds
#: read for the pod's group, which is how the non-root user reads them).
SECRET_FILE_MODE = 0o400
#: Key of each TLS file in the Secret ``<name>-tls``, by config field.
TLS_SECRET_KEYS = {"tls_cert": "tls.crt", "tls_key": "tls.key", "tls_ca": "ca.crt"}
#: Key of the token in the Secret ``<name>-token``.
TOKEN_SECRET_KEY = "token"
#: TFJob replica type of each tfdist job (a TFJob has no replica type for ``input`` tasks).
KUBEFLOW_REPLICA_TYPES = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}
#: ``backoffLimit`` of an ``OnFailure`` Job (or of a TFJob, all replicas together): Kubernetes and the
#: operator fail the job when its restarts reach it, so a job survives ``RESTART_LIMIT - 1`` (2) restarts.
RESTART_LIMIT = 3

#: Order of the Jobs in the plain manifests (servers first, as the local launcher starts them).
_JOB_ORDER = ("ps", "input", "chief", "worker", "evaluator")
#: Jobs whose pods run tfdist's own servers (``python -m tfdist.ps`` / ``tfdist.data.queue_service``), never the script.
_SERVER_JOBS = ("ps", "input")
_LABEL_JOB = "tfdist/job-name"
_LABEL_TYPE = "tfdist/replica-type"
_LABEL_INDEX = "tfdist/replica-index"
_PYTHON = "python"
_PORT_NAME = "tfdist"
#: Container and port names the training operator looks for (it reads the port from them).
_KUBEFLOW_CONTAINER = "tensorflow"
_KUBEFLOW_PORT_NAME = "tfjob-port"
#: Longest Kubernetes name that is also a DNS label (Service, pod hostname, ``job-name`` label).
_MAX_LABEL = 63
_DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")  # RFC 1035 (Service names)
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # namespaces
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


# ------------------------------------------------------------------- names
def task_host(config: JobConfig, task: TaskSpec) -> str:
    """``<name>-<job>-<index>``: the task's pod hostname, Job name and (Kubeflow) Service name."""
    return f"{config.name}-{task.job}-{task.index}"


def token_secret_name(config: JobConfig) -> str:
    """``<name>-token``: the Secret holding the job token (key :data:`TOKEN_SECRET_KEY`)."""
    return f"{config.name}-token"


def tls_secret_name(config: JobConfig) -> str:
    """``<name>-tls``: the Secret holding the TLS files (keys :data:`TLS_SECRET_KEYS`)."""
    return f"{config.name}-tls"


def checkpoint_claim_name(config: JobConfig) -> str:
    """``<name>-checkpoints``: the default PersistentVolumeClaim mounted at :data:`CHECKPOINT_MOUNT_PATH`."""
    return f"{config.name}-checkpoints"


def _tasks(config: JobConfig, jobs: Iterable[str] = _JOB_ORDER) -> list[TaskSpec]:
    return [TaskSpec(job, i) for job in jobs for i in range(len(getattr(config.cluster, job)))]


def check_job_name(config: JobConfig) -> None:
    """Refuses a ``config.name`` that cannot name the job's Kubernetes objects.

    The name becomes the Service name and starts every pod hostname
    (``<name>-<job>-<index>``), so it must be an RFC 1035 DNS label: lowercase
    letters, digits and ``-``, starting with a letter, ending with a letter or
    a digit, and short enough that the longest hostname has at most 63
    characters.

    Raises:
        ConfigError: naming ``name``, the value and the longest name allowed.
    """
    name = config.name
    longest = max((task_host(config, t) for t in _tasks(config)), key=len)
    room = _MAX_LABEL - (len(longest) - len(name))
    if not _DNS_LABEL.fullmatch(name) or len(name) > room:
        suggestion = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
        suggestion = re.sub(r"^[^a-z]+", "", suggestion)[:room].rstrip("-") or "tfdist"
        raise ConfigError(
            f"Invalid config field `name` for Kubernetes. Received: name={name!r}. It names the job's Service and "
            f"starts every pod hostname (the longest: {longest!r}), so it must be a DNS label: lowercase letters, "
            f"digits and '-', starting with a letter and ending with a letter or digit, at most {room} characters "
            f"for this cluster (hostnames have at most {_MAX_LABEL}). Use e.g. name: {suggestion}."
        )


def _check_emittable(config: JobConfig, kubeflow: bool) -> None:
    check_job_name(config)
    if config.elastic.enabled:
        raise ConfigError(
            "Invalid config field `elastic.enabled` for Kubernetes. Received: elastic.enabled=True. The elastic "
            "engine starts and stops worker processes on the launcher's machine; the manifests run a fixed set of "
            "tasks. Remove the `elastic` section (or write `enabled: false`) to emit manifests."
        )
    if kubeflow and config.cluster.input:
        raise ConfigError(
            f"Invalid config field `cluster.input` for Kubeflow. Received: cluster.input has "
            f"{len(config.cluster.input)} task(s). A TFJob has no replica type for input tasks (only "
            f"{', '.join(KUBEFLOW_REPLICA_TYPES.values())}). Use --emit k8s (plain Jobs), or remove the input tasks."
        )


# --------------------------------------------------------- addressed configs
def _addressed(config: JobConfig, address) -> JobConfig:
    """``config`` with every task at ``address(task)``, the TLS files and the token file at their mount paths."""
    jobs = {job: [address(TaskSpec(job, i)) for i in range(len(getattr(config.cluster, job)))] for job in JOB_NAMES}
    tls = {name: f"{TLS_MOUNT_PATH}/{key}" if getattr(config.security, name) else None
           for name, key in TLS_SECRET_KEYS.items()}
    return dataclasses.replace(config, cluster=ClusterConfig(**jobs),
                               security=dataclasses.replace(config.security, token=None, **tls,
                                                            token_file=f"{TOKEN_MOUNT_PATH}/{TOKEN_SECRET_KEY}"))


def _check_port(port: Any) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ConfigError(f"Invalid port. Received: port={port!r}. Give an integer in 1..65535, e.g. {DEFAULT_PORT}.")


def _check_namespace(namespace: Any) -> None:
    if not isinstance(namespace, str) or len(namespace) > _MAX_LABEL or not _DNS1123_LABEL.fullmatch(namespace):
        raise ConfigError(
            f"Invalid Kubernetes namespace (--namespace). Received: namespace={namespace!r}. Give a DNS label: "
            f"lowercase letters, digits and '-', at most {_MAX_LABEL} characters, e.g. 'default' or 'training'."
        )


def kubernetes_config(config: JobConfig, port: int = DEFAULT_PORT) -> JobConfig:
    """The config whose tasks are the pods of :func:`kubernetes_jobs`.

    Each task is at ``<name>-<job>-<index>.<name>:<port>``: the pod's
    hostname under the headless Service ``<name>``, found through the pod's
    DNS search path in any namespace. Counts (``worker: 2``) and addresses
    alike are replaced. TLS fields, when set, point into
    :data:`TLS_MOUNT_PATH`; nothing else changes.

    Args:
        config: The job.
        port: The port every task listens on. Defaults to :data:`DEFAULT_PORT`.

    Raises:
        ConfigError: the job name is no DNS label, or the job is elastic.
    """
    _check_emittable(config, kubeflow=False)
    _check_port(port)
    return _addressed(config, lambda task: f"{task_host(config, task)}.{config.name}:{port}")


def kubeflow_config(config: JobConfig, namespace: str = "default", port: int = DEFAULT_PORT) -> JobConfig:
    """The config whose tasks are the pods of :func:`kubeflow_tfjob`.

    Each task is at ``<name>-<job>-<index>.<namespace>.svc:<port>``, the
    address the training operator writes into ``TF_CONFIG`` (with its
    ``CUSTOM_CLUSTER_DOMAIN`` unset, the default). TLS fields, when set,
    point into :data:`TLS_MOUNT_PATH`; nothing else changes.

    Args:
        config: The job.
        namespace: The namespace the TFJob runs in. Defaults to ``"default"``.
        port: The port every task listens on. Defaults to :data:`DEFAULT_PORT`.

    Raises:
        ConfigError: the job name is no DNS label, the job is elastic or has
            input tasks (a TFJob has no replica type for them).
    """
    _check_emittable(config, kubeflow=True)
    _check_namespace(namespace)
    _check_port(port)
    return _addressed(config, lambda task: f"{task_host(config, task)}.{namespace}.svc:{port}")


# --------------------------------------------------------------- pod parts
@dataclass(frozen=True)
class _PodOptions:
    """What every pod of a job shares, checked once."""

    image: str
    script: str | None  # None: training pods run the image's own entrypoint
    script_args: tuple[str, ...]
    namespace: str
    port: int
    checkpoint_claim: str | None  # None: no checkpoint volume
    claim_per_ps: bool = False  # PS task i mounts <checkpoint_claim>-ps-<i>

    def __post_init__(self):
        if not isinstance(self.image, str) or not self.image or any(c.isspace() for c in self.image):
            raise ConfigError(
                f"Invalid container image (--image). Received: image={self.image!r}. Give the image holding your "
                "code and tfdist, e.g. --image registry.example.com/digits:1."
            )
        if self.script is not None and (not isinstance(self.script, str) or not self.script):
            raise ConfigError(
                f"Invalid training script. Received: script={self.script!r}. Give its path inside the image, e.g. "
                "examples/train_digits.py, or None to run the image's own entrypoint on chief, worker and "
                "evaluator pods."
            )
        if self.script is None and self.script_args:
            raise ConfigError(
                f"Script arguments without a script. Received: script=None, script_args={list(self.script_args)!r}. "
                "Give the script too, or bake the arguments into the image's command."
            )
        _check_namespace(self.namespace)
        _check_port(self.port)
        claim = self.checkpoint_claim
        if claim is not None and (not isinstance(claim, str) or len(claim) > 253
                                  or not _DNS1123_SUBDOMAIN.fullmatch(claim)):
            raise ConfigError(
                f"Invalid PersistentVolumeClaim name (--checkpoint-claim). Received: checkpoint_claim={claim!r}. "
                "Give a DNS name: lowercase letters, digits, '-' and '.', e.g. digits-checkpoints."
            )


def _options(config: JobConfig, image, script, script_args, namespace, port, checkpoint_claim,
             checkpoint_volume: bool, claim_per_ps: bool = False) -> _PodOptions:
    claim = (checkpoint_claim or checkpoint_claim_name(config)) if checkpoint_volume else None
    if claim_per_ps and claim is None:
        raise ConfigError("One checkpoint claim per PS task needs a checkpoint volume. Received: "
                          "--checkpoint-claim-per-ps with --no-checkpoint-volume. Leave one of them out.")
    return _PodOptions(image, script, tuple(str(a) for a in script_args), namespace, port, claim, claim_per_ps)


def _security_context(config: JobConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(pod securityContext, container securityContext)`` that Pod Security "restricted" admits."""
    uid = config.kubernetes.run_as_user
    pod = {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "fsGroup": uid,
           "seccompProfile": {"type": "RuntimeDefault"}}
    container = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    return pod, container


def _saves(config: JobConfig, job: str) -> bool:
    """Whether ``job`` plays the chief: ``chief``, or ``worker`` (its task 0 initialises the PS) without one."""
    return job == "chief" or (job == "worker" and not config.cluster.chief)


def _env(config: JobConfig, task: TaskSpec, with_tf_config: bool) -> list[dict[str, Any]]:
    """The task's environment as the local launcher builds it, less the token (a mounted file, :func:`_volumes`)."""
    token_env = config.security.token_env
    env = task_environment(config, task, token="<from the Secret>", base={})
    out = []
    for name, value in env.items():
        if name != token_env and (name != constants.ENV_TF_CONFIG or with_tf_config):
            out.append({"name": name, "value": value})
    return out


def ps_checkpoint_claim(claim: str, index: int) -> str:
    """``<claim>-ps-<index>``: PS task ``index``'s own claim (``--checkpoint-claim-per-ps``)."""
    return f"{claim}-ps-{index}"


def _volumes(config: JobConfig, task: TaskSpec, opts: _PodOptions, saves: bool) -> tuple[list[dict], list[dict]]:
    """``(volumes, volumeMounts)``: the checkpoint claim (PS, chief), the token and the TLS files this job reads."""
    volumes, mounts = [], []
    job = task.job
    if opts.checkpoint_claim and (job == "ps" or saves):
        claim = opts.checkpoint_claim
        if job == "ps" and opts.claim_per_ps:
            claim = ps_checkpoint_claim(claim, task.index)
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": claim}})
        mounts.append({"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT_PATH})
    volumes.append({"name": "token", "secret": {"secretName": token_secret_name(config), "defaultMode": SECRET_FILE_MODE,
                                                "items": [{"key": TOKEN_SECRET_KEY, "path": TOKEN_SECRET_KEY}]}})
    mounts.append({"name": "token", "mountPath": TOKEN_MOUNT_PATH, "readOnly": True})
    fields = config.security.tls_fields(job)
    if fields:
        items = [{"key": TLS_SECRET_KEYS[f], "path": TLS_SECRET_KEYS[f]} for f in fields]
        volumes.append({"name": "tls", "secret": {"secretName": tls_secret_name(config), "items": items,
                                                  "defaultMode": SECRET_FILE_MODE}})
        mounts.append({"name": "tls", "mountPath": TLS_MOUNT_PATH, "readOnly": True})
    return volumes, mounts


#: Where PS pods write their checkpoints on the checkpoint volume when the config names no ``ps.checkpoint_dir``.
PS_CHECKPOINT_SUBDIR = "ps"


def _chief_restarts(config: JobConfig) -> bool:
    """Whether a killed chief is started again: it rejoins a running PS job (``launch.restart_chief``)."""
    return bool(config.cluster.ps and config.launch.restart_chief)


def chief_pod_failure_policy(container: str) -> dict[str, Any]:
    """The chief Job's ``podFailurePolicy``: the local launcher's restart rule (``decide_chief_restart``).

    A chief that ended by itself with an error (exit codes 1-127: a Python
    exception, ``sys.exit(n)``, ``os._exit(n)``, a ``ConfigError``'s 78)
    fails its Job at once: its script would run into the same error again.
    One killed by a signal (128 + N: SIGKILL, the OOM killer, SIGTERM, a
    crash) is replaced, up to the Job's ``backoffLimit``; one evicted or
    preempted (``DisruptionTarget``, checked first) is replaced without
    counting. A chief that finished and hung on its way out ends with exit 0
    (the exit watchdog, :func:`tfdist.strategies._stuck.arm_exit_watchdog`),
    so its Job completes, as the launcher counts it finished.
    """
    return {"rules": [
        # first: a pod evicted or preempted is replaced whatever its code (status: required by JobSet's CRD v0.9.1)
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "FailJob", "onExitCodes": {"containerName": container, "operator": "In",
                                              "values": list(ENDED_BY_ITSELF_EXIT_CODES)}},
    ]}


def _with_ps_checkpoints(config: JobConfig, opts: _PodOptions) -> JobConfig:
    """PS pods checkpoint onto the mounted claim (``/checkpoints/ps``) unless the config says where."""
    if not opts.checkpoint_claim or not config.cluster.ps or config.ps.checkpoint_dir:
        return config
    config = copy.deepcopy(config)
    config.ps.checkpoint_dir = f"{CHECKPOINT_MOUNT_PATH}/{PS_CHECKPOINT_SUBDIR}"
    return config


def _pod_spec(config: JobConfig, task: TaskSpec, opts: _PodOptions, *, container: str, port_name: str,
              with_tf_config: bool, saves: bool, restart_policy: str) -> dict[str, Any]:
    volumes, mounts = _volumes(config, task, opts, saves)
    pod_security, container_security = _security_context(config)
    spec: dict[str, Any] = {"name": container, "image": opts.image,
                            "imagePullPolicy": config.kubernetes.image_pull_policy}
    if opts.script is not None or task.job in _SERVER_JOBS:
        argv = task_argv(task, opts.script, opts.script_args, config)
        spec["command"] = [_PYTHON, *argv[1:]]
    spec["ports"] = [{"name": port_name, "containerPort": opts.port}]
    stream_port = config.ps.stream_port
    if (task.job == "ps" and stream_port is not None and config.ps.transport == "auto"
            and not config.security.tls):  # the data plane's fixed port (ps.stream_port), for a NetworkPolicy
        spec["ports"].append({"name": "tfdist-stream", "containerPort": stream_port})
    spec["env"] = _env(config, task, with_tf_config)
    resources = config.kubernetes.resources.get(task.job) or {}
    if any(resources.values()):
        spec["resources"] = {kind: dict(values) for kind, values in resources.items() if values}
    spec["securityContext"] = container_security
    spec["volumeMounts"] = mounts
    return {"restartPolicy": restart_policy, "securityContext": pod_security, "containers": [spec],
            "volumes": volumes}


def _metadata(config: JobConfig, name: str, namespace: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": dict(labels)}


def _deadline(config: JobConfig) -> dict[str, int]:
    """``activeDeadlineSeconds`` from ``launch.job_timeout_s`` (none when unset)."""
    timeout = config.launch.job_timeout_s
    return {} if timeout is None else {"activeDeadlineSeconds": max(1, math.ceil(timeout))}


def _ttl(config: JobConfig) -> dict[str, int]:
    """``ttlSecondsAfterFinished`` from ``kubernetes.ttl_seconds_after_finished`` (none when null)."""
    ttl = config.kubernetes.ttl_seconds_after_finished
    return {} if ttl is None else {"ttlSecondsAfterFinished": ttl}


# ------------------------------------------------------------- manifests
def kubernetes_jobs(
    config: JobConfig,
    image: str,
    script: str | None = None,
    script_args: Sequence[str] = (),
    *,
    namespace: str = "default",
    port: int = DEFAULT_PORT,
    checkpoint_claim: str | None = None,
    checkpoint_volume: bool = True,
    checkpoint_claim_per_ps: bool = False,
) -> list[dict[str, Any]]:
    """Plain Kubernetes manifests (no operator): one headless Service, then one Job per task.

    One Job per task, not one Indexed Job per job type: each pod then gets
    its own literal ``TF_CONFIG`` (no ``$(JOB_COMPLETION_INDEX)`` expansion
    to trust), its own restart policy (the chief's differs from the other
    workers'), a fixed hostname that a replacement pod keeps, and a name to
    address it by (``kubectl logs job/digits-worker-1``); it needs no
    Kubernetes newer than ``hostname``/``subdomain`` (every supported one).
    A few hundred tasks make a few hundred Jobs, which Kubernetes handles.

    The Service ``<name>`` (``clusterIP: None``, ``publishNotReadyAddresses``
    so names resolve before the pods are ready) gives each pod
    ``<name>-<job>-<index>.<name>``. Pod ``<name>-<job>-<index>`` runs
    ``python SCRIPT ARGS`` (chief, worker, evaluator; the image's entrypoint
    without a script), ``python -m tfdist.ps``
    (ps) or ``python -m tfdist.data.queue_service`` (input) in ``image`` with
    ``TF_CONFIG`` and ``TFDIST_CONFIG`` of :func:`kubernetes_config` and the
    token from the Secret ``<name>-token``.

    Restart policies: every task but the chief ``OnFailure``: a worker
    restarts in place and rejoins from the current values; a PS task
    restarts in place at the same address and restores its newest
    checkpoint from the checkpoint volume (``ps.checkpoint_dir``, by default
    ``/checkpoints/ps`` on the claim), and the workers reconnect. The chief
    (worker 0 when there is no chief) follows the local launcher's rule
    (:func:`~tfdist.cluster.failure.decide_chief_restart`): its pod is
    ``Never`` and its Job replaces it (same hostname; it rejoins the running
    job) when it was killed by a signal, while exit codes 1-127 (it ended by
    itself with an error) fail the Job at once
    (:func:`chief_pod_failure_policy`); with ``launch.restart_chief: false``,
    or in a job without parameter servers, its Job has ``backoffLimit: 0``.
    The other Jobs, and a restarting chief's, get ``backoffLimit:``
    :data:`RESTART_LIMIT`: a Job fails when its restarts reach it (2
    restarts survive). ``launch.job_timeout_s`` becomes every Job's
    ``activeDeadlineSeconds``.

    Args:
        config: The job. Counts and addresses in its cluster are replaced by
            pod DNS names (:func:`kubernetes_config`).
        image: Container image with Python, tfdist and the script.
        script: The training script's path inside the image (relative to its
            working directory). Defaults to ``None``: chief, worker and
            evaluator pods run the image's own entrypoint (with the same
            environment).
        script_args: The script's arguments.
        namespace: Namespace of every object. Defaults to ``"default"``.
        port: The port every task listens on. Defaults to :data:`DEFAULT_PORT`.
        checkpoint_claim: PersistentVolumeClaim mounted at
            :data:`CHECKPOINT_MOUNT_PATH` on PS pods and the chief's. Defaults
            to ``<name>-checkpoints``.
        checkpoint_volume: Mount the checkpoint claim at all. Defaults to ``True``.
        checkpoint_claim_per_ps: PS task ``i`` mounts its own claim
            ``<checkpoint_claim>-ps-<i>`` (ReadWriteOnce is enough), the chief
            the shared one. Defaults to ``False`` (one claim for all).

    PS Jobs also get ``podReplacementPolicy: Failed`` (Kubernetes >= 1.29): a
    replacement PS pod starts only once the old one has terminated, never
    beside it (two writers on one checkpoint folder). Every Job gets
    ``ttlSecondsAfterFinished`` (``kubernetes.ttl_seconds_after_finished``).

    Returns:
        ``[Service, Job, ...]``, the Jobs in the order ps, input, chief, worker, evaluator.

    Raises:
        ConfigError: a bad job name, image, script, namespace, port or claim
            name, or an elastic job.
    """
    addressed = kubernetes_config(config, port)  # the job name first: every other name derives from it
    opts = _options(config, image, script, script_args, namespace, port, checkpoint_claim, checkpoint_volume,
                    checkpoint_claim_per_ps)
    addressed = _with_ps_checkpoints(addressed, opts)
    labels = {_LABEL_JOB: config.name}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(config, config.name, namespace, labels),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": dict(labels),
            "ports": [{"name": _PORT_NAME, "port": port, "targetPort": port}],
        },
    }
    docs = [service]
    chief_task = TaskSpec("chief", 0) if config.cluster.chief else TaskSpec("worker", 0)
    for task in _tasks(addressed):
        host = task_host(config, task)
        plays_chief = task == chief_task
        # The chief's pod is replaced (a new pod, same hostname) by the launcher's rule; the others restart in place.
        policy = "Never" if plays_chief else "OnFailure"
        restarts = not plays_chief or _chief_restarts(config)
        pod_labels = {**labels, _LABEL_TYPE: task.job, _LABEL_INDEX: str(task.index)}
        pod = _pod_spec(addressed, task, opts, container="tfdist", port_name=_PORT_NAME, with_tf_config=True,
                        saves=plays_chief, restart_policy=policy)
        pod = {"hostname": host, "subdomain": config.name, **pod}
        failure = {"podFailurePolicy": chief_pod_failure_policy("tfdist")} if plays_chief and restarts else {}
        docs.append({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": _metadata(config, host, namespace, pod_labels),
            "spec": {
                "backoffLimit": RESTART_LIMIT if restarts else 0,
                **_deadline(config),
                **_ttl(config),
                **failure,
                # PS: never two pods on one checkpoint folder; the chief: required with podFailurePolicy
                **({"podReplacementPolicy": "Failed"} if task.job == "ps" or failure else {}),
                "template": {"metadata": {"labels": pod_labels}, "spec": pod},
            },
        })
    return docs


def kubeflow_tfjob(
    config: JobConfig,
    image: str,
    script: str | None = None,
    script_args: Sequence[str] = (),
    *,
    namespace: str = "default",
    port: int = DEFAULT_PORT,
    checkpoint_claim: str | None = None,
    checkpoint_volume: bool = True,
    checkpoint_claim_per_ps: bool = False,
) -> dict[str, Any]:
    """A Kubeflow ``TFJob`` (``kubeflow.org/v1``; the training operator runs it).

    One replica spec per job type (``Chief``, ``Worker``, ``PS``,
    ``Evaluator``) with the config's task counts. The operator creates a pod
    and a Service per replica and writes each pod's ``TF_CONFIG`` itself: the
    addresses of :func:`kubeflow_config` (the port from the container's
    ``tfjob-port``). Each pod also gets ``TFDIST_CONFIG`` of that config and
    the token from the Secret ``<name>-token``.

    Restart policies: ``Worker``, ``PS`` and ``Evaluator`` ``OnFailure``, with
    ``runPolicy.backoffLimit:`` :data:`RESTART_LIMIT` (the TFJob fails when the
    restarts of all its pods together reach it: 2 survive);
    a PS restores its newest checkpoint from the checkpoint volume. ``Chief``
    ``ExitCode`` (the operator's nearest to the local launcher's rule: a
    chief killed by SIGINT, SIGKILL, SIGUSR1 or SIGTERM restarts and rejoins
    the running job, ``launch.restart_chief``; one that exits 1-127 fails
    the TFJob; unlike the launcher, the operator counts every other code,
    e.g. SIGSEGV's 139 and SIGABRT's 134, as permanent, and its
    ``backoffLimit`` does not count ``ExitCode`` restarts: set
    ``launch.job_timeout_s`` to bound a chief killed again and again), or ``Never`` with
    ``launch.restart_chief: false`` (its failure fails the TFJob, and
    ``cleanPodPolicy: Running`` removes the other pods). Workers share one pod template, so
    without a chief worker 0 restarts like the others: give the config a
    chief. The TFJob succeeds when the chief (else worker 0) exits 0; then
    ``cleanPodPolicy: Running`` deletes every pod still running — the PS
    tasks, and workers still in ``fit`` or an evaluator, which are cut short.
    It fails when any pod fails for good (past its restarts, or ``Never``).
    ``launch.job_timeout_s`` becomes ``runPolicy.activeDeadlineSeconds``.

    Args:
        config: The job. Counts and addresses in its cluster are replaced by
            the operator's addresses (:func:`kubeflow_config`).
        image: Container image with Python, tfdist and the script.
        script: The training script's path inside the image. Defaults to
            ``None``: chief, worker and evaluator pods run the image's own
            entrypoint (with the same environment).
        script_args: The script's arguments.
        namespace: Namespace of the TFJob (it is part of every address).
            Defaults to ``"default"``.
        port: The port every task listens on. Defaults to :data:`DEFAULT_PORT`.
        checkpoint_claim: PersistentVolumeClaim mounted at
            :data:`CHECKPOINT_MOUNT_PATH` on the PS pods and the chief's (every
            worker's when there is no chief). Defaults to ``<name>-checkpoints``.
        checkpoint_volume: Mount the checkpoint claim at all. Defaults to ``True``.
        checkpoint_claim_per_ps: Refused (``ConfigError``): the PS replicas
            of a TFJob share one template. Defaults to ``False``.

    Raises:
        ConfigError: a bad job name, image, script, namespace, port or claim
            name; an elastic job; input tasks; ``checkpoint_claim_per_ps``.
    """
    addressed = kubeflow_config(config, namespace, port)  # the job name first: every other name derives from it
    if checkpoint_claim_per_ps:
        raise ConfigError("A TFJob cannot give each PS task its own checkpoint claim: its PS replicas share one pod "
                          "template. Received: --checkpoint-claim-per-ps with --emit kubeflow. Use --emit k8s, or "
                          "one ReadWriteMany claim for every PS task (each writes its own ps-<i>/ folder).")
    opts = _options(config, image, script, script_args, namespace, port, checkpoint_claim, checkpoint_volume)
    addressed = _with_ps_checkpoints(addressed, opts)
    labels = {_LABEL_JOB: config.name}
    replicas = {}
    for job, replica_type in KUBEFLOW_REPLICA_TYPES.items():
        count = len(getattr(addressed.cluster, job))
        if not count:
            continue
        policy = "OnFailure"
        if job == "chief":  # the operator's ExitCode: exit 1-127 fails the TFJob, SIGINT/KILL/USR1/TERM restart
            policy = "ExitCode" if _chief_restarts(config) else "Never"
        # TF_CONFIG comes from the operator; the rest of the environment is the same for every index.
        pod = _pod_spec(addressed, TaskSpec(job, 0), opts, container=_KUBEFLOW_CONTAINER,
                        port_name=_KUBEFLOW_PORT_NAME, with_tf_config=False, saves=_saves(config, job),
                        restart_policy=policy)
        del pod["restartPolicy"]  # a replica spec field in a TFJob
        replicas[replica_type] = {
            "replicas": count,
            "restartPolicy": policy,
            "template": {"metadata": {"labels": {**labels, _LABEL_TYPE: job}}, "spec": pod},
        }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": _metadata(config, config.name, namespace, labels),
        "spec": {
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": RESTART_LIMIT, **_deadline(config),
                          **_ttl(config)},
            "tfReplicaSpecs": replicas,
        },
    }


def token_secret(config: JobConfig, namespace: str = "default", token: str | None = None) -> dict[str, Any]:
    """The Secret ``<name>-token`` the pods read the job token from.

    Args:
        config: The job.
        namespace: Its namespace. Defaults to ``"default"``.
        token: The token. Defaults to 64 random hex digits.

    Raises:
        ConfigError: ``token`` is shorter than 8 characters.
    """
    check_job_name(config)
    _check_namespace(namespace)
    if token is None:
        token = secrets.token_hex(32)
    if not isinstance(token, str) or len(token) < 8:
        raise ConfigError("Invalid job token: it must be a string of at least 8 characters (value not shown). "
                          "Leave it out for a random one.")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(config, token_secret_name(config), namespace, {_LABEL_JOB: config.name}),
        "type": "Opaque",
        "stringData": {TOKEN_SECRET_KEY: token},
    }


def prerequisites(config: JobConfig, namespace: str = "default", *, checkpoint_claim: str | None = None,
                  checkpoint_volume: bool = True, token_secret_included: bool = False,
                  checkpoint_claim_per_ps: bool = False) -> list[str]:
    """What must exist in the namespace before the manifests are applied, as comment lines.

    Args:
        config: The job.
        namespace: Its namespace. Defaults to ``"default"``.
        checkpoint_claim: The checkpoint claim's name. Defaults to ``<name>-checkpoints``.
        checkpoint_volume: Whether the manifests mount it. Defaults to ``True``.
        token_secret_included: The token Secret is among the manifests.
            Defaults to ``False`` (say how to create it).
        checkpoint_claim_per_ps: Each PS task mounts its own claim. Defaults to ``False``.
    """
    ns = f" -n {namespace}"
    lines = [f"tfdist job {config.name!r}. Apply: kubectl apply{ns} -f FILE. Remove: kubectl delete{ns} -f FILE."]
    if not token_secret_included:
        lines.append(f"Create the job token first: kubectl create secret generic {token_secret_name(config)}{ns} "
                     f'--from-literal={TOKEN_SECRET_KEY}="$(openssl rand -hex 32)"')
    if config.security.tls:
        files = " ".join(f"--from-file={key}={getattr(config.security, name)}" for name, key in TLS_SECRET_KEYS.items())
        lines.append(f"Create the TLS Secret first: kubectl create secret generic {tls_secret_name(config)}{ns} "
                     + files)
    if checkpoint_volume:
        claim = checkpoint_claim or checkpoint_claim_name(config)
        if checkpoint_claim_per_ps:
            own = ", ".join(repr(ps_checkpoint_claim(claim, i)) for i in range(len(config.cluster.ps)))
            lines.append(f"The PersistentVolumeClaims {own} (one per PS task, ReadWriteOnce is enough) and {claim!r} "
                         f"(the chief's) must exist; each is mounted at {CHECKPOINT_MOUNT_PATH}.")
        else:
            lines.append(f"The PersistentVolumeClaim {claim!r} must exist (ReadWriteMany when the PS pods and the "
                         f"chief may land on different nodes); it is mounted at {CHECKPOINT_MOUNT_PATH}.")
    return lines


def dump_yaml(docs: Mapping[str, Any] | Sequence[Mapping[str, Any]], comment: Sequence[str] = ()) -> str:
    """Multi-document YAML (``---`` before each document) for ``kubectl apply -f``.

    Args:
        docs: One manifest or a list of them.
        comment: Lines written first, each as a ``# `` comment.
    """
    import yaml

    if isinstance(docs, Mapping):
        docs = [docs]
    header = "".join(f"# {line}\n" for line in comment)
    body = yaml.safe_dump_all([dict(d) for d in docs], explicit_start=True, sort_keys=False,
                              default_flow_style=False, width=1 << 16)
    return header + body
