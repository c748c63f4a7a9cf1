"""Keras callbacks of tfdist."""

from tfdist.callbacks.straggler_detector import StragglerDetector

__all__ = ["StragglerDetector"]
