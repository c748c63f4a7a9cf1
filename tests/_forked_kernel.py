"""A Jupyter kernel forked from the test run's zygote (``run_notebook`` in tests/conftest.py; README "Tests").

The notebook tests' kernels import TensorFlow, Keras and tfdist first thing:
~6 CPU-seconds each when the kernel is a fresh interpreter. Started as the
kernel's command (kernel spec ``tfdist-forked``), this script asks the zygote
the pytest process lends (``TFDIST_ZYGOTE_SOCKET``) to fork a process that
runs this file with ``--in-kernel``, which starts ``ipykernel_launcher`` there,
with this process's environment and working directory
(``tfdist.cluster.process.TaskProcess``, as a launcher forks its tasks). It
forwards the signals Jupyter sends it (SIGINT interrupts, SIGTERM stops) and
exits as the kernel did. A kernel that cannot be forked (no zygote to borrow,
an import-time variable that differs) starts the usual way. If Jupyter kills
this process, the lent zygote's connection closes and the kernel dies with it.

In the forked kernel, matplotlib is already imported (TensorFlow's imports
bring it in the zygote), so the inline backend ipykernel names in
``MPLBACKEND`` at its start-up would be ignored: ``--in-kernel`` sets it in
matplotlib's settings as a fresh kernel's import of matplotlib would.

Usage (the kernel spec's argv): ``python tests/_forked_kernel.py -f {connection_file}``.
"""

import os
import runpy
import signal
import sys

INLINE = "module://matplotlib_inline.backend_inline"


def in_kernel(args: list[str]) -> None:
    """In the forked process: ipykernel, with the plotting backend a fresh kernel gets."""
    os.environ.setdefault("MPLBACKEND", INLINE)  # what ipykernel sets when it is unset
    if "matplotlib" in sys.modules:
        sys.modules["matplotlib"].rcParams["backend"] = os.environ["MPLBACKEND"]
    sys.argv = ["ipykernel_launcher", *args]
    runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)


def main(args: list[str]) -> int:
    from tfdist.cluster.process import TaskProcess
    from tfdist.config import TaskSpec

    kernel = TaskProcess(TaskSpec("worker", 0), [sys.executable, os.path.abspath(__file__), "--in-kernel", *args],
                         dict(os.environ), fast_start=True, forward_stdout=True, forward_stderr=True)
    kernel.start()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: kernel.signal(signum))
    code = kernel.wait()
    return 1 if code is None else (128 - code if code < 0 else code)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--in-kernel"]:
        in_kernel(sys.argv[2:])
    else:
        sys.exit(main(sys.argv[1:]))
