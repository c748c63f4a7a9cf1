"""A job as one JobSet (``jobset.x-k8s.io/v1alpha2``, kubernetes-sigs/jobset): one replicated Job per role.

``python -m tfdist.launch --config FILE --emit jobset --image IMAGE script.py``
prints it; docs/kubernetes.md says when to pick it over a TFJob or plain
Jobs. A pure function of a :class:`~tfdist.config.JobConfig`, like
:mod:`tfdist.cluster.k8s`, whose pod parts it shares (environment, token and
TLS files, resources, securityContext, checkpoint volume).

What the JobSet holds:

* **One replicated Job per role** (``ps``, ``input``, ``chief``, ``worker``,
  ``evaluator``; ``replicas: 1``), each an Indexed Job with one pod per task
  (``completions`` = ``parallelism`` = the task count). With
  ``network.enableDNSHostnames`` the JobSet controller gives pod ``i`` of
  role ``job`` the hostname ``<name>-<job>-0-<i>`` under the headless Service
  ``<name>`` it creates (``publishNotReadyAddresses``), so task ``job:i`` is at
  ``<name>-<job>-0-<i>.<name>:<port>`` (:func:`jobset_config`).
* **TF_CONFIG per pod from one template.** The pod's completion index comes
  from the Job's annotation ``batch.kubernetes.io/job-completion-index``
  (downward API, variable ``TFDIST_TASK_INDEX``), and ``TF_CONFIG`` holds
  ``"index": $(TFDIST_TASK_INDEX)``: Kubernetes expands a variable defined
  earlier in the list. Every other variable is the same for every index.
* **Success**: ``successPolicy`` ``operator: All`` over the training roles
  (``chief`` and ``worker``): the JobSet completes when every training task
  exits 0, as the local launcher counts a job done. The PS tasks exit 0 by
  themselves once every worker said ``Done``; an evaluator or input task
  still running is stopped with the JobSet.
* **Failure**: each pod ``restartPolicy: Never``, replaced by its Job up to
  ``backoffLimit`` (:data:`~tfdist.cluster.k8s.RESTART_LIMIT` per task; 0
  for a chief with ``launch.restart_chief: false``), at the same hostname;
  a PS replacement starts only once the old pod is gone
  (``podReplacementPolicy: Failed``) and restores its newest checkpoint. A
  pod that exits with tfdist's config-error code (78: a ``ConfigError``,
  deterministic), and a chief that exits with any code 1-127 (it ended by
  itself with an error: the local launcher does not restart it either,
  :func:`~tfdist.cluster.failure.decide_chief_restart`), fails its Job at
  once (``podFailurePolicy``), and the
  JobSet's ``failurePolicy`` rule on ``PodFailurePolicy`` fails the JobSet
  without restarting it; any other Job failure restarts the whole JobSet up
  to ``failurePolicy.maxRestarts`` (:data:`JOBSET_MAX_RESTARTS`) times.

Needs the JobSet controller v0.6 or newer (``failurePolicy.rules``,
``network.publishNotReadyAddresses``) on Kubernetes 1.29 or newer (Indexed
Jobs with ``podFailurePolicy`` and ``podReplacementPolicy``). The fields
emitted are checked in tests against the schema subset in
``tests/unit/jobset_v1alpha2_schema.json`` (written from the JobSet API types,
``api/jobset/v1alpha2/jobset_types.go``, not copied from a released CRD).

Example:

>>> from tfdist.config import JobConfig
>>> cfg = JobConfig.from_dict({"name": "digits", "cluster": {"ps": 1, "worker": 2}})
>>> jobset_config(cfg).cluster.worker
['digits-worker-0-0.digits:2222', 'digits-worker-0-1.digits:2222']
>>> [r["name"] for r in kubernetes_jobset(cfg, "registry/digits:1", "train.py")["spec"]["replicatedJobs"]]
['ps', 'worker']
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from tfdist import constants
from tfdist.cluster import k8s
from tfdist.config import JobConfig, TaskSpec
from tfdist.errors import ConfigError
from tfdist.exit_status import EXIT_CONFIG_ERROR

__all__ = ["JOBSET_API_VERSION", "JOBSET_MAX_RESTARTS", "ENV_TASK_INDEX", "jobset_host", "jobset_config",
           "kubernetes_jobset"]

#: The JobSet API the manifest uses.
JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
#: ``failurePolicy.maxRestarts``: whole-JobSet restarts after a Job failed for good (not after a config error).
JOBSET_MAX_RESTARTS = k8s.RESTART_LIMIT - 1
#: The pod's completion index (its task index), from the Job's annotation.
ENV_TASK_INDEX = "TFDIST_TASK_INDEX"
_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
_CONTAINER = "tfdist"
#: Roles whose success is the JobSet's.
_TRAINING_JOBS = ("chief", "worker")


def jobset_host(config: JobConfig, task: TaskSpec) -> str:
    """``<name>-<job>-0-<index>``: the hostname the JobSet controller gives the task's pod."""
    return f"{config.name}-{task.job}-0-{task.index}"


