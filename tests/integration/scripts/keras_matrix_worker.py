"""Worker script of the Keras-conventions matrix (issue #15): every common Keras feature under every strategy.

Usage: keras_matrix_worker.py --out DIR [--modes all_reduce,async,ssp,dtssp,bsp,sync_replicas,lone]

Runs in each of the 2 worker processes of a ``LocalCluster(workers=2, ps=7)``.
The strategies run one after the other in this process, each on a job of its
own: ``AllReduceStrategy`` first (TF's collectives must be configured before
the process runs any TF op), then each PS mode with one PS task of the
cluster to itself (``cluster={"worker": ..., "ps": [ps_i]}``), so one cluster
start-up serves the whole matrix. Per mode, on a small model (Normalization →
Dense → Dense) on digits:

* input types: numpy arrays, a repeated ``tf.data`` with ``steps_per_epoch``,
  a ``keras.utils.PyDataset``, ``distribute_datasets_from_function``;
* callbacks in one ``fit`` with validation: ModelCheckpoint (best only),
  BackupAndRestore, EarlyStopping(restore_best_weights), TensorBoard,
  ReduceLROnPlateau, LearningRateScheduler, CSVLogger;
* round trips: evaluate, predict, ``model.save`` + ``load_model``;
* a stateful preprocessing layer (``Normalization``) adapted on the chief only;
* a functional model with two inputs and two outputs (dict inputs, per-output
  losses, loss weights and metrics, BatchNormalization, Dropout) and AdamW:
  ``fit`` with ``validation_split`` and per-output sample weights,
  ``evaluate(return_dict=True)``, ``predict``, ``train_on_batch`` /
  ``test_on_batch`` / ``predict_on_batch`` (the same results as plain Keras
  gives: no ``ps_*`` statistics in the list), save and ``load_model``;
* a custom training loop in the tf.distribute style: ``experimental_distribute_dataset``,
  ``strategy.run`` of a step that applies its gradients with
  ``optimizer.apply_gradients`` (the optimizer built by that first call),
  ``strategy.reduce`` of the loss;
* PS modes: tables (a ``ShardedEmbedding`` and a ``keras.layers.Embedding``
  above ``ps.resident_threshold_bytes``, both PS-resident, and a small
  replicated ``Embedding``): fit, evaluate, predict, save, and the saved
  model loaded into plain Keras outside the strategy.

Mode ``lone``: each worker process is the only worker of a job of its own
(``ParameterServerStrategy`` with one worker and one PS task: the lone-worker
path, README "How it works"), the two jobs side by side.

Writes ``<out>/<mode>-worker-<id>.json`` with what the test asserts, or the
error of the first case that failed (``"error"``, with its traceback).
"""

import argparse
import glob
import json
import os
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tfdist  # noqa: E402  (no TF op before AllReduceStrategy joins the collective group)

STEPS, BATCH, EPOCHS, LR = 6, 32, 3, 1e-2
#: The tables case: a ShardedEmbedding and a keras.layers.Embedding over ps.resident_threshold_bytes (both on
#: the PS), and a small Embedding under it (replicated).
VOCAB, RESIDENT_THRESHOLD = 200, 4096


def make_strategy(mode, cluster, me, token, ps_index):
    if mode == "all_reduce":  # no init_worker_group() in this script: the strategy joins the job's group itself
        return tfdist.AllReduceStrategy()
    if mode == "lone":  # a job of its own per worker process: one worker, one PS task
        return tfdist.ParameterServerStrategy(
            cluster={"worker": [cluster["worker"][me]], "ps": [cluster["ps"][ps_index + me]]}, task="worker:0",
            token=token, config={"ps": {"resident_threshold_bytes": RESIDENT_THRESHOLD}})
    one = dict(cluster={"worker": cluster["worker"], "ps": [cluster["ps"][ps_index]]}, task=f"worker:{me}",
               token=token, config={"ps": {"resident_threshold_bytes": RESIDENT_THRESHOLD}})
    return {
        "async": lambda: tfdist.ParameterServerStrategy(**one),
        "ssp": lambda: tfdist.SSPStrategy(staleness=2, **one),
        "dtssp": lambda: tfdist.DTSSPStrategy(min_staleness=1, max_staleness=4, **one),
        "bsp": lambda: tfdist.BSPStrategy(**one),
        "sync_replicas": lambda: tfdist.SyncReplicasStrategy(replicas_to_aggregate=2, **one),
    }[mode]()


