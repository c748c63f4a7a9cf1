"""The cluster resolver, cluster roles, local task processes and Kubernetes manifests.

The launch CLI that drives them sits above this package: :mod:`tfdist.launch`.
"""

from tfdist.cluster.failure import FailureAction, FailureDecision, decide_worker_failure
from tfdist.cluster.k8s import dump_yaml, kubeflow_tfjob, kubernetes_jobs, token_secret
from tfdist.cluster.local import LocalJob, assign_ports, free_port, free_ports, task_environment
from tfdist.cluster.process import TaskProcess
from tfdist.cluster.resolver import ResolvedCluster, resolve_cluster

__all__ = ["ResolvedCluster", "resolve_cluster",
           "LocalJob", "TaskProcess", "assign_ports", "free_port", "free_ports", "task_environment",
           "FailureAction", "FailureDecision", "decide_worker_failure",
           "kubeflow_tfjob", "kubernetes_jobs", "token_secret", "dump_yaml"]
