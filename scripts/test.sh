#!/usr/bin/env bash
# Runs the test suite (unit + integration + e2e; slow scenario tests are
# skipped unless RUN_SLOW=1). Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
cd "$ROOT"
exec python -m pytest "$@"
