"""Train a wide-and-deep click-through-rate model with PS-resident embedding tables on synthetic Criteo-like data.

Run alone (an in-process parameter server), a few seconds:

    python examples/train_ctr.py --scale tiny

or on a local cluster (2 parameter servers + 2 workers):

    python -m tfdist.launch --config configs/local_async.yaml examples/train_ctr.py --scale tiny

The data imitate Criteo's display-ads logs: 13 dense features and 26
categorical ones whose ids follow a power law (a few ids are very frequent,
most are rare), with vocabularies from 3 to 3 M ids. ``--scale full`` sums to
10.6 M rows (``--scale small``: 1.06 M, ``tiny``: 10.6 k; a number multiplies
the full vocabularies). Labels come from a hidden logistic model (a weight
per id of every feature plus a linear function of the dense features), so the
task is learnable and the hold-out AUC says how much was learned (the hidden
model's own AUC on the hold-out set is printed with it).

The model is wide and deep: a width-1 table (the wide, linear part) and a
width-``--emb-dim`` table (the deep part, into an MLP with the dense
features), both ``tfdist.layers.ShardedEmbedding``: the rows live on the PS
tasks only (row ``i`` on task ``i % num_ps``) and a step fetches and updates
the rows its batch touches. By default the 26 features share one table per
part, each feature's ids shifted by an offset (``--tables shared``): a step
then costs one lookup and one push per PS task and table, whatever the number
of features. ``--tables per_feature`` builds one table per feature and part
(52 tables: 52 lookups and 52 pushes per step, each to every PS task holding
one of its rows), as one would to give features different widths or
optimizers. Each lookup is its own blocking request, so on 2 cores with an
in-process PS (``--scale tiny``, batch 256) a step takes about 22 ms shared
and 220 ms per feature.

``--tables dynamic`` makes the two shared tables ``tfdist.layers.DynamicEmbedding``:
no vocabulary size; each feature's ids live in their own id space (feature
``f``'s id ``i`` is ``f * 2**40 + i``) and a PS task creates a row when an id
is first trained. ``--capacity`` bounds the rows per PS task (LRU eviction)
and ``--min-count`` admits an id only once it was seen in that many steps.
"""

import argparse
import json
import logging
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np

import tfdist

#: Vocabulary of each categorical feature at ``--scale full``: shaped like Criteo's (a few of millions of ids,
#: many small), 10.56 M rows in all.
FULL_VOCABS = (1460, 583, 3_000_000, 1_500_000, 305, 24, 12517, 633, 3, 93145, 5683, 2_500_000, 3194, 27,
               14992, 1_800_000, 10, 5652, 2173, 4, 1_200_000, 18, 15, 286181, 105, 142572)
NUM_DENSE = 13
SCALES = {"tiny": 1e-3, "small": 0.1, "full": 1.0}
#: Exponent of the power law of the ids (Criteo's frequent ids follow roughly 1.1-1.3).
ZIPF_A = 1.2
EVAL_SEED = 2024


def vocabularies(scale: str) -> list[int]:
    """Vocabulary sizes at ``scale`` (a name of :data:`SCALES` or a multiplier of :data:`FULL_VOCABS`)."""
    mult = SCALES[scale] if scale in SCALES else float(scale)
    if not mult > 0:
        raise SystemExit(f"--scale must be one of {sorted(SCALES)} or a positive multiplier. Received: {scale!r}")
    return [max(min(v, 4), round(v * mult)) for v in FULL_VOCABS]


def _hash_uniform(ids: np.ndarray, feature: int) -> np.ndarray:
    """A fixed pseudo-random weight in [-1, 1) for every (feature, id): the hidden model, with no table to hold."""
    h = ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(((feature + 1) * 0xBF58476D1CE4E5B9) % 2**64)
    h ^= h >> np.uint64(31)
    h *= np.uint64(0x94D049BB133111EB)
    h ^= h >> np.uint64(29)
    return (h >> np.uint64(40)).astype(np.float64) / float(1 << 23) - 1.0


