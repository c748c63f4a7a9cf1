"""``--emit jobset``: the job as one JobSet, checked against the released JobSet CRD (no cluster, no TensorFlow).

The CRD is vendored from JobSet's release v0.9.1
(``vendor/jobset.x-k8s.io_jobsets-v0.9.1.yaml``: kubernetes-sigs/jobset
``config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml`` at tag v0.9.1,
commit acea4e18c8d0, Apache-2.0), and its ``v1alpha2`` ``openAPIV3Schema``
validates every emitted document. Every object in it is closed here: a field
the CRD does not know, which the API server would drop silently, fails
validation. The hand-written subset of earlier sessions
(``jobset_v1alpha2_schema.json``) is checked too.
"""

import json
import os

import jsonschema
import pytest
import yaml

from tfdist import constants
from tfdist.cluster import k8s
from tfdist.cluster.jobset import ENV_TASK_INDEX, jobset_config, jobset_host, kubernetes_jobset
from tfdist.cluster.resolver import resolve_cluster
from tfdist.config import JobConfig, TaskSpec
from tfdist.errors import ConfigError
from tfdist.exit_status import EXIT_CONFIG_ERROR
from tfdist.launch import main

SCHEMA_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobset_v1alpha2_schema.json")


def _closed(schema):
    """Every object schema with listed properties refuses others (unless it preserves unknown fields)."""
    if isinstance(schema, dict):
        out = {k: _closed(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out \
                and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


SCHEMA = _closed(json.load(open(SCHEMA_PATH)))
CRD_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vendor", "jobset.x-k8s.io_jobsets-v0.9.1.yaml")


def _crd_schema():
    with open(CRD_PATH) as f:
        crd = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2"]
    return _closed(version["schema"]["openAPIV3Schema"])


CRD_SCHEMA = _crd_schema()


def validate(doc):
    jsonschema.validate(doc, CRD_SCHEMA)  # the released CRD
    jsonschema.validate(doc, SCHEMA)  # and the subset written before it was vendored


def make(cluster=None, **sections):
    return JobConfig.from_dict({"name": "digits", "cluster": cluster or {"chief": 1, "ps": 2, "worker": 2,
                                                                         "evaluator": 1}, **sections})


def container_env(replicated_job):
    return {e["name"]: e for e in replicated_job["template"]["spec"]["template"]["spec"]["containers"][0]["env"]}


def expand(value, index):
    """Kubernetes' expansion of ``$(VAR)`` for the pod of completion index ``index``."""
    return value.replace(f"$({ENV_TASK_INDEX})", str(index))


def test_the_jobset_validates_against_the_schema_and_the_schema_catches_unknown_fields():
    doc = kubernetes_jobset(make(), "registry/digits:1", "train.py", ["--epochs", "3"])
    validate(doc)
    validate(yaml.safe_load(k8s.dump_yaml(doc)))  # as kubectl reads it
    bad = json.loads(json.dumps(doc))
    bad["spec"]["failurePolicy"]["maxRestart"] = 3  # a typo the API server would prune silently
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
    bad = json.loads(json.dumps(doc))
    bad["spec"]["successPolicy"]["operator"] = "Every"
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)


def test_one_indexed_replicated_job_per_role_in_start_order():
    doc = kubernetes_jobset(make(), "registry/digits:1", "train.py")
    jobs = doc["spec"]["replicatedJobs"]
    assert [j["name"] for j in jobs] == ["ps", "chief", "worker", "evaluator"]
    for j, count in zip(jobs, [2, 1, 2, 1]):
        spec = j["template"]["spec"]
        assert j["replicas"] == 1
        assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", count, count)
        assert spec["podReplacementPolicy"] == "Failed"
        assert spec["template"]["spec"]["restartPolicy"] == "Never"
        assert "hostname" not in spec["template"]["spec"]  # the JobSet controller sets it
    assert doc["spec"]["network"] == {"enableDNSHostnames": True, "subdomain": "digits",
                                      "publishNotReadyAddresses": True}


def test_each_pod_resolves_its_own_task_at_the_jobset_dns_names():
    config = make()
    doc = kubernetes_jobset(config, "registry/digits:1", "train.py")
    addressed = jobset_config(config)
    assert addressed.cluster.worker == ["digits-worker-0-0.digits:2222", "digits-worker-0-1.digits:2222"]
    for j in doc["spec"]["replicatedJobs"]:
        env = container_env(j)
        assert env[ENV_TASK_INDEX]["valueFrom"]["fieldRef"]["fieldPath"] == \
            "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        names = [e for e in container_env(j)]
        assert names.index(ENV_TASK_INDEX) < names.index(constants.ENV_TF_CONFIG)  # defined first: it expands
        for index in range(j["template"]["spec"]["completions"]):
            pod_env = {constants.ENV_TF_CONFIG: expand(env[constants.ENV_TF_CONFIG]["value"], index),
                       constants.ENV_CONFIG: env[constants.ENV_CONFIG]["value"]}
            resolved = resolve_cluster(env=pod_env, required=True)
            assert resolved.task == TaskSpec(j["name"], index)
            assert resolved.config.cluster == addressed.cluster
            host = jobset_host(config, resolved.task)
            assert getattr(addressed.cluster, j["name"])[index] == f"{host}.digits:2222"


def test_success_is_every_training_task_and_a_config_error_fails_the_jobset_without_restarts():
    doc = kubernetes_jobset(make(), "registry/digits:1", "train.py")
    assert doc["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["chief", "worker"]}
    failure = doc["spec"]["failurePolicy"]
    assert failure["maxRestarts"] == k8s.RESTART_LIMIT - 1
    assert failure["rules"] == [{"name": "config-error-fails-the-jobset", "action": "FailJobSet",
                                 "onJobFailureReasons": ["PodFailurePolicy"]}]
    for j in doc["spec"]["replicatedJobs"]:
        rules = j["template"]["spec"]["podFailurePolicy"]["rules"]
        if j["name"] == "chief":  # the launcher's rule: a chief that ended by itself with an error (1-127, 78 too)
            assert rules == k8s.chief_pod_failure_policy("tfdist")["rules"]
            assert EXIT_CONFIG_ERROR in rules[1]["onExitCodes"]["values"]
        else:
            assert rules[0] == {"action": "FailJob", "onExitCodes": {"containerName": "tfdist", "operator": "In",
                                                                     "values": [EXIT_CONFIG_ERROR]}}
    no_chief = kubernetes_jobset(make({"ps": 1, "worker": 3}), "registry/digits:1", "train.py")
    assert no_chief["spec"]["successPolicy"]["targetReplicatedJobs"] == ["worker"]


def test_restart_limits_and_a_chief_that_must_not_restart():
    doc = kubernetes_jobset(make(), "registry/digits:1", "train.py")
    limits = {j["name"]: j["template"]["spec"]["backoffLimit"] for j in doc["spec"]["replicatedJobs"]}
    assert limits == {"ps": 2 * k8s.RESTART_LIMIT, "chief": k8s.RESTART_LIMIT, "worker": 2 * k8s.RESTART_LIMIT,
                      "evaluator": k8s.RESTART_LIMIT}
    doc = kubernetes_jobset(make(launch={"restart_chief": False}), "registry/digits:1", "train.py")
    assert {j["name"]: j["template"]["spec"]["backoffLimit"] for j in doc["spec"]["replicatedJobs"]}["chief"] == 0


def test_pods_share_the_plain_manifests_parts():
    config = make(kubernetes={"ttl_seconds_after_finished": 600}, launch={"job_timeout_s": 3600})
    doc = kubernetes_jobset(config, "registry/digits:1", "train.py")
    assert doc["spec"]["ttlSecondsAfterFinished"] == 600
    by_name = {j["name"]: j["template"]["spec"] for j in doc["spec"]["replicatedJobs"]}
    assert by_name["worker"]["activeDeadlineSeconds"] == 3600
    ps_pod = by_name["ps"]["template"]["spec"]
    assert ps_pod["securityContext"]["runAsNonRoot"] is True
    assert ps_pod["containers"][0]["command"] == ["python", "-m", "tfdist.ps"]
    assert {v["name"] for v in ps_pod["volumes"]} == {"checkpoints", "token"}
    chief_pod = by_name["chief"]["template"]["spec"]
    assert chief_pod["containers"][0]["command"] == ["python", "-m", "tfdist.run", "train.py"]
    assert "checkpoints" in {v["name"] for v in chief_pod["volumes"]}
    assert constants.ENV_TOKEN not in container_env({"template": {"spec": by_name["worker"]}})  # a mounted file


@pytest.mark.parametrize("config, kwargs, match", [
    (lambda: make(), {"checkpoint_claim_per_ps": True}, "cannot give each PS task its own checkpoint claim"),
    (lambda: make(elastic={"enabled": True}), {}, "elastic.enabled"),
    # 53 characters fit <name>-worker-1 (plain Jobs) but not the JobSet's <name>-worker-0-1
    (lambda: JobConfig.from_dict({"name": "a" * 53, "cluster": {"ps": 1, "worker": 2}}), {}, "for a JobSet"),
])
def test_what_a_jobset_cannot_do_is_refused(config, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        kubernetes_jobset(config(), "registry/digits:1", "train.py", **kwargs)


def test_the_longest_jobset_hostname_fits(capsys):
    name = "a" * (63 - len("-evaluator-0-0"))
    config = JobConfig.from_dict({"name": name, "cluster": {"ps": 1, "worker": 1, "evaluator": 1}})
    validate(kubernetes_jobset(config, "registry/digits:1", "train.py"))
    with pytest.raises(ConfigError, match="JobSet"):
        kubernetes_jobset(JobConfig.from_dict({"name": name + "a", "cluster": {"ps": 1, "worker": 1, "evaluator": 1}}),
                          "registry/digits:1", "train.py")


def test_cli_emit_jobset_prints_a_valid_jobset(capsys, tmp_path):
    cfg = tmp_path / "job.yaml"
    cfg.write_text("name: digits\ncluster: {ps: 1, worker: 2, input: 1}\n")
    assert main(["--config", str(cfg), "--emit", "jobset", "--image", "registry/digits:1", "train.py"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["JobSet"]
    validate(docs[0])
    names = [j["name"] for j in docs[0]["spec"]["replicatedJobs"]]
    assert names == ["ps", "input", "worker"]  # a JobSet, unlike a TFJob, runs input tasks
