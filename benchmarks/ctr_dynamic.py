"""CTR model with dynamic tables vs fixed tables on ids that collide under ``id % rows`` (issue #24, item 5).

Prints one JSON document. The CTR example's wide-and-deep model
(``examples/train_ctr.py``) and data, with each categorical id renamed to a
63-bit id (a hash of feature and id, as real id spaces are: user ids,
crossed features, hashed strings). Two tables per model, trained with the
same stream, in one process (``tfdist.ParameterServerStrategy()``, its PS in
process), interleaved passes (fixed, dynamic, fixed, dynamic, ...):

* ``fixed`` — ``tfdist.layers.ShardedEmbedding`` tables of ``--rows`` rows
  read at ``id % rows`` (what a fixed table does with unbounded ids:
  different ids share a row);
* ``dynamic`` — ``tfdist.layers.DynamicEmbedding`` tables: a row per id.

Reports examples/s over the timed steps (after ``--warmup`` steps) and the
hold-out AUC (the hidden logistic model's own AUC with it), and the
ratios dynamic / fixed. The issue's bar: examples/s at least 0.8x, AUC no
worse.

Usage::

    python benchmarks/ctr_dynamic.py [--quick] [--scale small] [--rows 65536] [--steps 300] [--batch 256]
        [--passes 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

import keras
import numpy as np
import train_ctr

import tfdist
from tfdist.ps.dynamic import hash64


def rename(cat: np.ndarray) -> np.ndarray:
    """Feature ``f``'s id ``i`` becomes a 63-bit id (a hash of both): ids as unbounded id spaces give them."""
    features = np.arange(cat.shape[1], dtype=np.uint64)[None, :] << np.uint64(40)
    return (hash64(cat.astype(np.uint64) | features) >> np.uint64(1)).astype(np.int64)


@keras.saving.register_keras_serializable(package="ctr_dynamic")
class ModRows(keras.layers.Layer):
    """``id % rows``: the row of a fixed table an unbounded id is folded into."""

    def __init__(self, rows: int, **kwargs):
        super().__init__(**kwargs)
        self.rows = int(rows)

    def call(self, ids):
        return keras.ops.mod(keras.ops.cast(ids, "int64"), self.rows)

    def get_config(self):
        return {**super().get_config(), "rows": self.rows}


class StepTimer(keras.callbacks.Callback):
    def __init__(self, warmup: int):
        super().__init__()
        self.warmup, self.start, self.end, self.steps = warmup, None, None, 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.steps == self.warmup:
            self.start = time.perf_counter()
        self.end = time.perf_counter()


def one_pass(kind: str, vocabs, x, y, x_eval, y_eval, args) -> dict:
    keras.backend.clear_session()
    strategy = tfdist.ParameterServerStrategy()
    try:
        with strategy.scope():
            if kind == "fixed":
                model = train_ctr.make_model(
                    vocabs, args.emb_dim, "shared",
                    embedding=lambda rows, dim, seed=0, name=None: tfdist.layers.ShardedEmbedding(
                        args.rows, dim, seed=seed, name=name),
                    feature_offsets=lambda vocabs, name=None: ModRows(args.rows, name=name))
            else:
                model = train_ctr.make_model(vocabs, args.emb_dim, "dynamic")
            model.compile(optimizer=keras.optimizers.Adagrad(args.learning_rate), loss="binary_crossentropy",
                          metrics=[keras.metrics.AUC(name="auc")])
        timer = StepTimer(args.warmup)
        model.fit(x, y, batch_size=args.batch, epochs=1, shuffle=False, verbose=0, callbacks=[timer])
        timed = timer.steps - args.warmup
        _, auc = model.evaluate(x_eval, y_eval, batch_size=1024, verbose=0)
        rows = sum(t["rows"] for t in strategy.ps_status()[0]["tables"].values())
        return {"kind": kind, "examples_per_s": round(timed * args.batch / (timer.end - timer.start), 1),
                "auc": round(float(auc), 4), "rows_held": rows}
    finally:
        strategy.shutdown()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--scale", default="small")
    p.add_argument("--rows", type=int, default=65536, help="rows of each fixed table (ids are folded by id % rows)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--emb-dim", type=int, default=16)
    p.add_argument("--learning-rate", type=float, default=0.05)
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--eval-examples", type=int, default=16384)
    p.add_argument("--out")
    args = p.parse_args(argv)
    if args.quick:
        args.scale, args.steps, args.warmup, args.passes, args.eval_examples = "tiny", 40, 5, 1, 2048
    vocabs = train_ctr.vocabularies(args.scale)
    x, y, _ = train_ctr.make_data(vocabs, args.steps * args.batch, seed=1000)
    x_eval, y_eval, p_eval = train_ctr.make_data(vocabs, args.eval_examples, train_ctr.EVAL_SEED)
    distinct = len(np.unique(rename(x["categorical"])))
    x["categorical"], x_eval["categorical"] = rename(x["categorical"]), rename(x_eval["categorical"])
    runs = []
    for _ in range(args.passes):
        for kind in ("fixed", "dynamic"):
            runs.append(one_pass(kind, vocabs, x, y, x_eval, y_eval, args))
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)

    def summary(kind):
        mine = [r for r in runs if r["kind"] == kind]
        return {"examples_per_s": [r["examples_per_s"] for r in mine], "auc": [r["auc"] for r in mine],
                "rows_held": mine[-1]["rows_held"]}

    fixed, dynamic = summary("fixed"), summary("dynamic")
    result = {
        "benchmark": "ctr_dynamic", "python": platform.python_version(), "cpus": os.cpu_count(),
        "argv": sys.argv[1:] if argv is None else argv, "scale": args.scale, "steps": args.steps,
        "batch": args.batch, "fixed_rows_per_table": args.rows, "distinct_training_ids": distinct,
        "hidden_model_auc": round(train_ctr._auc(y_eval, p_eval), 4), "fixed": fixed, "dynamic": dynamic,
        "examples_per_s_ratio": round(statistics.median(dynamic["examples_per_s"])
                                      / statistics.median(fixed["examples_per_s"]), 3),
        "auc_difference": round(statistics.median(dynamic["auc"]) - statistics.median(fixed["auc"]), 4),
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
