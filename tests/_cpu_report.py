"""``--cpu-report FILE``: each test's wall time and the CPU time of every process its run used (issue #22).

CPU is read from the cgroup this pytest process runs in (cgroup v1
``cpuacct.usage`` or v2 ``cpu.stat``), so it counts the test's child
processes however they are parented (zygote-forked tasks, orphans), which
``resource.getrusage`` cannot. It is exact when pytest runs alone in a cgroup
of its own: ``scripts/cpu_of_tree.sh NAME ./scripts/test.sh --cpu-report
FILE`` (root). In any other cgroup (the root one: the whole machine) the
numbers include whatever else runs, and the report says so. Serial runs
only: under pytest-xdist every worker would count the others' tests too.

The report: one JSON object per test (setup, call and teardown together:
a module-scoped fixture's set-up counts in its first test) and, at the end of
the run, the slowest tests by wall time with their CPU time.
"""

from __future__ import annotations

import json
import os
import time

import pytest


def cgroup_cpu_reader():
    """A function returning the CPU seconds used so far by this process's cgroup, and that cgroup's path."""
    try:
        lines = open("/proc/self/cgroup").read().splitlines()
    except OSError:
        return None, None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpuacct" in controllers.split(","):
            usage = f"/sys/fs/cgroup/cpuacct{path.rstrip('/')}/cpuacct.usage"
            if os.path.exists(usage):
                return (lambda: int(open(usage).read()) / 1e9), path
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
                stat = f"{root}{path.rstrip('/')}/cpu.stat"
                if os.path.exists(stat):
                    def read(stat=stat):
                        for row in open(stat):
                            if row.startswith("usage_usec"):
                                return int(row.split()[1]) / 1e6
                        return 0.0
                    return read, path
    return None, None


def pytest_addoption(parser):
    parser.addoption("--cpu-report", metavar="FILE", help="write each test's wall and CPU seconds (JSON lines) "
                     "to FILE and print the slowest tests (tests/_cpu_report.py; exact under scripts/cpu_of_tree.sh)")
    parser.addoption("--cpu-report-top", type=int, default=30, help="how many tests the --cpu-report summary lists")


def pytest_configure(config):
    path = config.getoption("--cpu-report", default=None)
    if path and (os.environ.get("PYTEST_XDIST_WORKER") or getattr(config.option, "numprocesses", None)):
        raise pytest.UsageError("--cpu-report counts the CPU of the whole run per test: run it serially "
                                "(without -n; ./scripts/test.sh runs serially when given --cpu-report)")
    if path:
        config.pluginmanager.register(_CpuReport(path, config.getoption("--cpu-report-top")), "tfdist-cpu-report")


class _CpuReport:
    def __init__(self, path: str, top: int):
        self.path, self.top = path, top
        self.read, self.cgroup = cgroup_cpu_reader()
        self.rows: list[dict] = []
        self.out = open(path, "w")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        wall, cpu = time.monotonic(), self.read() if self.read else None
        yield
        row = {"test": item.nodeid, "wall_s": round(time.monotonic() - wall, 3)}
        if cpu is not None:
            row["cpu_s"] = round(self.read() - cpu, 3)
        self.rows.append(row)
        self.out.write(json.dumps(row) + "\n")
        self.out.flush()

    def pytest_terminal_summary(self, terminalreporter):
        self.out.close()
        tr = terminalreporter
        wall = sum(r["wall_s"] for r in self.rows)
        cpu = sum(r.get("cpu_s", 0.0) for r in self.rows)
        where = (f"cgroup {self.cgroup}" if self.cgroup not in (None, "/") else
                 "the root cgroup (the whole machine: run under scripts/cpu_of_tree.sh for this run's own CPU)")
        tr.write_sep("=", f"cpu report: {len(self.rows)} tests, {wall:.0f} s wall, {cpu:.0f} s CPU in {where}")
        for r in sorted(self.rows, key=lambda r: -r["wall_s"])[: self.top]:
            tr.write_line(f"{r['wall_s']:8.1f} s wall {r.get('cpu_s', float('nan')):8.1f} s CPU  {r['test']}")
        tr.write_line(f"(every test: {self.path})")