def make_data(vocabs: list[int], n: int, seed: int) -> tuple[dict, np.ndarray, np.ndarray]:
    """``n`` synthetic examples: ``({"categorical", "numeric"}, labels, the hidden model's click probability)``."""
    rng = np.random.default_rng(seed)
    cat = np.stack([(rng.zipf(ZIPF_A, n) - 1) % v for v in vocabs], axis=1).astype(np.int64)
    dense = rng.standard_normal((n, NUM_DENSE)).astype(np.float32)
    dense_weights = np.random.default_rng(7).normal(0.0, 0.35, NUM_DENSE)
    logit = -1.0 + dense @ dense_weights
    for f in range(len(vocabs)):
        logit += 0.35 * _hash_uniform(cat[:, f], f)
    p = 1.0 / (1.0 + np.exp(-logit))
    y = (rng.random(n) < p).astype(np.float32)
    return {"categorical": cat, "numeric": dense}, y, p


@keras.saving.register_keras_serializable(package="train_ctr")
class FeatureOffsets(keras.layers.Layer):
    """Shifts feature ``f``'s ids by the sum of the vocabularies before it: 26 id spaces become one table's rows."""

    def __init__(self, vocabs, **kwargs):
        super().__init__(**kwargs)
        self.vocabs = [int(v) for v in vocabs]
        self._offsets = np.concatenate([[0], np.cumsum(self.vocabs)[:-1]]).astype(np.int64)

    def call(self, ids):
        return keras.ops.add(keras.ops.cast(ids, "int64"), keras.ops.convert_to_tensor(self._offsets))

    def get_config(self):
        return {**super().get_config(), "vocabs": self.vocabs}


@keras.saving.register_keras_serializable(package="train_ctr")
class FeatureSpaces(keras.layers.Layer):
    """Gives feature ``f``'s ids their own id space of a dynamic table: ``f * 2**40 + id``."""

    def call(self, ids):
        spaces = np.arange(ids.shape[-1], dtype=np.int64) << 40
        return keras.ops.add(keras.ops.cast(ids, "int64"), keras.ops.convert_to_tensor(spaces))


def dynamic_tables(capacity: int | None = None, min_count: int = 1):
    """An ``embedding`` for :func:`make_model`: ``DynamicEmbedding`` (the vocabulary size is not used)."""
    def embedding(rows, dim, seed=0, name=None):
        return tfdist.layers.DynamicEmbedding(dim, seed=seed, name=name, capacity=capacity, min_count=min_count)

    return embedding


