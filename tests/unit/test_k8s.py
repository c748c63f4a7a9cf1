"""Kubernetes manifests (tfdist.cluster.k8s, ``tfdist.launch --emit``): structure, TF_CONFIG per pod, secret, volume."""

import functools
import json
import os
import re
import stat
import subprocess
import sys

import pytest
import yaml

from tfdist import constants
from tfdist.cluster import k8s, resolve_cluster
from tfdist.launch import main
from tfdist.config import JobConfig, TaskSpec, load_config
from tfdist.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MULTI_MACHINE = os.path.join(ROOT, "configs", "multi_machine.yaml")
#: Every replica type a TFJob has, given as counts (a count is fine for --emit: the emitter assigns DNS names).
FULL = {"name": "full", "cluster": {"chief": 1, "worker": 3, "ps": 2, "evaluator": 1},
        "strategy": {"consistency": "ssp", "staleness": 2}, "ps": {"rpc_timeout_s": 45}}
IMAGE = "registry.example.com/digits:1"


def _configs():
    return [pytest.param(lambda: load_config(MULTI_MACHINE), id="multi_machine"),
            pytest.param(lambda: JobConfig.from_dict(FULL), id="chief+worker+ps+evaluator")]


def _containers(docs):
    """``{TaskSpec: (pod spec, container)}`` of the plain manifests, keyed by the pod labels."""
    out = {}
    for doc in docs:
        if doc["kind"] != "Job":
            continue
        template = doc["spec"]["template"]
        labels = template["metadata"]["labels"]
        task = TaskSpec(labels["tfdist/replica-type"], int(labels["tfdist/replica-index"]))
        [container] = template["spec"]["containers"]
        out[task] = (template["spec"], container)
    return out


def _env(container):
    return {e["name"]: e for e in container["env"]}


def _values(container):
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def _pod_dns_names(docs):
    """Each task's address as Kubernetes would resolve it: the pod ``hostname.subdomain`` under a headless
    Service that selects the pod, and the container's port. Built from the manifests alone."""
    [service] = [d for d in docs if d["kind"] == "Service"]
    assert service["spec"]["clusterIP"] == "None"
    names = {}
    for task, (pod, container) in _containers(docs).items():
        assert pod["subdomain"] == service["metadata"]["name"]
        job = next(d for d in docs if d["kind"] == "Job" and d["metadata"]["name"] == pod["hostname"])
        labels = job["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()
        [port] = container["ports"]
        names[task] = f"{pod['hostname']}.{pod['subdomain']}:{port['containerPort']}"
    return names


def _operator_tf_config(tfjob, replica_type, index):
    """The TF_CONFIG the Kubeflow training operator (v1) writes into a TFJob pod, from the TFJob alone.

    As the operator's ``genTFConfigJSONStr``/``genClusterSpec`` (training-operator v1.2 to v1.9,
    ``pkg/controller.v1/tensorflow/tensorflow.go``): every replica type, ``Evaluator`` included (only the
    tf-operator of v1.0/v1.1 skipped it), lower-cased, ``<name>-<type>-<i>.<namespace>.svc:<port>`` with
    the port of the ``tensorflow`` container's ``tfjob-port`` (2222 without one), and ``environment: cloud``.
    """
    name, namespace = tfjob["metadata"]["name"], tfjob["metadata"]["namespace"]
    cluster = {}
    for rtype, spec in tfjob["spec"]["tfReplicaSpecs"].items():
        port = 2222
        for container in spec["template"]["spec"]["containers"]:
            if container["name"] == "tensorflow":
                for p in container.get("ports", []):
                    if p.get("name") == "tfjob-port":
                        port = p["containerPort"]
        rt = rtype.lower()
        cluster[rt] = [f"{name}-{rt}-{i}.{namespace}.svc:{port}" for i in range(spec["replicas"])]
    return {"cluster": cluster, "task": {"type": replica_type.lower(), "index": index}, "environment": "cloud"}


# ------------------------------------------------------------------ plain Kubernetes
def test_plain_manifests_for_multi_machine():
    cfg = load_config(MULTI_MACHINE)
    docs = k8s.kubernetes_jobs(cfg, IMAGE, "examples/train_digits.py", ["--epochs", "3"])
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("Service", "multi-machine"), ("Job", "multi-machine-ps-0"), ("Job", "multi-machine-ps-1"),
        ("Job", "multi-machine-chief-0"), ("Job", "multi-machine-worker-0")]
    assert all(d["metadata"]["namespace"] == "default" for d in docs)
    service = docs[0]
    assert service["apiVersion"] == "v1"
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"tfdist/job-name": "multi-machine"}
    pods = _containers(docs)
    for task, (pod, container) in pods.items():
        job = next(d for d in docs if d["metadata"]["name"] == pod["hostname"])
        assert job["apiVersion"] == "batch/v1"
        assert container["image"] == IMAGE
        assert container["ports"] == [{"name": "tfdist", "containerPort": 2222}]
        if task.job == "ps":
            assert container["command"] == ["python", "-m", "tfdist.ps"]
        else:
            assert container["command"] == ["python", "-m", "tfdist.run", "examples/train_digits.py", "--epochs", "3"]
        assert job["spec"]["backoffLimit"] == k8s.RESTART_LIMIT
        if task == TaskSpec("chief", 0):  # replaced when killed, rejoins (launch.restart_chief); exit 1-127 fails
            assert pod["restartPolicy"] == "Never"
            assert job["spec"]["podFailurePolicy"] == k8s.chief_pod_failure_policy("tfdist")
        else:  # the others restart in place: a PS restores its checkpoint
            assert pod["restartPolicy"] == "OnFailure" and "podFailurePolicy" not in job["spec"]
        assert "activeDeadlineSeconds" not in job["spec"]
        # PS pods checkpoint onto the mounted claim
        assert JobConfig.from_json(_values(container)[constants.ENV_CONFIG]).ps.checkpoint_dir == "/checkpoints/ps"


