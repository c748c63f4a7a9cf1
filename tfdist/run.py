"""``python -m tfdist.run SCRIPT [ARGS...]``: run a training script so that its exit code is always seen.

A training task tells the parameter servers it is done at interpreter exit,
and only if its script ended cleanly (:mod:`tfdist.exit_status`). In a plain
``python SCRIPT`` interpreter, Python shows no hook a ``SystemExit`` raised
by the script itself (``raise SystemExit(1)`` written out), so such a task
would say it is done although it failed. Run through this module, the script
runs as ``__main__`` (``runpy``, as ``python SCRIPT`` would: ``sys.argv``,
``sys.path[0]`` the script's folder) and every way it ends is recorded
before the exit hooks run: a ``SystemExit`` of any origin, an uncaught
exception (its traceback printed, exit 1, or 78 for a
:class:`~tfdist.errors.ConfigError`), Ctrl-C (killed by SIGINT, as CPython).

The launcher (``--task``, the local launch without its zygote) and the
Kubernetes manifests start training tasks this way; the local launch's zygote
does the same in its forked tasks. ``os._exit`` runs no exit hook at all, so a
task ending that way never says it is done (the PS tasks see it vanish).

``python -m tfdist.run -m MODULE [ARGS...]`` runs a module instead.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
from typing import Sequence

from tfdist import exit_status

__all__ = ["run_target", "main"]


def run_target(kind: str, name: str, args: Sequence[str], argv0: str = "python") -> int | str | None:
    """Runs script (``kind`` ``"script"``) or module ``name`` as ``__main__``; returns the exit code it called for.

    The code is recorded (:func:`tfdist.exit_status.record_exit`) before this
    returns, so the exit hooks that run afterwards know whether the script
    failed. An uncaught ``KeyboardInterrupt`` ends the process by SIGINT here.
    """
    code: int | str | None = 0
    try:
        if kind == "module":
            sys.argv = [name, *args]
            sys.path[0] = os.getcwd()
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        else:
            if not os.path.isfile(name):  # as CPython says it, with its exit code
                print(f"{argv0}: can't open file {os.path.abspath(name)!r}: [Errno 2] No such file or directory",
                      file=sys.stderr)
                raise SystemExit(2)
            sys.argv = [name, *args]
            sys.path[0] = os.path.dirname(os.path.abspath(name))
            runpy.run_path(name, run_name="__main__")
    except SystemExit as e:
        code = e.code
        exit_status.record_exit(exit_status.exit_code_for(e))
    except KeyboardInterrupt as e:  # as CPython ends on an unhandled SIGINT: killed by it (exit code -2)
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        exit_status.record_exit(exit_status.EXIT_SIGINT, e)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 130
    except BaseException as e:  # as CPython: the traceback, exit 1 (a ConfigError: its own code, never restarted)
        import traceback

        traceback.print_exc()
        code = exit_status.exit_code_for(e)
        exit_status.record_exit(code, e)
    return code


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print(__doc__.split("\n\n")[0].strip("`"), file=sys.stderr)
        print("usage: python -m tfdist.run SCRIPT [ARGS...] | -m MODULE [ARGS...]", file=sys.stderr)
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") else 2)
    exit_status.install()
    if argv[0] == "-m":
        code = run_target("module", argv[1], argv[2:])
    else:
        code = run_target("script", argv[0], argv[1:])
    # A normal interpreter exit from here: exit hooks (a worker's Done), thread joins, flushes.
    raise SystemExit(code)


if __name__ == "__main__":
    main()
