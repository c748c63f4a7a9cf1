"""Shared pytest set-up: quiet TF logs, skip slow tests unless RUN_SLOW=1, a notebook runner."""

import functools
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Set here, in every pytest process (the xdist controller too, which collects no test module), not only in the
# test modules that need it: it is an import-time variable, and a worker whose environment differed from the
# controller's in one would fork no task from the zygote the controller lends (below) but import TensorFlow
# in a zygote of its own (test_zygote.py::test_an_xdist_worker_forks_its_tasks_from_the_zygote_the_run_lends).
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# Local clusters fork their TensorFlow tasks from a process that imported TensorFlow once (README "Tests";
# tfdist/cluster/zygote.py): seconds saved per task, minutes per run. TFDIST_FAST_START=0 starts each the
# usual way.
os.environ.setdefault("TFDIST_FAST_START", "1")
# Local and netns clusters run their tasks with PYTHONUNBUFFERED=1, and the zygote forks only tasks whose
# import-time variables (PYTHON*, ...) equal its own: it starts with the environment of whichever asks first
# (a cluster's task or, through the lent socket below, a launcher with this one), so give this one the same.
os.environ.setdefault("PYTHONUNBUFFERED", "1")

ROOT = pathlib.Path(__file__).resolve().parents[1]
COLAB = ROOT / "colab"

# --cpu-report FILE: each test's wall and CPU seconds, children included (issue #22; README "Tests").
pytest_plugins = ["tests._cpu_report"]


def _own_listen_ports() -> None:
    """Each pytest-xdist worker picks listening ports from its own slice of the range (tfdist.cluster.local
    ENV_LISTEN_PORTS): two workers' clusters never pick the same port between a pick and its task's bind."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit()):
        return
    from tfdist.cluster.local import ENV_LISTEN_PORTS, listen_port_range  # (a worker: the controller skips this)

    if os.environ.get(ENV_LISTEN_PORTS):
        return
    span = listen_port_range()
    if span is None:
        return
    width = (span[1] - span[0]) // int(count)
    if width >= 100:
        low = span[0] + int(worker[2:]) * width
        os.environ[ENV_LISTEN_PORTS] = f"{low}-{low + width}"


_own_listen_ports()


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Processes and clusters first, pure logic last: the short unit tests fill the workers' tails.
        # Stable: a file's tests keep their order. Same order on every worker (xdist checks).
        items.sort(key=lambda item: _TIER_ORDER.get(item.nodeid.split("/", 2)[1], 0))
    if os.environ.get("RUN_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow scenario test; run with RUN_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


#: The order in which pytest-xdist workers are handed the tiers (tests/<tier>/...).
_TIER_ORDER = {"e2e": 0, "integration": 1, "unit": 2}

#: A fixture of one of these scopes is set up once per file (or class): its tests run on one xdist worker.
_SHARED_SCOPE = re.compile(r"""@pytest\.fixture\([^)]*scope\s*=\s*["'](?:module|class|package)["']""")


@functools.lru_cache(maxsize=None)
def _shares_a_fixture(path: str) -> bool:
    try:
        return bool(_SHARED_SCOPE.search((ROOT / path).read_text(encoding="utf-8")))
    except OSError:
        return False


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """How pytest-xdist (``-n N``, pytest.ini) hands tests to its workers.

    Each test goes to whichever worker is free, but the tests of a file that defines a module-, class- or
    package-scoped fixture (a cluster, a benchmark's output they all read) go to one worker, so that
    fixture is set up once, as in a serial run. (``--dist loadgroup`` would do this with ``xdist_group``
    marks, but pytest-xdist 3.8 loses those marks under pytest 9.2: pytest-xdist issue #1386.)
    """
    from xdist.scheduler import LoadScopeScheduling

    class FileOrTestScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if _shares_a_fixture(path) else nodeid

    return FileOrTestScheduling(config, log)


#: The zygote lender of an xdist run's controller (``pytest_configure``), closed at ``pytest_unconfigure``.
_controller_lender = None


def pytest_configure(config):
    """Under pytest-xdist (``-n N``), the controller lends one zygote to every worker (``TFDIST_ZYGOTE_SOCKET``,
    inherited by the workers it starts next): each worker's tasks then fork from a fork of it instead of each
    worker importing TensorFlow in a zygote of its own (~7 CPU-seconds per worker). The controller runs no test
    and never imports TensorFlow itself; its zygote starts when the first worker asks."""
    global _controller_lender
    if os.environ.get("PYTEST_XDIST_WORKER") or not getattr(config.option, "numprocesses", None):
        return
    _controller_lender = _start_lending()


def pytest_unconfigure(config):
    global _controller_lender
    _stop_lending(_controller_lender)
    _controller_lender = None


def _start_lending():
    """This process's zygote lent on a private Unix socket named in ``TFDIST_ZYGOTE_SOCKET``; None when fast
    start is off, forks are impossible, or another process lends one already."""
    import tempfile

    from tfdist import constants
    from tfdist.cluster import zygote

    if not (zygote.fast_start_enabled() and zygote.can_fork()) or constants.ENV_ZYGOTE_SOCKET in os.environ:
        return None
    directory = tempfile.mkdtemp(prefix="tfdist-zygote-")  # 0700: this user's processes only
    lender = zygote.serve_forks(os.path.join(directory, "zygote.sock"))
    os.environ[constants.ENV_ZYGOTE_SOCKET] = lender.path
    return lender


def _stop_lending(lender) -> None:
    if lender is None:
        return
    import shutil

    from tfdist import constants

    os.environ.pop(constants.ENV_ZYGOTE_SOCKET, None)
    lender.close()
    shutil.rmtree(os.path.dirname(lender.path), ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _lent_zygote():
    """With fast start on, processes the tests start (``python -m tfdist.launch``, benchmark scripts, notebook
    kernels) fork their tasks from this process's zygote (``TFDIST_ZYGOTE_SOCKET``; tfdist/cluster/zygote.py
    ``serve_forks``) instead of each importing TensorFlow in a zygote of its own: ~10 CPU-seconds per process.
    Nothing starts until one asks. (Under xdist the controller lends one already: ``pytest_configure``.)"""
    lender = _start_lending()
    try:
        yield
    finally:
        _stop_lending(lender)


@pytest.fixture
def small_tmpfs(tmp_path):
    """``mount(size_bytes) -> path``: a fresh tmpfs of that size (a small disk to fill), unmounted afterwards.

    Root only (``mount``); the test is skipped elsewhere.
    """
    mounted = []

    def mount(size_bytes: int) -> pathlib.Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a small tmpfs needs root")
        target = tmp_path / f"tmpfs-{len(mounted)}"
        target.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(target)],
                              capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(target)
        return target

    yield mount
    for target in reversed(mounted):
        subprocess.run(["umount", "-l", str(target)], capture_output=True, timeout=30)


@pytest.fixture
def compiled_recorder():
    """``factory(strategy, sink_list) -> model``: a tiny compiled Keras model whose
    train/test steps record the ids (labels) of every batch they run on."""
    import keras
    import tensorflow as tf

    class IdRecorder(keras.Model):
        """A tiny model whose train/test steps record the ids (labels) of every batch they run on."""

        def __init__(self, sink):
            super().__init__()
            self.dense = keras.layers.Dense(3)
            self._sink = sink  # a bound method: Keras would copy a list attribute

        def call(self, x):
            return self.dense(x)

        def _record(self, ids):
            tf.py_function(lambda i: self._sink(i.numpy().tolist()) or 0, [ids], tf.int32)

        def train_step(self, data):
            x, ids = data
            self._record(ids)
            return super().train_step((x, ids % 3))

        def test_step(self, data):
            x, ids = data
            self._record(ids)
            return super().test_step((x, ids % 3))


    def compiled_recorder(strategy, trained):
        with strategy.scope():
            model = IdRecorder(trained.extend)
            # jit_compile=False: the py_function that records ids cannot be compiled by XLA
            model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
        return model

    return compiled_recorder


class NotebookRun:
    """A notebook executed by ``run_notebook``, with views on the outputs of its code cells."""

    def __init__(self, nb):
        self.nb = nb
        self.outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]

    @property
    def text(self) -> str:
        """Everything the code cells printed (stream outputs), concatenated in order."""
        return "".join(o.get("text", "") for o in self.outputs)

    def cell_text(self, index: int) -> str:
        """What cell ``index`` (of all cells, markdown included; negative counts from the end) printed."""
        return "".join(o.get("text", "") for o in self.nb.cells[index].get("outputs", []))

    @property
    def errors(self) -> list:
        """The error outputs (empty: ``NotebookClient`` raises on the first error unless told otherwise)."""
        return [o for o in self.outputs if o.get("output_type") == "error"]

    @property
    def has_image(self) -> bool:
        """Whether some cell displayed a PNG image (a matplotlib plot under the inline backend)."""
        return any("image/png" in o.get("data", {}) for o in self.outputs)


