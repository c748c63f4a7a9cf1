#!/usr/bin/env bash
# CPU seconds of a command and of every process it starts, however they end up parented: zygote-forked
# tasks, fork-server workers, orphans. /usr/bin/time counts only the children a process waited for, and the
# zygote's tasks are never waited for by pytest, so it undercounts test runs; a cgroup counts them all.
#
# Usage (root; a cgroup v1 cpuacct hierarchy or cgroup v2):
#   scripts/cpu_of_tree.sh NAME COMMAND [ARGS...]
#   e.g. scripts/cpu_of_tree.sh launcher python -m pytest tests/e2e/test_launcher_signals.py -q
# Prints "CPUSTAT NAME rc=.. cpu_s=.. wall_s=.. procs_left=.." last (procs_left: processes of the tree still
# alive when the command ended, i.e. orphans, or ones still exiting). Exits with the command's status.
set -uo pipefail
name=$1
shift
if [ -d /sys/fs/cgroup/cpuacct ]; then
    cg=/sys/fs/cgroup/cpuacct/cpu_of_tree_$name
    mkdir -p "$cg" && echo 0 > "$cg/cpuacct.usage"
    usage() { awk -v n="$(cat "$cg/cpuacct.usage")" 'BEGIN {print n / 1e9}'; }
else
    root=/sys/fs/cgroup
    [ -f "$root/cgroup.controllers" ] || root=/sys/fs/cgroup/unified
    cg=$root/cpu_of_tree_$name
    mkdir -p "$cg"
    start_usec=$(awk '/^usage_usec/ {print $2}' "$cg/cpu.stat")
    usage() { awk -v s="$start_usec" '/^usage_usec/ {print ($2 - s) / 1e6}' "$cg/cpu.stat"; }
fi
start=$(date +%s.%N)
bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' bash "$cg" "$@"
rc=$?
end=$(date +%s.%N)
printf 'CPUSTAT %s rc=%d cpu_s=%.1f wall_s=%.1f procs_left=%d\n' "$name" "$rc" "$(usage)" \
    "$(awk -v a="$start" -v b="$end" 'BEGIN {print b - a}')" "$(wc -l < "$cg/cgroup.procs")"
exit $rc