def _check(config: JobConfig) -> None:
    k8s._check_emittable(config, kubeflow=False)  # the name's characters, room for <name>-<job>-<index>; not elastic
    longest = max((jobset_host(config, t) for t in k8s._tasks(config)), key=len)
    if len(longest) > k8s._MAX_LABEL:
        room = k8s._MAX_LABEL - (len(longest) - len(config.name))
        raise ConfigError(
            f"Invalid config field `name` for a JobSet. Received: name={config.name!r}. The longest pod hostname "
            f"would be {longest!r} ({len(longest)} characters; at most {k8s._MAX_LABEL}). Use a name of at most "
            f"{room} characters."
        )


def jobset_config(config: JobConfig, port: int = k8s.DEFAULT_PORT) -> JobConfig:
    """The config whose tasks are the pods of :func:`kubernetes_jobset`: ``<name>-<job>-0-<i>.<name>:<port>``.

    Raises:
        ConfigError: the job name is no DNS label or too long, or the job is elastic.
    """
    _check(config)
    k8s._check_port(port)
    return k8s._addressed(config, lambda task: f"{jobset_host(config, task)}.{config.name}:{port}")


def _indexed_env(config: JobConfig, job: str, pod: dict[str, Any]) -> None:
    """Replaces the pod's literal TF_CONFIG (task 0) by one whose index is the pod's completion index."""
    container = pod["containers"][0]
    sentinel = 1_234_567_891
    tf_config = json.dumps(config.tf_config(TaskSpec(job, 0)) | {"task": {"type": job, "index": sentinel}})
    tf_config = tf_config.replace(str(sentinel), f"$({ENV_TASK_INDEX})")
    index = {"name": ENV_TASK_INDEX,
             "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{_INDEX_ANNOTATION}']"}}}
    env = [e for e in container["env"] if e["name"] != constants.ENV_TF_CONFIG]
    container["env"] = [index, {"name": constants.ENV_TF_CONFIG, "value": tf_config}, *env]