def test_the_chief_is_not_restarted_when_the_config_says_so_or_without_parameter_servers():
    cfg = load_config(MULTI_MACHINE)
    cfg.launch.restart_chief = False
    pods = _containers(k8s.kubernetes_jobs(cfg, IMAGE, "train.py"))
    assert pods[TaskSpec("chief", 0)][0]["restartPolicy"] == "Never"
    assert pods[TaskSpec("worker", 0)][0]["restartPolicy"] == "OnFailure"
    assert k8s.kubeflow_tfjob(cfg, IMAGE, "train.py")["spec"]["tfReplicaSpecs"]["Chief"]["restartPolicy"] == "Never"
    allreduce = JobConfig.from_dict({"name": "ar", "cluster": {"worker": 2}})  # all-reduce: no PS tasks
    pods = _containers(k8s.kubernetes_jobs(allreduce, IMAGE, "train.py"))
    assert pods[TaskSpec("worker", 0)][0]["restartPolicy"] == "Never"


def test_a_checkpoint_dir_in_the_config_is_kept_and_without_the_volume_none_is_set():
    cfg = load_config(MULTI_MACHINE)
    cfg.ps.checkpoint_dir = "gs://bucket/run"
    _, container = _containers(k8s.kubernetes_jobs(cfg, IMAGE, "train.py"))[TaskSpec("ps", 0)]
    assert JobConfig.from_json(_values(container)[constants.ENV_CONFIG]).ps.checkpoint_dir == "gs://bucket/run"
    cfg.ps.checkpoint_dir = None
    _, container = _containers(k8s.kubernetes_jobs(cfg, IMAGE, "train.py", checkpoint_volume=False))[TaskSpec("ps", 0)]
    assert JobConfig.from_json(_values(container)[constants.ENV_CONFIG]).ps.checkpoint_dir is None


@pytest.mark.parametrize("make_config", _configs())
def test_each_pod_gets_the_tf_config_of_its_task_at_the_pod_dns_names(make_config):
    cfg = make_config()
    docs = k8s.kubernetes_jobs(cfg, IMAGE, "train.py")
    addressed = k8s.kubernetes_config(cfg)
    dns = _pod_dns_names(docs)
    tasks = [TaskSpec(job, i) for job, addresses in cfg.cluster.jobs().items() for i in range(len(addresses))]
    assert sorted(dns, key=str) == sorted(tasks, key=str)  # one pod per task of the config
    for task in tasks:
        assert getattr(addressed.cluster, task.job)[task.index] == dns[task]
        _, container = _containers(docs)[task]
        assert json.loads(_values(container)[constants.ENV_TF_CONFIG]) == addressed.tf_config(task)
    assert addressed.cluster.ps[1] == f"{cfg.name}-ps-1.{cfg.name}:2222"


@pytest.mark.parametrize("make_config", _configs())
def test_a_pod_reads_back_the_config_and_its_task(make_config, monkeypatch):
    """What ``JobConfig.from_tf_config()`` (``python -m tfdist.ps``, the strategies) sees in each pod."""
    cfg = make_config()
    addressed = k8s.kubernetes_config(cfg)
    for task, (_, container) in _containers(k8s.kubernetes_jobs(cfg, IMAGE, "train.py")).items():
        for name, value in _values(container).items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv(cfg.security.token_env, "the-token-from-the-secret")
        seen, seen_task = JobConfig.from_tf_config()
        assert seen_task == task
        if cfg.cluster.ps:  # PS pods checkpoint onto the mounted claim; nothing else changes
            assert seen.ps.checkpoint_dir == "/checkpoints/ps"
            seen.ps.checkpoint_dir = None
        assert seen == addressed
        assert seen.strategy == cfg.strategy and seen.ps == cfg.ps
        assert seen.security.resolve_token() == "the-token-from-the-secret"


def test_without_a_chief_worker_0_plays_it():
    cfg = JobConfig.from_dict({"name": "digits", "cluster": {"worker": 2, "ps": 1}})
    pods = _containers(k8s.kubernetes_jobs(cfg, IMAGE, "train.py"))
    assert pods[TaskSpec("worker", 0)][0]["restartPolicy"] == "Never"  # its Job replaces it by the chief's rule
    assert pods[TaskSpec("worker", 1)][0]["restartPolicy"] == "OnFailure"
    mounted = {t for t, (pod, _) in pods.items() if any(v["name"] == "checkpoints" for v in pod.get("volumes", []))}
    assert mounted == {TaskSpec("ps", 0), TaskSpec("worker", 0)}