def run_mode(mode, strategy, out, me, data):
    """Every case under one strategy; ``me`` is this process's worker index (the file names, the data shard)."""
    import keras
    import numpy as np
    import tensorflow as tf

    class Digits(keras.utils.PyDataset):
        def __init__(self, x, y, **kwargs):
            super().__init__(**kwargs)
            self.x, self.y = x, y

        def __len__(self):
            return STEPS

        def __getitem__(self, i):
            return self.x[i * BATCH:(i + 1) * BATCH], self.y[i * BATCH:(i + 1) * BATCH]

    x, y = data.x_train.reshape(-1, 64), data.y_train
    job_me = 0 if mode == "lone" else me  # the worker's index in its job
    xs, ys = x[me::2], y[me::2]
    xt, yt = data.x_test.reshape(-1, 64), data.y_test
    work = os.path.join(out, f"{mode}-{me}")
    os.makedirs(work, exist_ok=True)
    start = time.monotonic()
    result = {"mode": mode, "worker": me, "cases": {}}
    cases = result["cases"]

    tables_model = build_tables_model(strategy) if hasattr(strategy, "tables") else None
    multi_io_model = build_multi_io_model(strategy)  # every model is built before the job's first step
    keras.utils.set_random_seed(6)
    with strategy.scope():
        loop_model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"),
                                       keras.layers.Dense(10)], name="loop_model")
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Normalization(name="norm"),
                                  keras.layers.Dense(16, activation="relu", name="hidden"),
                                  keras.layers.Dense(10, activation="softmax", name="out")], name="model")
        if job_me == 0:  # stateful preprocessing: only the chief adapts; its statistics become the job's
            model.get_layer("norm").adapt(x)
        model.compile(keras.optimizers.Adam(LR, name="adam"), "sparse_categorical_crossentropy",
                      metrics=["accuracy"])

    def fitted(name, history):
        cases[name] = {"loss": [float(v) for v in history.history["loss"]],
                       "epochs": len(history.history["loss"])}

    # Input types (the same number of steps on both workers: the sync modes step together).
    fitted("numpy", model.fit(xs[:STEPS * BATCH], ys[:STEPS * BATCH], batch_size=BATCH, epochs=1, verbose=0))
    ds = tf.data.Dataset.from_tensor_slices((xs, ys)).shuffle(256, seed=me).repeat().batch(BATCH)
    fitted("tf_data_steps", model.fit(ds, steps_per_epoch=STEPS, epochs=1, verbose=0))
    fitted("py_dataset", model.fit(Digits(xs, ys), epochs=1, verbose=0))

    def dataset_fn(ctx):
        cases["input_context"] = {"pipelines": ctx.num_input_pipelines, "id": ctx.input_pipeline_id,
                                  "per_replica_batch": ctx.get_per_replica_batch_size(2 * BATCH)}
        d = tf.data.Dataset.from_tensor_slices((x, y)).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        return d.repeat().batch(ctx.get_per_replica_batch_size(2 * BATCH))

    dist = strategy.distribute_datasets_from_function(dataset_fn)
    fitted("datasets_from_function", model.fit(dist, steps_per_epoch=STEPS, epochs=1, verbose=0))

    # The common callbacks, together in one fit with validation, on the same paths on every worker of the job
    # (as the tutorials write them): the chief's files are the job's, the others write to temporary places.
    shared = work if mode == "lone" else os.path.join(out, f"{mode}-shared")  # "lone": a job per worker
    os.makedirs(shared, exist_ok=True)
    best = os.path.join(shared, "best.keras")
    lr_seen = []
    callbacks = [
        keras.callbacks.ModelCheckpoint(best, monitor="val_loss", save_best_only=True),
        keras.callbacks.BackupAndRestore(os.path.join(shared, "backup")),
        keras.callbacks.EarlyStopping("val_loss", patience=EPOCHS, restore_best_weights=True),
        keras.callbacks.TensorBoard(os.path.join(shared, "tb")),
        # never an improvement after the first epoch (min_delta): halves the rate at every later epoch end
        keras.callbacks.ReduceLROnPlateau("loss", factor=0.5, patience=0, min_delta=100.0),
        keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr_seen.append(float(lr)) or lr * 0.9),
        keras.callbacks.CSVLogger(os.path.join(shared, "log.csv")),
    ]
    history = model.fit(ds, steps_per_epoch=STEPS, epochs=EPOCHS, validation_data=(xt, yt), verbose=0,
                        callbacks=callbacks)
    val = [float(v) for v in history.history["val_loss"]]
    stop = callbacks[2]
    predictions = model.predict(xt, verbose=0)  # a read after EarlyStopping restored the best weights
    strategy.barrier("callbacks-done")  # the chief's fit (and its files) are complete on every worker
    loaded_best = keras.models.load_model(best)
    with open(os.path.join(shared, "log.csv")) as f:
        csv_rows = f.read().strip().splitlines()
    from tfdist.strategies._worker_files import _root as temp_root
    cases["callbacks"] = {
        "epochs": len(history.history["loss"]), "val_loss": val, "best_epoch": stop.best_epoch,
        "best_equals_restored": float(np.max(np.abs(loaded_best.predict(xt, verbose=0) - predictions))),
        "backup_left": os.path.exists(os.path.join(shared, "backup")),
        "tensorboard_events": len(glob.glob(os.path.join(shared, "tb", "train", "events.out.tfevents.*"))),
        "temp_left": sorted(os.listdir(temp_root)) if temp_root and os.path.isdir(temp_root) else [],
        "paths_restored": [callbacks[0].filepath == best, callbacks[3].log_dir == os.path.join(shared, "tb")],
        "lr_seen": lr_seen, "final_lr": float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)),
        "csv_rows": len(csv_rows) - 1, "csv_header": csv_rows[0],
    }

    # Round trips.
    if hasattr(strategy, "pull"):  # the PS strategies (AllReduce keeps every worker identical)
        strategy.pull()
    loss, accuracy = model.evaluate(xt, yt, verbose=0)
    predictions = model.predict(xt, verbose=0)
    path = os.path.join(work, "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    loaded_predictions = loaded.predict(xt, verbose=0)
    _, loaded_accuracy = loaded.evaluate(xt, yt, verbose=0)
    norm = model.get_layer("norm")
    cases["round_trips"] = {
        "loss": float(loss), "accuracy": float(accuracy), "predict_shape": list(predictions.shape),
        "save_load_max_diff": float(np.max(np.abs(loaded_predictions - predictions))),
        "loaded_accuracy": float(loaded_accuracy),
        "norm_mean": np.asarray(norm.mean).ravel()[:8].tolist(),
        "norm_matches_data": bool(np.allclose(np.asarray(norm.mean).ravel(), x.mean(axis=0), atol=1e-4)),
    }
    seconds = {"until_round_trips": time.monotonic() - start}
    cases["multi_io"] = run_multi_io(multi_io_model, xs, ys, xt, yt, work, me)
    seconds["multi_io"] = time.monotonic() - start - sum(seconds.values())
    cases["custom_loop"] = run_custom_loop(strategy, loop_model, xs, ys, me)
    seconds["custom_loop"] = time.monotonic() - start - sum(seconds.values())
    if tables_model is not None:
        cases["tables"] = run_tables(strategy, tables_model, work, me)
        seconds["tables"] = time.monotonic() - start - sum(seconds.values())
    result["seconds"] = {k: round(v, 2) for k, v in seconds.items()}  # where the matrix's time goes
    return result


def build_multi_io_model(strategy):
    """Two inputs, two outputs, AdamW: the model a demanding Keras user tries first (issue #15)."""
    import keras

    keras.utils.set_random_seed(5)
    with strategy.scope():
        a, b = keras.Input((32,), name="a"), keras.Input((32,), name="b")
        h = keras.layers.Concatenate()([a, b])
        h = keras.layers.Dense(32, activation="relu")(h)
        h = keras.layers.Dropout(0.1)(keras.layers.BatchNormalization()(h))
        model = keras.Model({"a": a, "b": b}, {"digit": keras.layers.Dense(10, activation="softmax", name="digit")(h),
                                               "odd": keras.layers.Dense(1, activation="sigmoid", name="odd")(h)})
        model.compile(keras.optimizers.AdamW(LR, weight_decay=1e-3),
                      loss={"digit": "sparse_categorical_crossentropy", "odd": "binary_crossentropy"},
                      loss_weights={"digit": 1.0, "odd": 0.5},
                      metrics={"digit": ["accuracy"], "odd": [keras.metrics.AUC(name="auc")]})
    return model


def run_multi_io(model, xs, ys, xt, yt, work, me):
    """Dict inputs and outputs through fit, evaluate, predict, the batch methods, save and load_model."""
    import keras
    import numpy as np

    def inputs(x):
        return {"a": x[:, :32], "b": x[:, 32:]}

    def targets(y):
        return {"digit": y, "odd": (y % 2).astype("float32")}

    n = STEPS * BATCH  # the same number of steps on both workers (the sync modes step together)
    weights = {"digit": np.ones(n, "float32"), "odd": np.full(n, 0.5, "float32")}  # per-output sample weights
    history = model.fit(inputs(xs[:n]), targets(ys[:n]), sample_weight=weights, batch_size=BATCH, epochs=2,
                        validation_split=0.25, verbose=0)
    batch_x, batch_y = inputs(xs[:BATCH]), targets(ys[:BATCH])
    on_batch = model.train_on_batch(batch_x, batch_y)
    on_batch_dict = model.train_on_batch(batch_x, batch_y, return_dict=True)
    both_trained(work, me, "multi_io")  # the reads below see one model
    tested = model.test_on_batch(batch_x, batch_y)
    predicted_batch = model.predict_on_batch(batch_x)
    evaluated = model.evaluate(inputs(xt), targets(yt), verbose=0, return_dict=True)
    predictions = model.predict(inputs(xt), verbose=0)
    path = os.path.join(work, "multi_io.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    loaded_predictions = loaded.predict(inputs(xt), verbose=0)
    return {
        "history_keys": sorted(history.history), "epochs": len(history.history["loss"]),
        "loss": [float(v) for v in history.history["loss"]],
        "train_on_batch": [float(v) for v in on_batch], "train_on_batch_dict": sorted(on_batch_dict),
        "test_on_batch": [float(v) for v in tested],
        "predict_on_batch": {k: list(v.shape) for k, v in predicted_batch.items()},
        "evaluate": {k: float(v) for k, v in evaluated.items()},
        "predict": {k: list(v.shape) for k, v in predictions.items()},
        "save_load_max_diff": max(float(np.max(np.abs(loaded_predictions[k] - predictions[k]))) for k in predictions),
    }


def run_custom_loop(strategy, model, xs, ys, me):
    """A tf.distribute custom loop: strategy.run of a step applying its own gradients, strategy.reduce."""
    import hashlib

    import keras
    import numpy as np
    import tensorflow as tf

    with strategy.scope():
        optimizer = keras.optimizers.Adam(LR)  # not built: its first apply_gradients builds it, inside the step
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    global_batch = BATCH * strategy.num_replicas_in_sync
    ds = tf.data.Dataset.from_tensor_slices((xs, ys)).shuffle(256, seed=me).repeat().batch(BATCH)
    batches = iter(strategy.experimental_distribute_dataset(ds))

    @tf.function
    def train_step(x, y):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_fn(y, model(x, training=True)), global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=(x, y)), axis=None)

    losses = [float(train_step(*next(batches))) for _ in range(2 * STEPS)]
    weights = b"".join(np.asarray(w).tobytes() for w in model.get_weights())
    return {"losses": losses, "iterations": int(keras.ops.convert_to_numpy(optimizer.iterations)),
            "hash": hashlib.sha256(weights).hexdigest()}


