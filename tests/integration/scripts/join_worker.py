"""Worker script of the join test (issue #21 item 8): variables created after the job's first step join it.

Usage: join_worker.py --out DIR --modes async,bsp

Runs in each of the 2 worker processes of a ``LocalCluster(workers=2, ps=2 * len(modes))``; each mode is a
job of its own on two PS tasks of the cluster. Per mode, on digits: fit a base model; add a head (new layers
and a fresh Adam) on the base and fit it; build a second, unrelated model and fit it; pull; the chief saves the
head model (``.keras``). Writes ``<out>/<mode>-worker-<id>.json``: the placement table, the head's and the
second model's predictions on a fixed batch, the saved file's path, or the error.
"""

import argparse
import json
import os
import traceback


def make_strategy(mode, cluster, me, token, first_ps):
    import tfdist

    one = dict(cluster={"worker": cluster["worker"], "ps": cluster["ps"][first_ps:first_ps + 2]}, task=f"worker:{me}",
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

    def loss():  # the models end in logits (a probability loss on logits trains erratically)
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    x, y = data.x_train[:256].reshape(-1, 64), data.y_train[:256]
    keras.utils.set_random_seed(me)  # the workers initialise differently: the job's values must win
    with strategy.scope():
        base = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu", name="hidden")],
                                name="base")
        model = keras.Sequential([base, keras.layers.Dense(10, name="out")], name="model")
        model.compile(keras.optimizers.SGD(0.05), loss())
    model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    keys_first = [k for k, _, _ in strategy.placement_table()]

    keras.utils.set_random_seed(10 + me)
    with strategy.scope():  # fine-tuning: a new head on the trained base, a fresh optimizer
        head = keras.Sequential([base, keras.layers.Dense(16, activation="relu", name="head_hidden"),
                                 keras.layers.Dense(10, name="head_out")], name="finetune")
        head.compile(keras.optimizers.Adam(1e-3), loss())
    history = head.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)

    keras.utils.set_random_seed(20 + me)
    with strategy.scope():  # a second model in the same process
        other = keras.Sequential([keras.Input((64,)), keras.layers.Dense(1, name="other_out")], name="other")
        other.compile(keras.optimizers.SGD(0.01), "mse")
    other.fit(x, (y % 2).astype("float32"), batch_size=32, epochs=1, shuffle=False, verbose=0)

    strategy.pull()  # this worker's last update lands (under async its last exchange may still travel)
    strategy.barrier("trained")  # every worker's has landed: from here on both read the same values
    strategy.pull()
    batch = x[:16]
    result = {"mode": mode, "worker": me, "keys_first": keys_first,
              "placement": [[k, ps] for k, ps, _ in strategy.placement_table()],
              "head_loss": [float(v) for v in history.history["loss"]],
              "head_predictions": head.predict(batch, verbose=0).tolist(),
              "other_predictions": other.predict(batch, verbose=0).tolist(),
              "status": [{"num_variables": st["num_variables"], "joined_variables": st["joined_variables"]}
                         for st in strategy.ps_status()]}
    if me == 0:
        path = os.path.join(out, f"{mode}-head.keras")
        head.save(path)
        result["saved"] = path
    return result


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--modes", default="async,bsp")
    args = p.parse_args()
    tf_config = json.loads(os.environ["TF_CONFIG"])
    cluster, me = tf_config["cluster"], tf_config["task"]["index"]
    token = os.environ["TFDIST_TOKEN"]
    os.environ.pop("TF_CONFIG", None)  # each mode's strategy is given its own cluster (two PS tasks)
    os.environ.pop("TFDIST_CONFIG", None)
    import keras

    from tfdist.datasets import load_digits

    data = load_digits()
    for i, mode in enumerate(args.modes.split(",")):
        path = os.path.join(args.out, f"{mode}-worker-{me}.json")
        strategy = None
        try:
            strategy = make_strategy(mode, cluster, me, token, 2 * i)
            result = run_mode(mode, strategy, args.out, me, data)
        except Exception as e:  # noqa: BLE001 - reported to the test
            result = {"mode": mode, "worker": me, "error": f"{type(e).__name__}: {e}",
                      "traceback": traceback.format_exc()[-4000:]}
        finally:
            if strategy is not None:
                strategy.shutdown()
        with open(path + ".tmp", "w") as f:
            json.dump(result, f)
        os.replace(path + ".tmp", path)
        print(f"worker {me}: {mode} {'failed: ' + result['error'] if 'error' in result else 'done'}", flush=True)
        keras.backend.clear_session()


if __name__ == "__main__":
    main()