def test_input_tasks_run_the_queue_service_on_every_interface():
    cfg = JobConfig.from_dict({"name": "q", "cluster": {"worker": 1, "ps": 1, "input": 1},
                               "launch": {"input_args": ["--producer", "mymod:make"]}})
    pods = _containers(k8s.kubernetes_jobs(cfg, IMAGE, "train.py"))
    assert pods[TaskSpec("input", 0)][1]["command"] == [
        "python", "-m", "tfdist.data.queue_service", "--port", "2222", "--host", "[::]", "--producer", "mymod:make"]
    assert pods[TaskSpec("input", 0)][0]["restartPolicy"] == "OnFailure"


def test_without_a_script_training_pods_run_the_image_entrypoint():
    pods = _containers(k8s.kubernetes_jobs(JobConfig.from_dict(FULL), IMAGE))
    for task, (_, container) in pods.items():
        assert ("command" in container) == (task.job == "ps")
    with pytest.raises(ConfigError, match="Script arguments without a script"):
        k8s.kubernetes_jobs(JobConfig.from_dict(FULL), IMAGE, None, ["--epochs", "3"])


# ------------------------------------------------------------------ Kubeflow
def test_kubeflow_tfjob_structure():
    cfg = JobConfig.from_dict(FULL)
    tfjob = k8s.kubeflow_tfjob(cfg, IMAGE, "train.py", ["--epochs", "2"], namespace="training")
    assert tfjob["apiVersion"] == "kubeflow.org/v1" and tfjob["kind"] == "TFJob"
    assert tfjob["metadata"] == {"name": "full", "namespace": "training", "labels": {"tfdist/job-name": "full"}}
    assert tfjob["spec"]["runPolicy"] == {"cleanPodPolicy": "Running", "backoffLimit": k8s.RESTART_LIMIT,
                                         "ttlSecondsAfterFinished": 86400}
    replicas = tfjob["spec"]["tfReplicaSpecs"]
    assert {r: s["replicas"] for r, s in replicas.items()} == {"Chief": 1, "Worker": 3, "PS": 2, "Evaluator": 1}
    assert {r: s["restartPolicy"] for r, s in replicas.items()} == {
        "Chief": "ExitCode", "Worker": "OnFailure", "PS": "OnFailure", "Evaluator": "OnFailure"}
    for rtype, spec in replicas.items():
        pod = spec["template"]["spec"]
        assert "restartPolicy" not in pod  # a replica spec field in a TFJob
        [container] = pod["containers"]
        assert container["name"] == "tensorflow"  # the operator reads the port from this container
        assert container["ports"] == [{"name": "tfjob-port", "containerPort": 2222}]
        assert container["command"] == (["python", "-m", "tfdist.ps"] if rtype == "PS"
                                        else ["python", "-m", "tfdist.run", "train.py", "--epochs", "2"])
        env = _values(container)
        assert constants.ENV_TF_CONFIG not in env  # the operator writes it
        expected = k8s.kubeflow_config(cfg, "training")
        expected.ps.checkpoint_dir = "/checkpoints/ps"  # PS pods checkpoint onto the mounted claim
        assert JobConfig.from_json(env[constants.ENV_CONFIG]) == expected


@pytest.mark.parametrize("namespace", ["default", "training"])
@pytest.mark.parametrize("make_config", _configs())
def test_the_operators_tf_config_is_the_configs(make_config, namespace):
    cfg = make_config()
    tfjob = k8s.kubeflow_tfjob(cfg, IMAGE, "train.py", namespace=namespace)
    addressed = k8s.kubeflow_config(cfg, namespace)
    seen = set()
    for rtype, spec in tfjob["spec"]["tfReplicaSpecs"].items():
        for index in range(spec["replicas"]):
            task = TaskSpec(rtype.lower(), index)
            expected = addressed.tf_config(task)
            # The operator lists every replica type (the evaluator too) and adds "environment", which tfdist ignores.
            operator = _operator_tf_config(tfjob, rtype, index)
            assert operator == {**expected, "environment": "cloud"}
            # ... and tfdist resolves it to this task of the addressed job.
            resolved = resolve_cluster(env={constants.ENV_TF_CONFIG: json.dumps(operator),
                                            constants.ENV_CONFIG: addressed.to_json()})
            assert resolved.task == task and resolved.config.cluster == addressed.cluster
            seen.add(task)
    assert seen == {TaskSpec(j, i) for j, a in cfg.cluster.jobs().items() for i in range(len(a))}


def test_kubeflow_refuses_input_tasks():
    cfg = JobConfig.from_dict({"name": "q", "cluster": {"worker": 1, "ps": 1, "input": 1}})
    with pytest.raises(ConfigError, match=r"`cluster.input` for Kubeflow.*--emit k8s"):
        k8s.kubeflow_tfjob(cfg, IMAGE, "train.py")


def test_kubeflow_without_a_chief_mounts_the_checkpoints_on_the_workers():
    cfg = JobConfig.from_dict({"name": "digits", "cluster": {"worker": 2, "ps": 1}})
    replicas = k8s.kubeflow_tfjob(cfg, IMAGE, "train.py")["spec"]["tfReplicaSpecs"]
    assert set(replicas) == {"Worker", "PS"}
    for spec in replicas.values():
        assert spec["template"]["spec"]["volumes"][0]["persistentVolumeClaim"] == {"claimName": "digits-checkpoints"}


