"""Cluster roles, TF_CONFIG, local processes and the launcher."""

from tfdist.cluster.local import LocalJob, assign_ports, free_port, task_environment
from tfdist.cluster.process import TaskProcess

__all__ = ["LocalJob", "TaskProcess", "assign_ports", "free_port", "task_environment"]