@pytest.fixture
def run_notebook(tmp_path, monkeypatch):
    """``run(name, timeout, env=None) -> NotebookRun``: executes ``colab/<name>`` headless.

    The python3 kernel runs in ``tmp_path`` with ``timeout`` seconds per cell.
    Every ``TFDIST_*`` variable but ``TFDIST_FAST_START`` and ``TFDIST_ZYGOTE_SOCKET`` (the zygote
    this process lends), ``TF_CONFIG`` and ``MPLBACKEND`` (so the kernel's inline backend emits PNGs)
    are removed from the environment the kernel inherits, TF's C++ logs are quietened, then ``env``
    is set. With this run's zygote lent (fast start on), the kernel is forked from it
    (``tests/_forked_kernel.py``, kernel spec ``tfdist-forked``) instead of importing TensorFlow anew.
    """
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    kept = ("TFDIST_FAST_START", "TFDIST_ZYGOTE_SOCKET")
    for name in list(os.environ):
        if (name.startswith("TFDIST_") and name not in kept) or name in ("TF_CONFIG", "MPLBACKEND"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")

    kernel_name = "python3"
    if os.environ.get("TFDIST_ZYGOTE_SOCKET"):
        spec = tmp_path / "jupyter" / "kernels" / "tfdist-forked"
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, str(ROOT / "tests" / "_forked_kernel.py"), "-f", "{connection_file}"],
            "display_name": "Python 3 (forked from the tests' zygote)", "language": "python"}))
        monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join(filter(None, [str(tmp_path / "jupyter"),
                                                                          os.environ.get("JUPYTER_PATH")])))
        kernel_name = "tfdist-forked"

    def run(name: str, timeout: float, env: dict | None = None) -> NotebookRun:
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        nb = nbformat.read(COLAB / name, as_version=4)
        client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name=kernel_name,
                                         resources={"metadata": {"path": str(tmp_path)}})
        client.execute()
        return NotebookRun(nb)

    return run
