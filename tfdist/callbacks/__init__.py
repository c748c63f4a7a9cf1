"""Keras callbacks of tfdist."""

from tfdist.callbacks.dynamic_tables import DynamicTableLogs
from tfdist.callbacks.elastic import ElasticCallback
from tfdist.callbacks.leave_on_train_end import LeaveOnTrainEnd
from tfdist.callbacks.straggler_detector import StragglerDetector

__all__ = ["DynamicTableLogs", "ElasticCallback", "LeaveOnTrainEnd", "StragglerDetector"]