def make_model(vocabs: list[int], emb_dim: int, tables: str, hidden=(128, 64), keras_module=None, embedding=None,
               feature_offsets=None):
    """Wide and deep: a width-1 table (wide) and a width-``emb_dim`` table (deep, into an MLP with the dense features).

    ``keras_module``, ``embedding`` and ``feature_offsets`` default to Keras 3,
    ``tfdist.layers.ShardedEmbedding`` and :class:`FeatureOffsets`;
    ``benchmarks/ctr_throughput.py`` passes tf-keras and its ``Embedding`` to
    build the same model for TF's ParameterServerStrategy. ``embedding`` is
    called as ``embedding(rows, dim, seed=..., name=...)``, ``feature_offsets``
    as ``feature_offsets(vocabs, name=...)``.
    """
    k = keras_module or keras
    embedding = embedding or (dynamic_tables() if tables == "dynamic" else tfdist.layers.ShardedEmbedding)
    feature_offsets = feature_offsets or FeatureOffsets
    cat = k.Input((len(vocabs),), dtype="int64", name="categorical")
    dense = k.Input((NUM_DENSE,), name="numeric")
    if tables in ("shared", "dynamic"):
        ids = (FeatureSpaces(name="feature_spaces")(cat) if tables == "dynamic"
               else feature_offsets(vocabs, name="feature_offsets")(cat))
        total = sum(vocabs)
        wide = embedding(total, 1, seed=1, name="wide_table")(ids)  # (B, 26, 1)
        deep = embedding(total, emb_dim, seed=2, name="deep_table")(ids)  # (B, 26, D)
        wide = k.layers.Flatten()(wide)
        deep = k.layers.Flatten()(deep)
    else:
        wides, deeps = [], []
        for f, v in enumerate(vocabs):
            ids_f = k.layers.Lambda(lambda x, f=f: x[:, f], name=f"feature_{f:02d}")(cat)
            wides.append(embedding(v, 1, seed=100 + f, name=f"wide_{f:02d}")(ids_f))
            deeps.append(embedding(v, emb_dim, seed=200 + f, name=f"deep_{f:02d}")(ids_f))
        wide = k.layers.Concatenate()(wides)
        deep = k.layers.Concatenate()(deeps)
    wide_logit = k.layers.Add()([
        k.layers.Dense(1, use_bias=False, kernel_initializer="zeros", name="wide_sum")(wide),
        k.layers.Dense(1, name="wide_dense")(dense)])
    x = k.layers.Concatenate()([deep, dense])
    for width in hidden:
        x = k.layers.Dense(width, activation="relu")(x)
    deep_logit = k.layers.Dense(1, name="deep_logit")(x)
    logit = k.layers.Add()([wide_logit, deep_logit])
    out = k.layers.Activation("sigmoid", name="click")(logit)
    return k.Model({"categorical": cat, "numeric": dense}, out, name="wide_and_deep")


