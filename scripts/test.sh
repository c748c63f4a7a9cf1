#!/usr/bin/env bash
# Runs the test suite (unit + integration + e2e; slow scenario tests are
# skipped unless RUN_SLOW=1). Extra arguments go to pytest.
#
# The whole suite (no test paths given) runs on TFDIST_TEST_WORKERS pytest-xdist
# workers, 3 by default: on a 2-core machine that keeps both cores busy while
# tests wait on start-up and heart-beats (README "Tests"). A run of chosen files
# or tests runs serially unless TFDIST_TEST_WORKERS is set (.ci/run's slow set);
# a run with -n/-p/--pdb/--cpu-report of its own, or TFDIST_TEST_WORKERS=0, runs
# serially.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
cd "$ROOT"
workers="${TFDIST_TEST_WORKERS:-3}"
parallel=1
[ "$workers" = 0 ] && parallel=0
for arg in "$@"; do
    case "$arg" in
        -n|-n*|--numprocesses*|-p|--pdb|--trace|-s|--capture=no|--cpu-report*) parallel=0 ;;
        -*) ;;
        *) [ -e "${arg%%::*}" ] && [ -z "${TFDIST_TEST_WORKERS:-}" ] && parallel=0 ;;  # chosen tests: serially
    esac
done
if [ "$parallel" = 1 ]; then
    exec python -m pytest -n "$workers" "$@"
fi
exec python -m pytest "$@"