def build_tables_model(strategy):
    """The tables case's model (built before the job's first step: tables are fixed when the PS initialises)."""
    import keras

    keras.utils.set_random_seed(3)
    with strategy.scope():
        inp = keras.Input((5,), dtype="int64")
        a = keras.layers.GlobalAveragePooling1D()(tfdist.layers.ShardedEmbedding(VOCAB, 4, name="sharded")(inp))
        b = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(VOCAB, 8, name="over")(inp))  # 6.4 kB
        c = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(16, 2, name="under")(inp % 16))
        out = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Concatenate()([a, b, c]))
        model = keras.Model(inp, out)
        model.compile(keras.optimizers.Adagrad(0.1), "binary_crossentropy")
    return model


def both_trained(work, me, case):
    """Waits (at most 120 s) until the other worker process finished training ``case`` too (a file barrier).

    Under async a reader gets the PS's current values at every step: while the other worker still trains,
    ``predict`` and the ``save`` after it would see different models.
    """
    mode = os.path.basename(work).rsplit("-", 1)[0]
    open(os.path.join(work, os.pardir, f"{mode}-{case}-trained-{me}"), "w").close()
    other = os.path.join(work, os.pardir, f"{mode}-{case}-trained-{1 - me}")
    deadline = time.monotonic() + 120
    while not os.path.exists(other):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the other worker did not finish the {case} case within 120 s")
        time.sleep(0.05)