def _auc(y: np.ndarray, score: np.ndarray) -> float:
    """ROC AUC by ranks (the hidden model's, to compare the trained model with)."""
    order = np.argsort(score, kind="mergesort")
    ranks = np.empty(len(score))
    ranks[order] = np.arange(1, len(score) + 1)
    pos = y > 0.5
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / max(n_pos * n_neg, 1))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", default="small", help=f"{'|'.join(SCALES)} or a multiplier of the full vocabularies "
                   "(full: 10.6 M rows). Defaults to small.")
    p.add_argument("--steps", type=int, default=200, help="steps per epoch on each worker")
    p.add_argument("--batch", type=int, default=256, help="examples per step on each worker")
    p.add_argument("--epochs", type=int, default=2, help="passes over each worker's examples")
    p.add_argument("--emb-dim", type=int, default=16, help="width of the deep table")
    p.add_argument("--tables", default="shared", choices=["shared", "per_feature", "dynamic"],
                   help="one table per part with per-feature offsets (shared), one per feature and part, or one "
                   "DynamicEmbedding per part")
    p.add_argument("--capacity", type=int, help="--tables dynamic: rows per PS task at most (LRU eviction)")
    p.add_argument("--min-count", type=int, default=1, help="--tables dynamic: steps an id needs before its row")
    p.add_argument("--learning-rate", type=float, default=0.05, help="Adagrad's, for the tables and the MLP")
    p.add_argument("--eval-examples", type=int, default=8192)
    p.add_argument("--metrics-out", help="the chief writes its history, hold-out metrics and table counters "
                   "here (JSON)")
    p.add_argument("--save", help="the chief saves the trained model here (.keras; the tables gathered from the PS). "
                   "Load it in plain Keras after `import tfdist.layers` and importing this file (they register "
                   "ShardedEmbedding and FeatureOffsets) with keras.saving.load_model(path, compile=False)")
    p.add_argument("--eval-interval", type=float, default=5.0,
                   help="evaluator task: seconds between two evaluations of the PS values")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    strategy = tfdist.ParameterServerStrategy()  # on a ps task this serves until the job ends, then exits
    vocabs = vocabularies(args.scale)
    x_eval, y_eval, p_eval = make_data(vocabs, args.eval_examples, EVAL_SEED)
    if strategy.is_chief:
        rows = sum(vocabs)
        table_mb = rows * (args.emb_dim + 1) * 4 / 1e6
        print(f"data: {len(vocabs)} categorical features ({rows:,} ids in all, largest {max(vocabs):,}), "
              f"{NUM_DENSE} dense; tables: {table_mb:,.1f} MB of rows on {len(strategy.config.cluster.ps)} PS "
              f"task(s); hidden model's hold-out AUC {_auc(y_eval, p_eval):.4f}", flush=True)

    with strategy.scope():
        model = make_model(vocabs, args.emb_dim, args.tables,
                           embedding=dynamic_tables(args.capacity, args.min_count) if args.tables == "dynamic" else None)
        model.compile(optimizer=keras.optimizers.Adagrad(args.learning_rate), loss="binary_crossentropy",
                      metrics=[keras.metrics.AUC(name="auc")])
    if strategy.is_evaluator:  # side-car evaluation of the PS values while the workers train
        for version in strategy.evaluation_rounds(interval_s=args.eval_interval):
            loss, auc = model.evaluate(x_eval, y_eval, batch_size=1024, verbose=0)
            print(f"evaluator: PS version {version}: hold-out AUC {auc:.4f} (loss {loss:.4f})", flush=True)
        return

    me = strategy.worker_id
    x, y, _ = make_data(vocabs, args.steps * args.batch, seed=1000 + me)  # each worker its own examples
    t0 = time.perf_counter()
    callbacks = [tfdist.callbacks.LeaveOnTrainEnd()]
    if args.tables == "dynamic":  # rows, creations, evictions, refused ids per table in the logs
        callbacks.insert(0, tfdist.callbacks.DynamicTableLogs())
    history = model.fit(x, y, batch_size=args.batch, epochs=args.epochs, verbose=2, callbacks=callbacks)
    train_s = time.perf_counter() - t0
    strategy.pull()
    loss, auc = model.evaluate(x_eval, y_eval, batch_size=1024, verbose=0)
    stats = strategy.sync_stats
    print(f"worker {me}: hold-out AUC {auc:.4f} (loss {loss:.4f}) after {args.epochs * args.steps} steps "
          f"in {train_s:.1f} s; rows pulled {stats.get('rows_pulled', 0):,}, pushed {stats.get('rows_pushed', 0):,}",
          flush=True)
    if not strategy.is_chief:
        return
    ps = strategy.ps_status()
    for t in strategy.tables():
        if t.get("dynamic") is not None:
            held = [s["tables"][t["key"]] for s in ps]
            print(f"dynamic table {t['key']}: {sum(h['rows'] for h in held):,} rows x {t['dim']} (per PS task "
                  f"{[h['rows'] for h in held]}), created {sum(h['created'] for h in held):,}, evicted "
                  f"{sum(h['evicted'] for h in held):,}, not admitted {sum(h['not_admitted'] for h in held):,}")
            continue
        print(f"table {t['key']}: {t['rows']:,} rows x {t['dim']}, rows per PS task {t['rows_per_task']}, "
              f"row optimizer {t['optimizer']['kind']}")
    print("PS bytes in/out: " + ", ".join(f"ps:{i} {s['stats']['bytes_in'] / 1e6:.1f}/{s['stats']['bytes_out'] / 1e6:.1f} MB"
                                        for i, s in enumerate(ps)))
    if args.metrics_out:
        with open(args.metrics_out, "w") as f:
            json.dump({"history": history.history, "holdout": {"loss": loss, "auc": auc,
                                                              "hidden_model_auc": _auc(y_eval, p_eval)},
                       "train_seconds": train_s, "steps": args.epochs * args.steps, "rows": sum(vocabs),
                       "tables": strategy.tables(), "sync_stats": stats,
                       "ps_stats": [s["stats"] for s in ps]}, f)
    if args.save:
        model.save(args.save)
        print(f"saved model to {args.save}")
    assert np.isfinite(loss)


if __name__ == "__main__":
    main()
