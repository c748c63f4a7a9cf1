"""Worker script of the Keras-conventions matrix (issue #15): every common Keras feature under every strategy.

Usage: keras_matrix_worker.py --out DIR [--modes all_reduce,async,ssp,dtssp,bsp,sync_replicas]

Runs in each of the 2 worker processes of a ``LocalCluster(workers=2, ps=5)``.
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
* a stateful preprocessing layer (``Normalization``) adapted on the chief only.

Writes ``<out>/<mode>-worker-<id>.json`` with what the test asserts, or the
error of the first case that failed (``"error"``, with its traceback).
"""

import argparse
import glob
import json
import os
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tfdist.collective  # noqa: E402  (no TF op before the all-reduce group is configured)

STEPS, BATCH, EPOCHS, LR = 6, 32, 3, 1e-2


def make_strategy(mode, cluster, me, token, ps_index, group):
    import tfdist

    if mode == "all_reduce":
        return tfdist.AllReduceStrategy(group=group)
    one = dict(cluster={"worker": cluster["worker"], "ps": [cluster["ps"][ps_index]]}, task=f"worker:{me}",
               token=token)
    return {
        "async": lambda: tfdist.ParameterServerStrategy(**one),
        "ssp": lambda: tfdist.SSPStrategy(staleness=2, **one),
        "dtssp": lambda: tfdist.DTSSPStrategy(min_staleness=1, max_staleness=4, **one),
        "bsp": lambda: tfdist.BSPStrategy(**one),
        "sync_replicas": lambda: tfdist.SyncReplicasStrategy(replicas_to_aggregate=2, **one),
    }[mode]()


def run_mode(mode, strategy, out, me, data):
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
    xs, ys = x[me::2], y[me::2]
    xt, yt = data.x_test.reshape(-1, 64), data.y_test
    work = os.path.join(out, f"{mode}-{me}")
    os.makedirs(work, exist_ok=True)
    result = {"mode": mode, "worker": me, "cases": {}}
    cases = result["cases"]

    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Normalization(name="norm"),
                                  keras.layers.Dense(16, activation="relu", name="hidden"),
                                  keras.layers.Dense(10, activation="softmax", name="out")], name="model")
        if me == 0:  # stateful preprocessing: only the chief adapts; its statistics become the job's
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

    # The common callbacks, together in one fit with validation.
    best = os.path.join(work, "best.keras")
    lr_seen = []
    callbacks = [
        keras.callbacks.ModelCheckpoint(best, monitor="val_loss", save_best_only=True),
        keras.callbacks.BackupAndRestore(os.path.join(work, "backup")),
        keras.callbacks.EarlyStopping("val_loss", patience=EPOCHS, restore_best_weights=True),
        keras.callbacks.TensorBoard(os.path.join(work, "tb")),
        # never an improvement after the first epoch (min_delta): halves the rate at every later epoch end
        keras.callbacks.ReduceLROnPlateau("loss", factor=0.5, patience=0, min_delta=100.0),
        keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr_seen.append(float(lr)) or lr * 0.9),
        keras.callbacks.CSVLogger(os.path.join(work, "log.csv")),
    ]
    history = model.fit(ds, steps_per_epoch=STEPS, epochs=EPOCHS, validation_data=(xt, yt), verbose=0,
                        callbacks=callbacks)
    val = [float(v) for v in history.history["val_loss"]]
    stop = callbacks[2]
    predictions = model.predict(xt, verbose=0)  # a read after EarlyStopping restored the best weights
    loaded_best = keras.models.load_model(best)
    with open(os.path.join(work, "log.csv")) as f:
        csv_rows = f.read().strip().splitlines()
    cases["callbacks"] = {
        "epochs": len(history.history["loss"]), "val_loss": val, "best_epoch": stop.best_epoch,
        "best_equals_restored": float(np.max(np.abs(loaded_best.predict(xt, verbose=0) - predictions))),
        "backup_left": os.path.exists(os.path.join(work, "backup")),
        "tensorboard_events": len(glob.glob(os.path.join(work, "tb", "train", "events.out.tfevents.*"))),
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
    return result


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--modes", default="all_reduce,async,ssp,dtssp,bsp,sync_replicas")
    args = p.parse_args()
    tf_config = json.loads(os.environ["TF_CONFIG"])
    cluster, me = tf_config["cluster"], tf_config["task"]["index"]
    token = os.environ["TFDIST_TOKEN"]
    modes = args.modes.split(",")
    group = tfdist.collective.init_worker_group(timeout_s=60) if "all_reduce" in modes else None
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
            strategy = make_strategy(mode, cluster, me, token, ps_index, group)
            result = run_mode(mode, strategy, args.out, me, data)
        except Exception as e:  # noqa: BLE001 - reported to the test, which names the case
            result = {"mode": mode, "worker": me, "error": f"{type(e).__name__}: {e}",
                      "traceback": traceback.format_exc()[-4000:]}
        finally:
            if mode != "all_reduce":
                ps_index += 1
                if strategy is not None:
                    strategy.shutdown()
        with open(path + ".tmp", "w") as f:
            json.dump(result, f)
        os.replace(path + ".tmp", path)
        print(f"worker {me}: {mode} {'failed: ' + result['error'] if 'error' in result else 'done'}", flush=True)
        keras.backend.clear_session()


if __name__ == "__main__":
    main()
