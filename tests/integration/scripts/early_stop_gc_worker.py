"""A fit stopped early, then Python's garbage collector run on a TensorFlow inter-op thread (issue #27 item 1).

Usage: early_stop_gc_worker.py MODE   (MODE: ps = tfdist.ParameterServerStrategy(), allreduce =
tfdist.AllReduceStrategy(); one process)

The mechanism of the hang at the end of ``fit`` / at exit, made deterministic:
a ``fit`` stopped early (``stop_training``) used to leave Keras's epoch
iterator, and its live ``tf.data`` iterator, in a reference cycle. The cyclic
collector then freed it on whichever thread allocated: under tfdist, an
inter-op thread running one of the step's ``tf.py_function`` ops, where the
iterator's destructor waits for a free inter-op thread forever. Here the
process has one inter-op thread, automatic collection is off until the
script chooses, and the collection runs in a ``tf.py_function``. Prints one
JSON line: the ``tf.data`` iterators still alive after ``fit`` returned, and
that the collection finished. A hang is ended by ``faulthandler`` after 60 s
(exit 1, every thread's stack on stderr).
"""

import faulthandler
import gc
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

tf.config.threading.set_inter_op_parallelism_threads(1)

import tfdist  # noqa: E402

faulthandler.dump_traceback_later(60, exit=True)  # (armed after the imports, which a busy machine makes slow)


class StopEarly(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 2:
            self.model.stop_training = True


def live_iterators() -> int:
    """tf.data iterators (Keras's distributed one and its per-device ones) still referenced, without collecting."""
    return sum(type(o).__name__ in ("OwnedMultiDeviceIterator", "OwnedIterator", "DistributedIterator")
               for o in gc.get_objects())


def main():
    mode = sys.argv[1]
    strategy = tfdist.ParameterServerStrategy() if mode == "ps" else tfdist.AllReduceStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    rng = np.random.default_rng(0)
    x, y = rng.random((256, 4), np.float32), rng.random((256, 1), np.float32)
    gc.collect()
    gc.disable()  # the script chooses where garbage is collected
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[StopEarly()])
    alive = live_iterators()

    def collect():
        return np.int64(gc.collect())

    collected = int(tf.function(lambda: tf.py_function(collect, [], tf.int64))())  # on the inter-op thread
    print(json.dumps({"steps": len(history.history["loss"]), "iterators_alive_after_fit": alive,
                      "collected_on_an_inter_op_thread": collected}), flush=True)
    gc.enable()
    faulthandler.cancel_dump_traceback_later()
    if hasattr(strategy, "shutdown"):
        strategy.shutdown()


if __name__ == "__main__":
    main()
