"""Wire format: raw bytes behind a JSON header; strict decoding."""

import json
import struct

import numpy as np
import pytest

from tfdist.errors import WireFormatError
from tfdist import wire


def test_round_trip_keeps_dtype_shape_and_values():
    tensors = {
        "a": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.array(3.5, dtype=np.float64),
        "c": np.zeros((0, 5), dtype=np.int64),
        "d": np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3)),
    }
    meta, out = wire.decode(wire.encode({"op": "x", "n": [1, 2]}, tensors))
    assert meta == {"op": "x", "n": [1, 2]}
    for k, v in tensors.items():
        assert out[k].dtype == v.dtype and out[k].shape == v.shape
        np.testing.assert_array_equal(out[k], v)


def test_bfloat16_travels():
    import ml_dtypes

    x = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)
    _, out = wire.decode(wire.encode({}, {"x": x}))
    assert out["x"].dtype == x.dtype and list(out["x"].astype(np.float32)) == [1.5, -2.0]


def test_decoded_arrays_are_read_only_views():
    msg = wire.encode({}, {"a": np.ones(4, np.float32)})
    _, out = wire.decode(msg)
    assert not out["a"].flags.writeable


def test_object_dtype_refused():
    with pytest.raises(WireFormatError, match="object"):
        wire.encode({}, {"a": np.array([object()])})


def _forge(header: dict, payload: bytes = b"") -> bytes:
    h = json.dumps(header).encode()
    pad = (-(4 + 4 + len(h))) % 8
    return wire.MAGIC + struct.pack("<I", len(h)) + h + b"\0" * pad + payload


@pytest.mark.parametrize(
    "message, match",
    [
        (b"", "magic"),
        (b"XXXX\0\0\0\0", "magic"),
        (wire.MAGIC + struct.pack("<I", 1000) + b"{}", "Truncated"),
        (_forge({"nope": 1}), "Malformed"),
        (_forge({"meta": {}, "tensors": [{"name": "a", "dtype": "object", "shape": [1], "offset": 0, "nbytes": 8}]}, b"\0" * 8), "not allowed"),
        (_forge({"meta": {}, "tensors": [{"name": "a", "dtype": "float32", "shape": [4], "offset": 0, "nbytes": 16}]}, b"\0" * 8), "do not match"),
        (_forge({"meta": {}, "tensors": [{"name": "a", "dtype": "float32", "shape": [2], "offset": 0, "nbytes": 4}]}, b"\0" * 8), "do not match"),
        (_forge({"meta": {}, "tensors": [{"name": "a", "dtype": "float32", "shape": [-1], "offset": 0, "nbytes": 4}]}, b"\0" * 8), "negative"),
    ],
)
def test_malformed_messages_raise(message, match):
    with pytest.raises(WireFormatError, match=match):
        wire.decode(message)
