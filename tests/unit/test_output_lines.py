"""tfdist.testing.output.OutputLines: a wait for a child's line ends at its deadline even when the child is silent."""

import subprocess
import sys
import time

from tfdist.testing.output import OutputLines


def _child(code):
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_silent_child_ends_the_wait_at_its_deadline():
    proc = _child("import time; time.sleep(60)")
    try:
        out = OutputLines(proc.stdout)
        start = time.monotonic()
        assert not out.wait_for("ready", timeout_s=0.5)
        assert time.monotonic() - start < 5  # (for line in proc.stdout would block for 60 s)
    finally:
        proc.kill()
        proc.wait(10)


def test_lines_arrive_in_order_and_the_end_of_the_pipe_ends_a_wait():
    proc = _child("import sys, time\nprint('one', flush=True)\ntime.sleep(0.2)\nprint('ready two', flush=True)")
    try:
        out = OutputLines(proc.stdout)
        assert out.wait_for("ready", timeout_s=30)
        assert out.wait_for("one", timeout_s=0)  # already read
        assert not out.wait_for("never printed", timeout_s=30)  # the pipe closed: no 30 s wait
        assert out.text() == "one\nready two\n" == out.drain(timeout_s=1)
    finally:
        proc.wait(10)
