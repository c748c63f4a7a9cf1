"""A JSON-lines file of straggler verdicts: one JSON object per line, flushed per write."""

from __future__ import annotations

import json
import os
import threading
from typing import Any, Mapping

__all__ = ["JsonLinesLog"]


class JsonLinesLog:
    """Appends JSON objects to ``path``, one per line.

    Args:
        path: File to append to; its directory is created.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, record: Mapping[str, Any]) -> None:
        line = json.dumps(record, sort_keys=True, allow_nan=False, default=str)
        with self._lock:
            if self._file.closed:
                return
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()

    @staticmethod
    def read(path: str | os.PathLike) -> list[dict[str, Any]]:
        """All records of a JSON-lines file."""
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
