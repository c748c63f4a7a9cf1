"""The dense exchange's cheap paths (issue #23): they change what an update costs, never what it does."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfdist import wire
from tfdist.ps.session import ROW_SPARSE_MIN_ROWS, _row_sparse
from tfdist.ps.update_session import FlatLayout


@pytest.mark.parametrize("shape", [(0,), (1,), (7, 3), (784, 256), (5, 0, 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.float16])
def test_aligned_empty_is_aligned_contiguous_and_of_the_asked_shape(shape, dtype):
    for _ in range(5):  # numpy's own allocations land at various offsets; each must be corrected
        a = wire.aligned_empty(shape, dtype)
        assert a.shape == shape and a.dtype == np.dtype(dtype) and a.flags.c_contiguous and a.flags.writeable
        assert a.size == 0 or a.ctypes.data % wire.ALIGNMENT == 0  # (an empty array has no data to align)


def test_dtype_name_is_numpys_name_for_every_allowed_dtype():
    for name in wire.ALLOWED_DTYPES:
        dtype = wire._np_dtype(name)
        assert wire.dtype_name(dtype) == dtype.name == name
        assert wire._np_dtype(name) is dtype  # cached


def test_a_dense_delta_travels_dense_and_a_sparse_one_as_its_rows():
    rng = np.random.default_rng(0)
    dense = rng.normal(size=(784, 16)).astype(np.float32)
    table = np.zeros((1000, 8), np.float32)
    touched = np.array([3, 40, 41, 999])
    table[touched] = 1.0
    half = np.zeros((ROW_SPARSE_MIN_ROWS, 4), np.float32)
    half[: ROW_SPARSE_MIN_ROWS // 2] = 2.0  # exactly half: still row-sparse
    bias = dense[0]
    out, rows = _row_sparse({"dense": dense, "table": table, "half": half, "bias": bias})
    assert out["dense"] is dense and "dense" not in rows
    assert out["bias"] is bias and "bias" not in rows
    np.testing.assert_array_equal(rows["table"], touched)
    np.testing.assert_array_equal(out["table"], table[touched])
    np.testing.assert_array_equal(rows["half"], np.arange(ROW_SPARSE_MIN_ROWS // 2))


def test_a_delta_that_fools_the_sample_is_sent_dense_which_is_still_the_update():
    """Only the sampled rows changed: the sample says dense, so the whole delta travels (correct, larger)."""
    n = 1024
    delta = np.zeros((n, 4), np.float32)
    delta[:: n // 32] = 1.0  # exactly the rows the sample looks at
    out, rows = _row_sparse({"v": delta})
    assert "v" not in rows
    np.testing.assert_array_equal(out["v"], delta)


@pytest.mark.parametrize("seed", range(20))
def test_row_sparse_form_always_rebuilds_the_delta(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(ROW_SPARSE_MIN_ROWS, 600))
    delta = np.zeros((n, 3), np.float32)
    changed = rng.choice(n, size=int(rng.integers(0, n + 1)), replace=False)
    delta[changed] = rng.normal(size=(changed.size, 3)).astype(np.float32) + 0.5
    out, rows = _row_sparse({"v": delta})
    rebuilt = np.zeros_like(delta)
    if "v" in rows:
        assert 2 * rows["v"].size <= n
        rebuilt[rows["v"]] = out["v"]
    else:
        rebuilt = out["v"]
    np.testing.assert_array_equal(rebuilt, delta)


def test_an_aligned_addend_is_added_without_a_copy_and_the_variable_never_aliases_it():
    import tensorflow as tf

    from tfdist.strategies._variable_registry import ALIAS_MIN_BYTES, _write, aliasable

    shape = (ALIAS_MIN_BYTES // 4, 2)
    var = tf.Variable(np.ones(shape, np.float32))
    addend = wire.aligned_empty(shape)
    addend[...] = 2.0
    assert aliasable(addend, var)
    _write(var, addend, add=True)
    addend[...] = 100.0  # the buffer is written again (the next exchange's corrections)
    np.testing.assert_array_equal(var.numpy(), np.full(shape, 3.0, np.float32))
    _write(var, addend)  # an assignment copies whatever the array: the variable must not keep the buffer
    addend[...] = -5.0
    np.testing.assert_array_equal(var.numpy(), np.full(shape, 100.0, np.float32))


def test_arrays_that_tensorflow_must_not_alias_are_copied():
    import tensorflow as tf

    from tfdist.strategies._variable_registry import ALIAS_MIN_BYTES, _write, aliasable

    shape = (ALIAS_MIN_BYTES // 4 + 16,)
    var = tf.Variable(np.zeros(shape, np.float32))
    raw = wire.aligned_empty((shape[0] + 1,))
    unaligned = raw[1:]  # 4 bytes past an aligned start: TensorFlow would abort on it
    assert unaligned.ctypes.data % wire.ALIGNMENT != 0
    small = wire.aligned_empty((4,))
    wrong_dtype = wire.aligned_empty(shape, np.float64)
    strided = wire.aligned_empty((shape[0] * 2,))[::2]
    assert not aliasable(unaligned, var)
    assert not aliasable(small, tf.Variable(np.zeros(4, np.float32)))
    assert not aliasable(wrong_dtype, var)
    assert not aliasable(strided, var)
    assert not aliasable(list(range(shape[0])), var)
    unaligned[...] = 1.5
    _write(var, unaligned, add=True)  # copied, added
    np.testing.assert_array_equal(var.numpy(), np.full(shape, 1.5, np.float32))


# --------------------------------------------------- one flat output for a step's corrections (FlatLayout)
_shapes = st.lists(st.lists(st.integers(0, 9), min_size=0, max_size=3).map(tuple), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(shapes=_shapes, dtype=st.sampled_from([np.float32, np.float64, np.float16]), data=st.data())
def test_a_flat_layout_packs_each_correction_in_its_own_aligned_slot_and_zeros_the_rest(shapes, dtype, data):
    keys = tuple(f"v{i}" for i in range(len(shapes)))
    layout = FlatLayout(keys, tuple(shapes), np.dtype(dtype))
    itemsize = np.dtype(dtype).itemsize
    for (start, size), shape in zip(layout.slots, shapes):
        assert (start * itemsize) % wire.ALIGNMENT == 0 and size == int(np.prod(shape))
    ends = [start + size for start, size in layout.slots]
    assert all(end <= nxt for end, (nxt, _) in zip(ends, layout.slots[1:]))  # slots never overlap
    assert layout.size == ends[-1]
    given_keys = data.draw(st.sets(st.sampled_from(keys)))
    rng = np.random.default_rng(len(given_keys))
    corrections = {k: rng.normal(size=shape).astype(dtype) + 1 for k, shape in zip(keys, shapes) if k in given_keys}
    flat = layout.pack(corrections)
    assert flat.ctypes.data % wire.ALIGNMENT == 0 or flat.size == 0
    for key, shape, (start, size) in zip(keys, shapes, layout.slots):
        expected = corrections.get(key, np.zeros(shape, dtype))
        np.testing.assert_array_equal(flat[start:start + size].reshape(shape), expected)
    assert layout.fits("v0", np.zeros(shapes[0], dtype)) and not layout.fits("nope", np.zeros(shapes[0], dtype))
    assert not layout.fits("v0", np.zeros(shapes[0], np.int32))


def test_corrections_written_into_a_flat_buffer_are_packed_without_a_copy():
    layout = FlatLayout(("a", "b", "c"), ((3, 5), (7,), (2, 2)), np.dtype(np.float32))
    flat = wire.aligned_empty((layout.size,), np.float32)
    flat[...] = np.nan  # what aligned_empty may hold: every slot must be written
    (sa, na), _, (sc, nc) = layout.slots
    a = flat[sa:sa + na].reshape(3, 5)
    a[...] = 1.0
    c = np.full((2, 2), 3.0, np.float32)  # not a view: copied in
    out = layout.pack({"a": a, "c": c}, into=flat)
    assert out is flat
    np.testing.assert_array_equal(flat[sa:sa + na], 1.0)
    np.testing.assert_array_equal(flat[layout.slots[1][0]:layout.slots[1][0] + 7], 0.0)
    np.testing.assert_array_equal(flat[sc:sc + nc], 3.0)


def test_a_steps_graph_adds_each_slot_of_the_flat_output_to_its_variable_and_nothing_when_empty():
    import tensorflow as tf

    from tfdist.strategies._update_path import _flat_layout, _fold_flat

    variables = [tf.Variable(np.ones((3, 5), np.float32)), tf.Variable(np.zeros((7,), np.float32)),
                 tf.Variable(np.full((2, 2), 2.0, np.float32))]
    layout = _flat_layout(["a", "b", "c"], variables)
    assert layout is not None and layout.shapes == ((3, 5), (7,), (2, 2))
    assert _flat_layout(["a", "i"], [variables[0], tf.Variable(np.zeros(3, np.float64))]) is None  # two dtypes

    @tf.function
    def fold(flat):
        with tf.control_dependencies([_fold_flat(variables, layout, flat)]):
            return tf.constant(0)

    corrections = {"a": np.full((3, 5), 0.5, np.float32), "c": np.arange(4, dtype=np.float32).reshape(2, 2)}
    fold(tf.constant(layout.pack(corrections)))
    np.testing.assert_array_equal(variables[0].numpy(), np.full((3, 5), 1.5, np.float32))
    np.testing.assert_array_equal(variables[1].numpy(), np.zeros(7, np.float32))
    np.testing.assert_array_equal(variables[2].numpy(), 2.0 + np.arange(4, dtype=np.float32).reshape(2, 2))
    fold(tf.zeros((0,), tf.float32))  # nothing landed: nothing added
    np.testing.assert_array_equal(variables[0].numpy(), np.full((3, 5), 1.5, np.float32))
