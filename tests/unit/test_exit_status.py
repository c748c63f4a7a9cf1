"""How a script ended, as an exit hook sees it (tfdist.exit_status): fresh interpreters, no sockets, no TensorFlow."""

import subprocess
import sys
import textwrap

import pytest

from tfdist import exit_status

_SCRIPT = textwrap.dedent("""
    import atexit, sys
    import tfdist
    from tfdist import exit_status
    atexit.register(lambda: print("ended_with_error", exit_status.ended_with_error(), file=sys.stderr))
    {body}
""")


def _run(body):
    r = subprocess.run([sys.executable, "-c", _SCRIPT.format(body=body)], capture_output=True, text=True, timeout=60)
    return r.returncode, r.stderr


@pytest.mark.parametrize("body, code, failed", [
    ("pass", 0, False),
    ("sys.exit(0)", 0, False),
    ("sys.exit()", 0, False),
    ("sys.exit(1)", 1, True),  # issue 26: a bare sys.exit(1) was not seen, so the worker still said Done
    ("sys.exit(3)", 3, True),
    ("sys.exit('failed: no data')", 1, True),
    ("exit(1)", 1, True),
    ("quit(0)", 0, False),
    ("import IPython; sys.exit(2)", 2, True),  # TensorFlow and Keras import IPython in a plain interpreter
    ("import threading; t = threading.Thread(target=sys.exit, args=(1,)); t.start(); t.join()", 0, False),
    ("try:\n    sys.exit(1)\nexcept SystemExit:\n    pass\nsys.exit(0)", 0, False),
    ("raise RuntimeError('boom')", 1, True),
    ("raise KeyboardInterrupt", -2, True),  # as CPython: killed by SIGINT
    ("from tfdist.errors import ConfigError; raise ConfigError('bad field')", exit_status.EXIT_CONFIG_ERROR, True),
])
def test_exit_hooks_see_whether_the_script_failed(body, code, failed):
    returncode, stderr = _run(body)
    assert returncode == code, stderr
    assert f"ended_with_error {failed}" in stderr, stderr


def test_a_config_error_keeps_its_traceback_and_exits_78():
    returncode, stderr = _run("from tfdist.errors import ConfigError; raise ConfigError('Invalid config field `x`.')")
    assert returncode == 78
    assert "tfdist.errors.ConfigError: Invalid config field `x`." in stderr


def test_a_users_excepthook_still_runs():
    body = ("sys.excepthook = (lambda prev: lambda *a: (print('user hook', file=sys.stderr), prev(*a)))"
            "(sys.excepthook)\nraise RuntimeError('x')")
    returncode, stderr = _run(body)
    assert returncode == 1 and "user hook" in stderr and "ended_with_error True" in stderr, stderr


@pytest.mark.parametrize("exc, code", [(SystemExit(0), 0), (SystemExit(None), 0), (SystemExit(4), 4),
                                       (SystemExit("message"), 1), (RuntimeError(), 1)])
def test_exit_code_for(exc, code):
    assert exit_status.exit_code_for(exc) == code


def test_only_the_config_exit_code_is_deterministic():
    assert exit_status.is_deterministic_failure(exit_status.EXIT_CONFIG_ERROR)
    assert not any(exit_status.is_deterministic_failure(c) for c in (None, 0, 1, 2, 130, 137, 143, -9))


@pytest.mark.parametrize("body, code, failed", [
    ("raise SystemExit(1)", 1, True),  # unseen in a plain interpreter: no hook sees a SystemExit raised by hand
    ("raise SystemExit", 0, False),
    ("raise SystemExit('no data')", 1, True),
    ("sys.exit(4)", 4, True),
    ("pass", 0, False),
    ("raise ValueError('boom')", 1, True),
    ("from tfdist.errors import ConfigError; raise ConfigError('bad field')", exit_status.EXIT_CONFIG_ERROR, True),
])
def test_through_tfdist_run_every_end_is_seen(tmp_path, body, code, failed):
    script = tmp_path / "train.py"
    text = _SCRIPT.format(body=body)
    if body == "pass":
        text += f"print('argv', sys.argv[1:], sys.path[0] == {str(tmp_path)!r}, __name__, file=sys.stderr)\n"
    script.write_text(text)
    r = subprocess.run([sys.executable, "-m", "tfdist.run", str(script), "--flag", "x"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == code, r.stderr
    assert f"ended_with_error {failed}" in r.stderr, r.stderr
    if body == "pass":  # run as python would: its argv, its folder first on sys.path, as __main__
        assert "argv ['--flag', 'x'] True __main__" in r.stderr, r.stderr


def test_tfdist_run_says_how_to_use_it_and_refuses_a_missing_script(tmp_path):
    r = subprocess.run([sys.executable, "-m", "tfdist.run"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "usage: python -m tfdist.run SCRIPT" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "tfdist.run", str(tmp_path / "missing.py")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "can't open file" in r.stderr and "missing.py" in r.stderr, r.stderr


def test_the_zygote_runs_what_tfdist_run_would_run():
    from tfdist.cluster.zygote import _target

    python = sys.executable
    assert _target([python, "-m", "tfdist.run", "t.py", "--a", "1"]) == ("script", "t.py", ["--a", "1"])
    assert _target([python, "-m", "tfdist.run", "-m", "pkg.main", "b"]) == ("module", "pkg.main", ["b"])
    assert _target([python, "t.py"]) == ("script", "t.py", [])
    assert _target([python, "-m", "tfdist.run", "-c", "x"]) is None  # not something tfdist.run runs
