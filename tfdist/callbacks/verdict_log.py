"""Kept for old imports: the JSON-lines verdict file is :mod:`tfdist.straggler.verdict_log`."""

from tfdist.straggler.verdict_log import JsonLinesLog

__all__ = ["JsonLinesLog"]
