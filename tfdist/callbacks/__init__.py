"""Keras callbacks of tfdist."""

from tfdist.callbacks.elastic import ElasticCallback
from tfdist.callbacks.straggler_detector import StragglerDetector

__all__ = ["ElasticCallback", "StragglerDetector"]
