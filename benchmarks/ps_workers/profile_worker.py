"""One training process of ``benchmarks/exchange_profile.py``: CPU per step, and where the exchange's goes.

Trains the benchmark model (``benchmarks/_common.py``) for ``--warmup +
--steps`` steps and measures, over the ``--steps`` after the warm-up:

* the process's CPU time per step (all threads, as ``time.process_time``);
* with ``--mode tfdist``, the CPU time (``time.thread_time`` of the thread
  that ran it) spent per step inside the exchange's parts: the end-of-step
  ``tf.py_function`` and what it calls (the update, the folding of fresh
  values into the variables), the background exchange and its RPCs (encode,
  the transport: the stream or gRPC, decode, reply parsing). Parts nest: a part's time includes the parts
  it calls (the JSON lists which part is inside which).

The parts are measured by wrapping the functions named in ``PARTS`` in this
process only; the library is not changed. The wrappers cost a few
microseconds per call, which the plain run does not pay.

Usage: profile_worker.py --mode plain|tfdist --model mlp|cnn --out FILE_OR_DIR [--warmup N] [--steps N]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks import _common

#: part name -> (module, attribute path, the part it runs inside).
PARTS = {
    "end_of_step py_function": (None, None, None),
    "end_step (count, delta)": ("tfdist.strategies._update_path", "UpdatePathRuntime.end_step", "end_of_step py_function"),
    "fold fresh values into variables": ("tfdist.strategies._variable_registry", "VariableRegistry.add",
                                         "end_step (count, delta)"),
    "background exchange": ("tfdist.ps.update_session", "UpdateSession._exchange_in_background", None),
    "build requests": ("tfdist.ps.session", "WorkerSession._push_requests", "background exchange"),
    "row-sparse check": ("tfdist.ps.session", "_row_sparse", "build requests"),
    "the RPCs to every task (encode, transport, decode)": ("tfdist.ps.client", "PSClient.call_many",
                                                            "background exchange"),
    "encode": ("tfdist.wire", "encode_chunks", "the RPCs to every task (encode, transport, decode)"),  # (wire.encode calls it)
    "decode": ("tfdist.wire", "decode", "the RPCs to every task (encode, transport, decode)"),
    "parse replies": ("tfdist.ps.client", "parse_reply", "background exchange"),
    "begin_step py_function": (None, None, None),
}


def _install(acc: collections.Counter, on: list) -> None:
    import importlib

    import tensorflow as tf

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            if not on[0]:
                return fn(*args, **kwargs)
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[name] += time.thread_time() - start
        return wrapper

    for part, (module, attr, _) in PARTS.items():
        if module is None:
            continue
        owner = importlib.import_module(module)
        *path, name = attr.split(".")
        for p in path:
            owner = getattr(owner, p)
        setattr(owner, name, timed(part, getattr(owner, name)))
    original = tf.py_function
    names = {"tfdist_end_update_step": "end_of_step py_function", "tfdist_begin_step": "begin_step py_function"}

    def py_function(func, inp, Tout, name=None):
        return original(timed(names.get(name, f"py_function {name}"), func), inp, Tout, name=name)

    tf.py_function = py_function


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", required=True, choices=["plain", "tfdist"])
    p.add_argument("--model", required=True, choices=sorted(_common.MODELS))
    p.add_argument("--out", required=True)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--steps", type=int, default=400)
    args = p.parse_args()
    import keras

    acc: collections.Counter = collections.Counter()
    on = [False]
    strategy, worker_id = None, 0
    if args.mode == "tfdist":
        _install(acc, on)
        import tfdist

        strategy = tfdist.ParameterServerStrategy()
        worker_id = strategy.worker_id
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        model = _common.make_model(keras, args.model)
        _common.compile_model(keras, model)
    ds = _common.synthetic_dataset(args.model, _common.BATCH, seed=worker_id)
    first, last = args.warmup - 1, args.warmup + args.steps - 1
    marks = {}

    class Window(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch in (first, last):
                marks[batch] = (time.process_time(), time.perf_counter(), time.time())
                on[0] = batch == first

    model.fit(ds, epochs=1, steps_per_epoch=last + 1, verbose=0, callbacks=[Window()])
    (c0, t0, w0), (c1, t1, w1) = marks[first], marks[last]
    result = {"mode": args.mode, "model": args.model, "worker_id": worker_id, "steps": args.steps,
              "cpu_ms_per_step": 1e3 * (c1 - c0) / args.steps, "wall_ms_per_step": 1e3 * (t1 - t0) / args.steps,
              "wall_window": [w0, w1], "params": int(model.count_params())}
    if strategy is not None:
        result["parts_ms_per_step"] = {k: 1e3 * acc[k] / args.steps for k in PARTS if k in acc}
        result["part_inside"] = {k: v[2] for k, v in PARTS.items() if v[2]}
        result["sync_stats"] = strategy.sync_stats
        out = os.path.join(args.out, f"worker-{worker_id}.json")
    else:
        out = args.out
    _common.write_result(out, result)
    if strategy is not None:
        strategy.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
