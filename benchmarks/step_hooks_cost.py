"""What the hooks around a training step cost in themselves: the floor under a tfdist worker's added CPU per step.

Issue #23 item 1 asks a tfdist worker to add at most 1.5 ms of CPU per step
to plain Keras. Before the exchange itself, a step of the update path pays
for its hooks: a ``tf.py_function`` before the step (``begin_step``), one
after it that receives every variable (``end_step``), and the graph ops that
add an overlapped exchange's corrections to the variables. This measures
those mechanisms alone, in one process, on the benchmark MLP's variables
(784-256-256-10, 1.03 MiB of float32), with no training and no exchange: a
``tf.function`` call of each graph variant below, ``--calls`` times, its CPU
(all threads, ``time.process_time``) and wall per call, in one run:

* ``call``: a ``tf.function`` that reads one element (the price of calling
  a compiled step at all, which plain Keras pays too);
* ``+ begin``: ``+`` a ``py_function`` with no inputs (tfdist's begin hook);
* ``+ end(inputs)``: ``+`` a ``py_function`` that gets the 6 variables;
* ``+ end(inputs, 7 outputs)``: the same returning statistics and one
  (empty) correction per variable (tfdist before 2026-11-28);
* ``+ … + 6 conditions``: and one ``tf.cond`` per variable adding it;
* ``+ end(inputs, 2 outputs) + 1 condition``: statistics and one flat
  correction, one ``tf.cond`` (tfdist since 2026-11-28, ``FlatLayout``).

Usage: ``python benchmarks/step_hooks_cost.py [--calls N] [--passes N] [--out FILE]``.
One TensorFlow intra-op thread (as a local launch gives each of two
workers on two cores). Prints JSON; medians over the passes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import _common  # noqa: E402

SHAPES = [(784, 256), (256,), (256, 256), (256,), (256, 10), (10,)]


def variants():
    import numpy as np
    import tensorflow as tf

    vs = [tf.Variable(np.zeros(s, np.float32)) for s in SHAPES]
    stats = np.zeros(5, np.float32)
    empty = [np.zeros((0,), np.float32) for _ in vs]

    def begin():
        return np.int64(0)

    def end(*ts):
        [np.asarray(t) for t in ts]
        return np.float32(0)

    def end7(*ts):
        [np.asarray(t) for t in ts]
        return [stats, *empty]

    def end2(*ts):
        [np.asarray(t) for t in ts]
        return [stats, empty[0]]

    def began():
        return tf.py_function(begin, [], tf.int64)

    def add(v, c):
        return tf.cond(tf.size(c) > 0, lambda: tf.group(v.assign_add(tf.reshape(c, tf.shape(v)))), tf.no_op)

    @tf.function
    def call():
        return tf.add(vs[0][0, 0], 1.0)

    @tf.function
    def with_begin():
        with tf.control_dependencies([began()]):
            return tf.add(vs[0][0, 0], 1.0)

    @tf.function
    def with_end():
        with tf.control_dependencies([began()]):
            return tf.py_function(end, [v.read_value() for v in vs], tf.float32)

    @tf.function
    def with_end7():
        with tf.control_dependencies([began()]):
            out = tf.py_function(end7, [v.read_value() for v in vs], [tf.float32] * 7)
        return out[0]

    @tf.function
    def with_end7_conds():
        with tf.control_dependencies([began()]):
            out = tf.py_function(end7, [v.read_value() for v in vs], [tf.float32] * 7)
        with tf.control_dependencies([add(v, c) for v, c in zip(vs, out[1:])]):
            return tf.identity(out[0])

    @tf.function
    def with_end2_cond():
        with tf.control_dependencies([began()]):
            s, flat = tf.py_function(end2, [v.read_value() for v in vs], [tf.float32, tf.float32])

        def add_all():
            ops, start = [], 0
            for v in vs:
                n = int(np.prod(v.shape))
                ops.append(v.assign_add(tf.reshape(tf.slice(flat, [start], [n]), v.shape)))
                start += -(-n // 16) * 16
            return tf.group(ops)

        with tf.control_dependencies([tf.cond(tf.size(flat) > 0, add_all, tf.no_op)]):
            return tf.identity(s)

    return {"call": call, "+ begin": with_begin, "+ end(inputs)": with_end,
            "+ end(inputs, 7 outputs)": with_end7, "+ end(inputs, 7 outputs) + 6 conditions": with_end7_conds,
            "+ end(inputs, 2 outputs) + 1 condition": with_end2_cond}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--out")
    args = p.parse_args()
    fns = variants()
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in fns}
    for n in range(args.passes):
        order = list(fns) if n % 2 == 0 else list(reversed(fns))
        for name in order:
            fn = fns[name]
            for _ in range(50):
                fn()
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(args.calls):
                fn()
            runs[name].append((1e6 * (time.process_time() - cpu) / args.calls,
                               1e6 * (time.perf_counter() - wall) / args.calls))
    result = {"benchmark": "step_hooks_cost", "machine": _common.machine(), "git": _common.git_info(ROOT),
              "versions": _common.package_versions(), "calls": args.calls, "passes": args.passes,
              "cpu_us_per_call": {k: round(statistics.median(c for c, _ in v), 1) for k, v in runs.items()},
              "wall_us_per_call": {k: round(statistics.median(w for _, w in v), 1) for k, v in runs.items()},
              "cpu_us_per_pass": {k: [round(c, 1) for c, _ in v] for k, v in runs.items()}}
    base = result["cpu_us_per_call"]["call"]
    result["added_cpu_us_over_call"] = {k: round(v - base, 1) for k, v in result["cpu_us_per_call"].items()}
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
