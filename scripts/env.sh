#!/usr/bin/env bash
# Creates (or reuses) ./.venv and installs tfdist with its test extras into it.
# Sourced by the other scripts; prints nothing when the environment is current.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TFDIST_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[tfdist] creating virtual environment in $VENV" >&2
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2
fi
STAMP="$VENV/.tfdist-installed"
if [ ! -f "$STAMP" ] || [ "$ROOT/setup.py" -nt "$STAMP" ]; then
  echo "[tfdist] installing tfdist and its dependencies (first run takes a few minutes)" >&2
  "$VENV/bin/python" -m pip install -q -e "$ROOT[test]" >&2
  touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