# ------------------------------------------------------------------ token, volume, TLS
@pytest.mark.parametrize("emit", ["k8s", "kubeflow"])
def test_the_token_is_a_mounted_file_and_never_appears(emit):
    data = dict(FULL, security={"token": "literal-token-in-the-file", "token_env": "MY_TOKEN"})
    cfg = JobConfig.from_dict(data)
    docs = k8s.kubernetes_jobs(cfg, IMAGE, "t.py") if emit == "k8s" else [k8s.kubeflow_tfjob(cfg, IMAGE, "t.py")]
    text = k8s.dump_yaml(docs)
    assert "literal-token-in-the-file" not in text
    pods = ([p for p, _ in _containers(docs).values()] if emit == "k8s" else
            [s["template"]["spec"] for s in docs[0]["spec"]["tfReplicaSpecs"].values()])
    assert pods
    for pod in pods:
        [container] = pod["containers"]
        assert "MY_TOKEN" not in _env(container)  # never an environment variable (kubectl describe, /proc/*/environ)
        [token] = [v for v in pod["volumes"] if v["name"] == "token"]
        assert token["secret"] == {"secretName": "full-token", "defaultMode": 0o400,
                                   "items": [{"key": "token", "path": "token"}]}
        assert {"name": "token", "mountPath": "/etc/tfdist/token", "readOnly": True} in container["volumeMounts"]
        security = json.loads(_values(container)[constants.ENV_CONFIG])["security"]
        assert security["token"] is None and security["token_file"] == "/etc/tfdist/token/token"


def test_a_pod_reads_its_token_from_the_mounted_file(tmp_path, monkeypatch):
    cfg = JobConfig.from_dict(FULL)
    [container] = k8s.kubeflow_tfjob(cfg, IMAGE, "t.py")["spec"]["tfReplicaSpecs"]["PS"]["template"]["spec"][
        "containers"]
    pod_config = JobConfig.from_json(_values(container)[constants.ENV_CONFIG])
    monkeypatch.delenv(pod_config.security.token_env, raising=False)
    secret = tmp_path / "token"
    secret.write_text("s3cret-token-value\n")
    secret.chmod(0o400)
    pod_config.security.token_file = str(secret)  # where the kubelet mounted it
    assert pod_config.security.resolve_token() == "s3cret-token-value"
    pod_config.security.token_file = str(tmp_path / "missing")
    with pytest.raises(ConfigError, match=r"(?s)`security.token_file`.*cannot be read.*Mount the token Secret"):
        pod_config.security.resolve_token()
    empty = tmp_path / "empty"
    empty.write_text("")
    pod_config.security.token_file = str(empty)
    with pytest.raises(ConfigError, match="The token file is empty"):
        pod_config.security.resolve_token()


def test_token_secret():
    cfg = JobConfig.from_dict(FULL)
    a, b = k8s.token_secret(cfg, "training"), k8s.token_secret(cfg, "training")
    assert a["kind"] == "Secret" and a["metadata"]["name"] == "full-token" and a["metadata"]["namespace"] == "training"
    assert len(a["stringData"]["token"]) == 64 and a["stringData"]["token"] != b["stringData"]["token"]
    assert k8s.token_secret(cfg, token="0123456789")["stringData"] == {"token": "0123456789"}
    with pytest.raises(ConfigError, match="at least 8 characters"):
        k8s.token_secret(cfg, token="short")


def test_the_checkpoint_claim_is_mounted_on_ps_pods_and_the_chief():
    cfg = JobConfig.from_dict(FULL)
    pods = _containers(k8s.kubernetes_jobs(cfg, IMAGE, "t.py"))
    for task, (pod, container) in pods.items():
        claims = [v for v in pod["volumes"] if v["name"] == "checkpoints"]
        mounts = [m for m in container["volumeMounts"] if m["name"] == "checkpoints"]
        if task.job in ("ps", "chief"):
            claim = {"claimName": "full-checkpoints"}
            assert claims == [{"name": "checkpoints", "persistentVolumeClaim": claim}]
            assert mounts == [{"name": "checkpoints", "mountPath": "/checkpoints"}]
        else:
            assert claims == [] and mounts == []
    custom = _containers(k8s.kubernetes_jobs(cfg, IMAGE, "t.py", checkpoint_claim="shared-nfs"))
    assert custom[TaskSpec("ps", 1)][0]["volumes"][0]["persistentVolumeClaim"] == {"claimName": "shared-nfs"}
    none = _containers(k8s.kubernetes_jobs(cfg, IMAGE, "t.py", checkpoint_volume=False))
    assert all(v["name"] != "checkpoints" for pod, _ in none.values() for v in pod["volumes"])
    replicas = k8s.kubeflow_tfjob(cfg, IMAGE, "t.py")["spec"]["tfReplicaSpecs"]
    assert {r for r, s in replicas.items()
            if any(v["name"] == "checkpoints" for v in s["template"]["spec"]["volumes"])} == {"Chief", "PS"}


