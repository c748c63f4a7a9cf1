"""The cause of the hang at the end of ``fit`` / at exit, reproduced deterministically (issue #27 item 1).

A ``fit`` stopped early left Keras's epoch iterator, with its live ``tf.data``
iterator, in a reference cycle; the garbage collector then freed it on
whichever thread allocated — under tfdist, an inter-op thread running one of
the step's ``tf.py_function`` ops, where the iterator's destructor waits for a
free inter-op thread forever (``~IteratorResource`` → ``~PrefetchDatasetOp::Iterator``
→ ``~LogicalThreadWrapper`` → ``WaitForNotification``, the stack in the
report). ``scripts/early_stop_gc_worker.py`` makes it certain: one inter-op
thread, and the collection run in a ``tf.py_function`` after ``fit`` returned.
Before the fix (``tfdist.strategies._keras_iterators``) the script hung until
its 60 s faulthandler bound (exit 1), under both strategies; now ``fit``
releases its iterators on the calling thread, none is left for the collector.
Real processes (one each), real Keras ``fit``.
"""

import json
import os
import sys

import pytest

from tfdist.testing import run_python

pytestmark = pytest.mark.timeout(200)


@pytest.mark.parametrize("mode", ["ps", "allreduce"])
def test_fit_stopped_early_leaves_no_iterator_for_the_collector_on_an_inter_op_thread(scripts_dir, mode):
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TFDIST_CONFIG")}
    proc = run_python([sys.executable, os.path.join(scripts_dir, "early_stop_gc_worker.py"), mode], env,
                      timeout=150)
    assert proc.returncode == 0, proc.stderr[-4000:]  # before: exit 1 after 60 s, stuck in ~IteratorResource
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["steps"] == 1  # fit did stop early, in its first epoch
    assert result["iterators_alive_after_fit"] == 0  # before: Keras's iterators waited for the collector
    assert result["collected_on_an_inter_op_thread"] > 0  # and the collector did run there
