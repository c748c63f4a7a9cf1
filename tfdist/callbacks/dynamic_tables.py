"""``DynamicTableLogs``: a dynamic table's rows, creations, evictions and refused ids in the Keras logs."""

from __future__ import annotations

import keras

__all__ = ["DynamicTableLogs"]

#: The counters added per table (summed over the PS tasks), as ``<layer name>/<counter>``.
COUNTERS = ("rows", "created", "evicted", "not_admitted")


class DynamicTableLogs(keras.callbacks.Callback):
    """Adds each ``tfdist.layers.DynamicEmbedding``'s counters to the epoch logs (History, TensorBoard, CSVLogger).

    At each epoch's end it reads the PS tasks' status once and adds, per
    dynamic table, ``<layer name>/rows`` (rows held now), ``/created``,
    ``/evicted`` (capacity or TTL) and ``/not_admitted`` (gradients dropped
    because the id was below ``min_count`` or beyond the capacity), summed
    over the PS tasks (the PS's counters since the job started). Put it
    before the callbacks that read these logs.

    Example:

    ```python
    model.fit(ds, epochs=5, callbacks=[tfdist.callbacks.DynamicTableLogs(), keras.callbacks.CSVLogger("log.csv")])
    ```

    Under a strategy without ``ps_status`` it does nothing.
    """

    def on_epoch_end(self, epoch, logs=None):
        strategy = getattr(self.model, "distribute_strategy", None)
        status = getattr(strategy, "ps_status", None)
        if logs is None or not callable(status):
            return
        totals: dict[str, float] = {}
        for task in status():
            for key, table in (task.get("tables") or {}).items():
                if not table.get("dynamic"):
                    continue
                name = key.split("/", 1)[-1]
                for counter in COUNTERS:
                    totals[f"{name}/{counter}"] = totals.get(f"{name}/{counter}", 0.0) + float(table[counter])
        logs.update(totals)