def run_tables(strategy, model, work, me):
    """PS-resident tables under this mode: fit, evaluate, predict, save, load into plain Keras."""
    import keras
    import numpy as np

    rng = np.random.default_rng(7)
    ids = rng.integers(0, VOCAB, size=(STEPS * BATCH * 2, 5)).astype(np.int64)
    y = (ids[:, 0] % 2).astype(np.float32)
    mine_ids, mine_y = ids[me::2], y[me::2]
    history = model.fit(mine_ids, mine_y, batch_size=BATCH, epochs=1, verbose=0)
    # Both workers done training before the reads below: under async the other's steps would otherwise change
    # the table between this worker's predict and its save.
    both_trained(work, me, "tables")
    strategy.pull()
    loss = model.evaluate(ids[:64], y[:64], verbose=0)
    predictions = model.predict(ids[:64], verbose=0)
    path = os.path.join(work, "tables.keras")
    model.save(path)
    # Outside the strategy's scope: ordinary Embeddings. compile=False: the file's optimizer state is the job's
    # (a table's own is on the PS), which does not fit local tables (docs/sparse.md).
    plain = keras.models.load_model(path, compile=False)
    return {
        "loss": [float(v) for v in history.history["loss"]], "evaluate_loss": float(loss),
        "tables": sorted((t["rows"], t["dim"]) for t in strategy.tables()),
        "local_shapes": sorted(list(map(int, w.shape)) for w in model.weights if len(w.shape) == 2),
        "updates": sum(t["updates"] for st in strategy.ps_status() for t in st["tables"].values()),
        "plain_max_diff": float(np.max(np.abs(plain.predict(ids[:64], verbose=0) - predictions))),
        "plain_types": sorted(type(plain.get_layer(n)).__name__ for n in ("sharded", "over", "under")),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--modes", default="all_reduce,async,ssp,dtssp,bsp,sync_replicas,lone")
    args = p.parse_args()
    tf_config = json.loads(os.environ["TF_CONFIG"])
    cluster, me = tf_config["cluster"], tf_config["task"]["index"]
    token = os.environ["TFDIST_TOKEN"]
    modes = args.modes.split(",")
    import keras

    from tfdist.datasets import load_digits

    data = load_digits()
    ps_index = 0
    for mode in modes:
        if mode != "all_reduce":  # each PS strategy below is given its own cluster (one PS task)
            os.environ.pop("TF_CONFIG", None)
            os.environ.pop("TFDIST_CONFIG", None)
        path = os.path.join(args.out, f"{mode}-worker-{me}.json")
        strategy = None
        try:
            strategy = make_strategy(mode, cluster, me, token, ps_index)
            result = run_mode(mode, strategy, args.out, me, data)
        except Exception as e:  # noqa: BLE001 - reported to the test, which names the case
            result = {"mode": mode, "worker": me, "error": f"{type(e).__name__}: {e}",
                      "traceback": traceback.format_exc()[-4000:]}
        finally:
            if mode != "all_reduce":
                ps_index += 2 if mode == "lone" else 1  # lone: a PS task per worker process
                if strategy is not None:
                    strategy.shutdown()
        with open(path + ".tmp", "w") as f:
            json.dump(result, f)
        os.replace(path + ".tmp", path)
        print(f"worker {me}: {mode} {'failed: ' + result['error'] if 'error' in result else 'done'}", flush=True)
        keras.backend.clear_session()


if __name__ == "__main__":
    main()
