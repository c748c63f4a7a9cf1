"""Keras callbacks of tfdist."""

from tfdist.callbacks.elastic import ElasticCallback
from tfdist.callbacks.leave_on_train_end import LeaveOnTrainEnd
from tfdist.callbacks.straggler_detector import StragglerDetector

__all__ = ["ElasticCallback", "LeaveOnTrainEnd", "StragglerDetector"]