def kubernetes_jobset(
    config: JobConfig,
    image: str,
    script: str | None = None,
    script_args: Sequence[str] = (),
    *,
    namespace: str = "default",
    port: int = k8s.DEFAULT_PORT,
    checkpoint_claim: str | None = None,
    checkpoint_volume: bool = True,
    checkpoint_claim_per_ps: bool = False,
) -> dict[str, Any]:
    """The job as one JobSet (see the module docstring for what it holds).

    Args:
        config: The job. Counts and addresses in its cluster are replaced by
            pod DNS names (:func:`jobset_config`).
        image: Container image with Python, tfdist and the script.
        script: The training script's path inside the image. Defaults to
            ``None``: training pods run the image's own entrypoint.
        script_args: The script's arguments.
        namespace: Namespace of the JobSet. Defaults to ``"default"``.
        port: The port every task listens on. Defaults to ``2222``.
        checkpoint_claim: PersistentVolumeClaim mounted at ``/checkpoints``
            on PS pods and the chief's. Defaults to ``<name>-checkpoints``.
        checkpoint_volume: Mount the checkpoint claim at all. Defaults to ``True``.
        checkpoint_claim_per_ps: Refused (``ConfigError``): the PS pods of
            one Indexed Job share one pod template. Defaults to ``False``.

    Returns:
        The JobSet manifest.

    Raises:
        ConfigError: a bad job name, image, script, namespace, port or claim
            name; an elastic job; ``checkpoint_claim_per_ps``.
    """
    addressed = jobset_config(config, port)
    if checkpoint_claim_per_ps:
        raise ConfigError("A JobSet cannot give each PS task its own checkpoint claim: the PS pods of its Indexed "
                          "Job share one pod template. Received: --checkpoint-claim-per-ps with --emit jobset. Use "
                          "--emit k8s, or one ReadWriteMany claim for every PS task (each writes its own ps-<i>/ "
                          "folder).")
    opts = k8s._options(config, image, script, script_args, namespace, port, checkpoint_claim, checkpoint_volume)
    addressed = k8s._with_ps_checkpoints(addressed, opts)
    labels = {k8s._LABEL_JOB: config.name}
    replicated = []
    for job in k8s._JOB_ORDER:
        count = len(getattr(addressed.cluster, job))
        if not count:
            continue
        saves = k8s._saves(config, job)
        pod = k8s._pod_spec(addressed, TaskSpec(job, 0), opts, container=_CONTAINER, port_name=k8s._PORT_NAME,
                            with_tf_config=True, saves=saves, restart_policy="Never")
        _indexed_env(addressed, job, pod)
        # Without a chief, worker 0 plays it, but every worker shares one template: it restarts like the others.
        chief_never = job == "chief" and not k8s._chief_restarts(config)
        pod_labels = {**labels, k8s._LABEL_TYPE: job}
        if job == "chief":  # the launcher's rule: ended by itself with an error (1-127) fails the JobSet at once
            failure = k8s.chief_pod_failure_policy(_CONTAINER)
        else:
            failure = {"rules": [
                {"action": "FailJob",  # a ConfigError fails the same way every time: no replacement pod
                 "onExitCodes": {"containerName": _CONTAINER, "operator": "In", "values": [EXIT_CONFIG_ERROR]}},
                # evicted, preempted (status is required by the CRD's Job schema: JobSet v0.9.1)
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            ]}
        spec: dict[str, Any] = {
            "completionMode": "Indexed",
            "completions": count,
            "parallelism": count,
            "backoffLimit": 0 if chief_never else k8s.RESTART_LIMIT * count,
            "podFailurePolicy": failure,
            "podReplacementPolicy": "Failed",  # required with podFailurePolicy; no two PS pods on one checkpoint
            **k8s._deadline(config),
            "template": {"metadata": {"labels": pod_labels}, "spec": pod},
        }
        replicated.append({"name": job, "replicas": 1,
                           "template": {"metadata": {"labels": pod_labels}, "spec": spec}})
    targets = [j for j in _TRAINING_JOBS if getattr(addressed.cluster, j)]
    return {
        "apiVersion": JOBSET_API_VERSION,
        "kind": "JobSet",
        "metadata": k8s._metadata(config, config.name, namespace, labels),
        "spec": {
            "network": {"enableDNSHostnames": True, "subdomain": config.name, "publishNotReadyAddresses": True},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": targets},
            "failurePolicy": {
                "maxRestarts": JOBSET_MAX_RESTARTS,
                "rules": [{"name": "config-error-fails-the-jobset", "action": "FailJobSet",
                           "onJobFailureReasons": ["PodFailurePolicy"]}],
            },
            **k8s._ttl(config),
            "replicatedJobs": replicated,
        },
    }
