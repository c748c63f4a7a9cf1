"""Worker script for the memory test: trains a model whose table is larger than this process may hold.

Usage: big_table_worker.py --out DIR --rows R --dim D --limit-mb L [--steps N] [--local]

Caps its own data segment (``RLIMIT_DATA``: heap and private writable
mappings) to ``L`` MiB before TensorFlow is imported, then trains a
``ShardedEmbedding(R, D)`` model (``--local``: a plain ``keras.layers.Embedding``,
which must fail under the cap). Writes ``worker-0.json`` with the steps done,
the loss, this process's peak ``VmData`` and the PS tasks' table bytes.
"""

import argparse
import json
import os
import resource

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--rows", type=int, required=True)
p.add_argument("--dim", type=int, default=32)
p.add_argument("--limit-mb", type=int, required=True)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--local", action="store_true")
args = p.parse_args()
limit = args.limit_mb * 2**20
resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfdist  # noqa: E402


def vm_data_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) / 1024
    return -1.0


strategy = tfdist.ParameterServerStrategy()
rng = np.random.default_rng(0)
ids = rng.integers(0, args.rows, size=(args.steps * 64, 8), dtype=np.int64)
y = (ids[:, 0] % 2).astype(np.float32)
with strategy.scope():
    inp = keras.Input((8,), dtype="int64")
    emb = (keras.layers.Embedding(args.rows, args.dim) if args.local
           else tfdist.layers.ShardedEmbedding(args.rows, args.dim, optimizer={"kind": "sgd", "learning_rate": 0.1}))
    x = keras.layers.GlobalAveragePooling1D()(emb(inp))
    model = keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(x))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy")
hist = model.fit(ids, y, batch_size=64, epochs=1, verbose=0)
result = {"steps": len(ids) // 64, "loss": [float(v) for v in hist.history["loss"]], "vm_data_mb": vm_data_mb(),
          "limit_mb": args.limit_mb,
          "ps_table_bytes": [sum(t["bytes"] for t in st["tables"].values()) for st in strategy.ps_status()]}
with open(os.path.join(args.out, "worker-0.json"), "w") as f:
    json.dump(result, f)
print(f"trained {result['steps']} steps; VmData {result['vm_data_mb']:.0f} MiB under a {args.limit_mb} MiB cap",
      flush=True)
