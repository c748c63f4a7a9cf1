#!/usr/bin/env bash
# The main job: a local cluster (2 PS + 2 workers) training a CNN on MNIST
# (or scikit-learn's bundled digits when MNIST cannot be downloaded).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
cd "$ROOT"
exec python -m tfdist.launch --config configs/local_async.yaml examples/train_digits.py "$@"
