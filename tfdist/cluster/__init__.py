"""Cluster roles, TF_CONFIG, local processes and the launcher."""

from tfdist.cluster.failure import FailureAction, FailureDecision, decide_worker_failure
from tfdist.cluster.local import LocalJob, assign_ports, free_port, free_ports, task_environment
from tfdist.cluster.process import TaskProcess

__all__ = ["LocalJob", "TaskProcess", "assign_ports", "free_port", "free_ports", "task_environment",
           "FailureAction", "FailureDecision", "decide_worker_failure"]