def test_one_checkpoint_claim_per_ps_task_when_asked():
    cfg = JobConfig.from_dict(FULL)
    pods = _containers(k8s.kubernetes_jobs(cfg, IMAGE, "t.py", checkpoint_claim_per_ps=True))
    claim_of = {task: [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if v["name"] == "checkpoints"]
                for task, (pod, _) in pods.items()}
    assert claim_of[TaskSpec("ps", 0)] == ["full-checkpoints-ps-0"]
    assert claim_of[TaskSpec("ps", 1)] == ["full-checkpoints-ps-1"]
    assert claim_of[TaskSpec("chief", 0)] == ["full-checkpoints"]  # the chief saves the model on the shared one
    notes = " ".join(k8s.prerequisites(cfg, checkpoint_claim_per_ps=True))
    assert "'full-checkpoints-ps-0', 'full-checkpoints-ps-1'" in notes and "ReadWriteOnce is enough" in notes
    with pytest.raises(ConfigError, match="share one pod template"):
        k8s.kubeflow_tfjob(cfg, IMAGE, "t.py", checkpoint_claim_per_ps=True)
    with pytest.raises(ConfigError, match="needs a checkpoint volume"):
        k8s.kubernetes_jobs(cfg, IMAGE, "t.py", checkpoint_claim_per_ps=True, checkpoint_volume=False)


def _all_pods(cfg):
    docs = k8s.kubernetes_jobs(cfg, IMAGE, "t.py")
    tfjob = k8s.kubeflow_tfjob(cfg, IMAGE, "t.py")
    plain = [(task.job, pod) for task, (pod, _) in _containers(docs).items()]
    kubeflow = [(rtype.lower(), s["template"]["spec"]) for rtype, s in tfjob["spec"]["tfReplicaSpecs"].items()]
    return docs, tfjob, plain + kubeflow


def test_every_pod_is_restricted_compatible_with_requests_and_a_pull_policy():
    """Pod Security "restricted" (Kubernetes 1.25+) and a ResourceQuota without a LimitRange both admit every pod."""
    _, _, pods = _all_pods(JobConfig.from_dict(FULL))
    for job, pod in pods:
        ctx = pod["securityContext"]
        assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] == 1000 and ctx["fsGroup"] == 1000
        assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
        assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
        for container in pod["containers"]:
            c = container["securityContext"]
            assert c["allowPrivilegeEscalation"] is False and c["capabilities"] == {"drop": ["ALL"]}
            assert not c.get("privileged") and c.get("runAsUser", 1) != 0
            assert container["imagePullPolicy"] == "IfNotPresent"
            requests = container["resources"]["requests"]
            assert {"cpu", "memory"} <= set(requests), (job, container["resources"])  # never BestEffort
            assert "memory" in container["resources"]["limits"]
        for volume in pod["volumes"]:  # restricted allows these volume types (no hostPath)
            assert set(volume) - {"name"} <= {"secret", "persistentVolumeClaim"}
            if "secret" in volume:
                assert volume["secret"]["defaultMode"] == 0o400


def test_kubernetes_section_sets_resources_pull_policy_ttl_and_user():
    data = dict(FULL, kubernetes={"resources": {"worker": {"requests": {"cpu": "4", "nvidia.com/gpu": 1},
                                                           "limits": {"nvidia.com/gpu": 1}}, "evaluator": {}},
                                  "image_pull_policy": "Always", "ttl_seconds_after_finished": None,
                                  "run_as_user": 4242})
    cfg = JobConfig.from_dict(data)
    docs, tfjob, _ = _all_pods(cfg)
    pods = _containers(docs)
    worker = pods[TaskSpec("worker", 0)][1]
    assert worker["resources"] == {"requests": {"cpu": "4", "nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}
    assert "resources" not in pods[TaskSpec("evaluator", 0)][1]  # {}: none written
    assert pods[TaskSpec("ps", 0)][1]["resources"]["requests"] == {"cpu": "1", "memory": "1Gi"}  # the default kept
    assert worker["imagePullPolicy"] == "Always"
    assert pods[TaskSpec("ps", 0)][0]["securityContext"]["runAsUser"] == 4242
    assert all("ttlSecondsAfterFinished" not in d["spec"] for d in docs if d["kind"] == "Job")
    assert "ttlSecondsAfterFinished" not in tfjob["spec"]["runPolicy"]
    assert JobConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("field, value, words", [
    ("resources", {"gpu-workers": {}}, "`kubernetes.resources.gpu-workers`"),
    ("resources", {"worker": {"request": {}}}, "`kubernetes.resources.worker`"),
    ("resources", {"worker": {"requests": {"cpu": "two"}}}, "`kubernetes.resources.worker.requests.cpu`"),
    ("resources", {"worker": {"requests": {"memory": "2GB"}}}, "Kubernetes quantity"),
    ("image_pull_policy", "always", "`kubernetes.image_pull_policy`"),
    ("ttl_seconds_after_finished", -1, "`kubernetes.ttl_seconds_after_finished`"),
    ("run_as_user", 0, "non-root"),
])
def test_a_bad_kubernetes_field_is_refused_naming_it(field, value, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        JobConfig.from_dict({"kubernetes": {field: value}})


def test_ttl_and_pod_replacement_policy():
    docs, tfjob, _ = _all_pods(JobConfig.from_dict(FULL))
    jobs = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "Job"}
    assert {spec["ttlSecondsAfterFinished"] for spec in jobs.values()} == {86400}
    assert tfjob["spec"]["runPolicy"]["ttlSecondsAfterFinished"] == 86400
    # A replacement PS pod never runs beside the one it replaces (two writers on one checkpoint folder); the
    # chief's Job has a podFailurePolicy, which Kubernetes accepts only with podReplacementPolicy: Failed.
    assert {name for name, spec in jobs.items() if spec.get("podReplacementPolicy") == "Failed"} == {
        "full-ps-0", "full-ps-1", "full-chief-0"}


def test_tls_files_come_from_the_tls_secret():
    data = dict(FULL, security={"tls_cert": "certs/ps.pem", "tls_key": "certs/ps.key", "tls_ca": "certs/ca.pem"})
    cfg = JobConfig.from_dict(data)
    addressed = k8s.kubernetes_config(cfg)
    assert (addressed.security.tls_cert, addressed.security.tls_key, addressed.security.tls_ca) == (
        "/etc/tfdist/tls/tls.crt", "/etc/tfdist/tls/tls.key", "/etc/tfdist/tls/ca.crt")
    for task, (pod, container) in _containers(k8s.kubernetes_jobs(cfg, IMAGE, "t.py")).items():
        [tls] = [v for v in pod["volumes"] if v["name"] == "tls"]
        keys = [item["key"] for item in tls["secret"]["items"]]
        assert tls["secret"]["secretName"] == "full-tls"
        # each reads only its files: the servers (PS, the shared queue) their certificate, the clients the CA
        assert keys == (["tls.crt", "tls.key"] if task.job in ("ps", "input") else ["ca.crt"]), task
        assert {"name": "tls", "mountPath": "/etc/tfdist/tls", "readOnly": True} in container["volumeMounts"]
        assert JobConfig.from_json(_values(container)[constants.ENV_CONFIG]).security == addressed.security
    with_queue = JobConfig.from_dict(dict(data, cluster={**FULL["cluster"], "input": 1}))  # plain Jobs only
    pod, _ = _containers(k8s.kubernetes_jobs(with_queue, IMAGE, "t.py"))[TaskSpec("input", 0)]
    [tls] = [v for v in pod["volumes"] if v["name"] == "tls"]
    assert [item["key"] for item in tls["secret"]["items"]] == ["tls.crt", "tls.key"]  # the queue serves TLS too
    replicas = k8s.kubeflow_tfjob(cfg, IMAGE, "t.py")["spec"]["tfReplicaSpecs"]
    ps_tls = [v for v in replicas["PS"]["template"]["spec"]["volumes"] if v["name"] == "tls"]
    assert ps_tls[0]["secret"]["secretName"] == "full-tls"
    assert any("kubectl create secret generic full-tls" in line for line in k8s.prerequisites(cfg))


# ------------------------------------------------------------------ refusals, timeouts, YAML
@pytest.mark.parametrize("name", ["Multi_Machine", "9lives", "ends-", "x" * 60])
def test_a_name_that_is_no_dns_label_is_refused(name):
    cfg = JobConfig.from_dict(dict(FULL, name=name))
    with pytest.raises(ConfigError, match=r"Invalid config field `name` for Kubernetes\. Received: name="):
        k8s.kubernetes_jobs(cfg, IMAGE, "t.py")
    with pytest.raises(ConfigError, match="DNS label"):
        k8s.kubeflow_tfjob(cfg, IMAGE, "t.py")


def test_the_longest_name_allowed_fits_the_longest_hostname():
    room = 63 - len("-evaluator-0")
    k8s.kubernetes_jobs(JobConfig.from_dict(dict(FULL, name="a" * room)), IMAGE, "t.py")
    with pytest.raises(ConfigError, match=f"at most {room} characters"):
        k8s.kubernetes_jobs(JobConfig.from_dict(dict(FULL, name="a" * (room + 1))), IMAGE, "t.py")


@pytest.mark.parametrize("kwargs, match", [
    ({"image": ""}, r"Invalid container image \(--image\)\. Received: image=''"),
    ({"image": "a b"}, r"Received: image='a b'"),
    ({"namespace": "Bad_NS"}, r"namespace \(--namespace\)\. Received: namespace='Bad_NS'"),
    ({"port": 0}, r"Invalid port\. Received: port=0"),
    ({"checkpoint_claim": "Bad_Claim"}, r"\(--checkpoint-claim\)\. Received: checkpoint_claim='Bad_Claim'"),
])
def test_bad_options_are_refused(kwargs, match):
    args = {"image": IMAGE, **kwargs}
    with pytest.raises(ConfigError, match=match):
        k8s.kubernetes_jobs(JobConfig.from_dict(FULL), args.pop("image"), "t.py", **args)


def test_an_elastic_job_is_refused():
    cfg = JobConfig.from_dict({"name": "el", "cluster": {"worker": 1, "ps": 1}, "elastic": {"max_workers": 2}})
    with pytest.raises(ConfigError, match="`elastic.enabled` for Kubernetes"):
        k8s.kubernetes_jobs(cfg, IMAGE, "t.py")


def test_the_job_timeout_becomes_the_deadline():
    cfg = JobConfig.from_dict(dict(FULL, launch={"job_timeout_s": 3600.5}))
    jobs = [d for d in k8s.kubernetes_jobs(cfg, IMAGE, "t.py") if d["kind"] == "Job"]
    assert {d["spec"]["activeDeadlineSeconds"] for d in jobs} == {3601}
    assert k8s.kubeflow_tfjob(cfg, IMAGE, "t.py")["spec"]["runPolicy"]["activeDeadlineSeconds"] == 3601


def test_dump_yaml_round_trips_and_leads_with_comments():
    docs = k8s.kubernetes_jobs(JobConfig.from_dict(FULL), IMAGE, "t.py")
    text = k8s.dump_yaml(docs, comment=["first", "second"])
    assert text.startswith("# first\n# second\n---\n")
    assert list(yaml.safe_load_all(text)) == docs
    assert list(yaml.safe_load_all(k8s.dump_yaml(docs[0]))) == [docs[0]]


# ------------------------------------------------------------------ the CLI
def _emit(capsys, *args):
    code = main(["--config", MULTI_MACHINE, *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_emit_kubeflow_prints_parseable_yaml():
    """The command as a user types it, in a fresh interpreter: YAML on stdout, exit 0, no TensorFlow imported."""
    code = ("import sys; from tfdist.launch import main; rc = main(sys.argv[1:]); "
            "assert 'tensorflow' not in sys.modules, 'the launcher imported TensorFlow'; sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code, "--config", "configs/multi_machine.yaml", "--emit", "kubeflow",
                        "--image", "x"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stderr
    [tfjob] = list(yaml.safe_load_all(r.stdout))
    assert tfjob["kind"] == "TFJob" and tfjob["metadata"]["name"] == "multi-machine"
    assert set(tfjob["spec"]["tfReplicaSpecs"]) == {"Chief", "Worker", "PS"}
    assert "kubectl create secret generic multi-machine-token" in r.stdout  # a comment: how to make the Secret
    r = subprocess.run([sys.executable, "-m", "tfdist.launch", "--config", "configs/multi_machine.yaml", "--emit",
                        "kubeflow", "--image", "x"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stderr
    assert list(yaml.safe_load_all(r.stdout)) == [tfjob]


def test_cli_emit_k8s_with_counts_script_and_arguments(capsys, tmp_path):
    config = tmp_path / "counts.yaml"
    config.write_text("name: digits\ncluster: {worker: 2, ps: 1}\n")
    code = main(["--config", str(config), "--emit", "k8s", "--image", IMAGE, "--namespace", "training",
                 "examples/train_digits.py", "--epochs", "3"])
    out, _ = capsys.readouterr()
    assert code == 0
    docs = list(yaml.safe_load_all(out))
    assert [d["metadata"]["name"] for d in docs] == ["digits", "digits-ps-0", "digits-worker-0", "digits-worker-1"]
    assert {d["metadata"]["namespace"] for d in docs} == {"training"}
    assert _containers(docs)[TaskSpec("worker", 1)][1]["command"] == [
        "python", "-m", "tfdist.run", "examples/train_digits.py", "--epochs", "3"]


def test_cli_emit_is_not_held_to_the_local_task_limit(capsys, monkeypatch, tmp_path):
    """Counts mean "this many pods" to --emit, not "this many processes on this machine"."""
    import tfdist.cluster.local

    monkeypatch.setattr(tfdist.cluster.local, "local_task_limit", lambda *a, **k: 2)
    config = tmp_path / "counts.yaml"
    config.write_text("name: wide\ncluster: {chief: 1, worker: 8, ps: 3}\n")
    code = main(["--config", str(config), "--emit", "kubeflow", "--image", IMAGE, "train.py"])
    out, err = capsys.readouterr()
    assert code == 0, err
    [tfjob] = list(yaml.safe_load_all(out))
    assert {r: s["replicas"] for r, s in tfjob["spec"]["tfReplicaSpecs"].items()} == {"Chief": 1, "Worker": 8, "PS": 3}
    script = os.path.join(ROOT, "examples", "train_digits.py")
    assert main(["--config", str(config), script]) == 2  # a local launch of the same config is refused
    assert "at most 2" in capsys.readouterr().err


def test_cli_emit_secret_to_a_private_file(capsys, caplog, tmp_path):
    out_file = tmp_path / "job.yaml"
    with caplog.at_level("INFO", logger="tfdist.launch"):
        code, out, _ = _emit(capsys, "--emit", "k8s", "--image", IMAGE, "--emit-secret", "--output", str(out_file),
                             "--checkpoint-claim", "nfs-claim", "--timeout", "600", "train.py")
    assert code == 0 and out == ""
    assert f"wrote 6 manifest(s) for job 'multi-machine' to {out_file}" in caplog.text
    assert stat.S_IMODE(os.stat(out_file).st_mode) == 0o600  # it holds the token
    docs = list(yaml.safe_load_all(out_file.read_text()))
    assert docs[0]["kind"] == "Secret" and len(docs[0]["stringData"]["token"]) == 64
    assert "kubectl create secret" not in out_file.read_text()
    jobs = [d for d in docs if d["kind"] == "Job"]
    assert {d["spec"]["activeDeadlineSeconds"] for d in jobs} == {600}
    ps = _containers(docs)[TaskSpec("ps", 0)][0]
    assert ps["volumes"][0]["persistentVolumeClaim"] == {"claimName": "nfs-claim"}


@pytest.mark.parametrize("args, message", [
    (["--emit", "kubeflow"], "--emit needs the container image the pods run. Received: --emit kubeflow without"),
    (["--image", "x"], "--image is an option of --emit"),
    (["--emit", "k8s", "--image", "x", "--task", "ps:0"], "Received: --emit k8s --task ps:0. Leave --task out."),
    (["--emit", "k8s", "--image", "x", "--checkpoint-claim", "c", "--no-checkpoint-volume"], "contradict"),
    (["--emit", "k8s", "--image", "x", "--namespace", "NS"], "Received: namespace='NS'"),
    (["--emit", "k8s", "--image", "x", "--emit-secret"], "Received: --emit-secret without --output. Add --output FILE"),
    (["--emit", "kubeflow", "--image", "x", "--checkpoint-claim-per-ps"], "share one pod template"),
    (["--checkpoint-claim-per-ps"], "--checkpoint-claim-per-ps is an option of --emit"),
])
def test_cli_emit_mistakes_exit_2_with_a_message(capsys, args, message):
    code, out, err = _emit(capsys, *args)
    assert code == 2 and out == ""
    assert message in err


def test_cli_a_bad_job_name_exits_2(capsys, tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("name: My_Job\ncluster: {worker: 1, ps: 1}\n")
    code = main(["--config", str(config), "--emit", "kubeflow", "--image", "x"])
    _, err = capsys.readouterr()
    assert code == 2
    assert "Invalid config field `name` for Kubernetes. Received: name='My_Job'" in err
    assert "Use e.g. name: my-job." in err


# ------------------------------------------------------------------ the chief's restart rule
@functools.lru_cache(maxsize=1)
def _job_spec_schema():
    """A validator of the ``batch/v1`` JobSpec schema inside the vendored JobSet CRD (v0.9.1), every object closed."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_jobset_schema", os.path.join(os.path.dirname(__file__),
                                                                                  "test_jobset.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    replicated = module.CRD_SCHEMA["properties"]["spec"]["properties"]["replicatedJobs"]["items"]
    schema = replicated["properties"]["template"]["properties"]["spec"]
    import jsonschema

    jsonschema.validators.validator_for(schema).check_schema(schema)
    return jsonschema.validators.validator_for(schema)(schema)  # checked once (validate() checks every call)


@pytest.mark.parametrize("data", [FULL, {"name": "nochief", "cluster": {"worker": 2, "ps": 1}},
                                  dict(FULL, launch={"restart_chief": False}),
                                  {"name": "ar", "cluster": {"worker": 2}}])
def test_every_plain_job_spec_validates_against_the_kubernetes_job_schema(data):
    import jsonschema

    validator = _job_spec_schema()
    for doc in k8s.kubernetes_jobs(JobConfig.from_dict(data), IMAGE, "train.py"):
        if doc["kind"] == "Job":
            validator.validate(doc["spec"])
            if "podFailurePolicy" in doc["spec"]:  # what the API server requires beside it (not in the schema)
                assert doc["spec"]["template"]["spec"]["restartPolicy"] == "Never"
                assert doc["spec"]["podReplacementPolicy"] == "Failed"
    with pytest.raises(jsonschema.ValidationError):  # the schema is closed: a misspelt field fails
        validator.validate({"template": {}, "podFailurPolicy": {}})


def test_the_chief_job_fails_on_the_exit_codes_the_launcher_does_not_restart():
    """Kubernetes' podFailurePolicy matches ``decide_chief_restart`` for every exit code a container can report."""
    from tfdist.cluster.failure import decide_chief_restart

    cfg = JobConfig.from_dict(FULL)
    [ignore, rule] = k8s.chief_pod_failure_policy("tfdist")["rules"]  # (rules are read in order)
    assert rule["action"] == "FailJob" and rule["onExitCodes"]["operator"] == "In"
    values = rule["onExitCodes"]["values"]
    assert values == sorted(set(values)) and 0 not in values and len(values) <= 255  # what the API server accepts
    for code in range(1, 256):  # a container's exit code: 128 + N when signal N killed it
        fails_job = code in values
        assert fails_job == (not decide_chief_restart(cfg, code, said_done=False, restarts=0).restart), code
    assert ignore == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    # restart_chief: false, or no parameter servers: the chief's Job never replaces its pod
    for data in (dict(FULL, launch={"restart_chief": False}), {"name": "ar", "cluster": {"worker": 2}}):
        chief = next(d for d in k8s.kubernetes_jobs(JobConfig.from_dict(data), IMAGE, "t.py")
                     if d["kind"] == "Job" and d["metadata"]["name"].endswith(("chief-0", "worker-0")))
        assert chief["spec"]["backoffLimit"] == 0 and "podFailurePolicy" not in chief["spec"]


def test_a_fixed_stream_port_is_declared_on_ps_pods_only_and_only_when_the_stream_runs():
    """``ps.stream_port``: PS pods declare the data plane's port beside 2222 (for a NetworkPolicy); not with
    ``ps.transport: grpc`` or TLS (every call on 2222), nor on other pods, nor without a fixed port."""
    for fields, declared in (({"stream_port": 2223}, True), ({"stream_port": 2223, "transport": "grpc"}, False),
                             ({}, False)):
        cfg = JobConfig.from_dict({**FULL, "ps": {**FULL["ps"], **fields}})
        for task, (_, container) in _containers(k8s.kubernetes_jobs(cfg, IMAGE, "train.py")).items():
            expected = [{"name": "tfdist", "containerPort": 2222}]
            if declared and task.job == "ps":
                expected.append({"name": "tfdist-stream", "containerPort": 2223})
            assert container["ports"] == expected, (fields, task)
            if task.job == "ps":
                assert JobConfig.from_json(_values(container)[constants.ENV_CONFIG]).ps.stream_port == fields.get(
                    "stream_port")
