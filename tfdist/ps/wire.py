"""Wire format: tensors as raw bytes behind a small JSON header.

A message is::

    b"TFD1" | uint32 little-endian header length | header (JSON, UTF-8)
            | zero padding to a multiple of 8 | tensor bytes ...

The header is ``{"meta": {...}, "tensors": [{"name", "dtype", "shape",
"offset", "nbytes"}, ...]}``; offsets count from the start of the payload.
Tensors are never encoded element by element: encoding costs one copy
(``bytes.join`` over the arrays' buffers) and decoding none (read-only numpy
views into the received buffer).
"""

from __future__ import annotations

import json
import struct
from typing import Any, Mapping

import numpy as np

from tfdist.errors import WireFormatError

__all__ = ["encode", "decode", "ALLOWED_DTYPES", "MAGIC"]

MAGIC = b"TFD1"
_LEN = struct.Struct("<I")
_MAX_HEADER_BYTES = 64 * 1024 * 1024

#: dtypes that may travel; anything else is refused on both ends.
ALLOWED_DTYPES = frozenset(
    [
        "float16",
        "float32",
        "float64",
        "bfloat16",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "bool",
    ]
)


def _dtype_name(arr: np.ndarray) -> str:
    name = arr.dtype.name
    if name not in ALLOWED_DTYPES:
        raise WireFormatError(
            f"Cannot send a tensor of dtype {name!r}. "
            f"Allowed dtypes: {sorted(ALLOWED_DTYPES)}."
        )
    return name


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes  # shipped with TensorFlow

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def encode(
    meta: Mapping[str, Any] | None = None,
    tensors: Mapping[str, np.ndarray] | None = None,
) -> bytes:
    """Encodes JSON-able ``meta`` and named numpy ``tensors`` into one message.

    Args:
        meta: JSON-serialisable request/response fields.
        tensors: name → array. Arrays are made C-contiguous if they are not.

    Returns:
        The message bytes.
    """
    entries = []
    buffers = []
    offset = 0
    for name, value in (tensors or {}).items():
        arr = np.asarray(value)
        if not arr.flags.c_contiguous:  # (ascontiguousarray would turn scalars into 1-d)
            arr = arr.copy(order="C")
        nbytes = arr.nbytes
        entries.append(
            {
                "name": name,
                "dtype": _dtype_name(arr),
                "shape": list(arr.shape),
                "offset": offset,
                "nbytes": nbytes,
            }
        )
        if nbytes:
            buffers.append(memoryview(arr.reshape(-1).view(np.uint8)))
        offset += nbytes
    header = json.dumps(
        {"meta": dict(meta or {}), "tensors": entries}, separators=(",", ":")
    ).encode("utf-8")
    pad = (-(len(MAGIC) + _LEN.size + len(header))) % 8
    return b"".join(
        [MAGIC, _LEN.pack(len(header)), header, b"\0" * pad, *buffers]
    )


def decode(message: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Decodes a message made by :func:`encode`.

    Returns:
        ``(meta, tensors)``; the arrays are read-only views into ``message``.

    Raises:
        WireFormatError: the message is truncated, has a bad magic number, an
            unknown dtype, or tensor sizes that do not match their shapes.
    """
    view = memoryview(message)
    head = len(MAGIC) + _LEN.size
    if len(view) < head or bytes(view[: len(MAGIC)]) != MAGIC:
        raise WireFormatError(
            "Not a tfdist message (bad magic number). Are client and server "
            "the same tfdist version?"
        )
    (hlen,) = _LEN.unpack(view[len(MAGIC) : head])
    if hlen > _MAX_HEADER_BYTES or head + hlen > len(view):
        raise WireFormatError(
            f"Truncated tfdist message: header of {hlen} bytes declared, "
            f"{len(view) - head} bytes present."
        )
    try:
        header = json.loads(bytes(view[head : head + hlen]))
        meta = header["meta"]
        entries = header["tensors"]
    except (ValueError, KeyError, TypeError) as e:
        raise WireFormatError(f"Malformed tfdist message header: {e}") from e
    start = head + hlen
    start += (-start) % 8
    payload = view[start:]
    tensors: dict[str, np.ndarray] = {}
    for entry in entries:
        try:
            name = entry["name"]
            dtype_name = entry["dtype"]
            shape = tuple(int(d) for d in entry["shape"])
            off = int(entry["offset"])
            nbytes = int(entry["nbytes"])
        except (KeyError, TypeError, ValueError) as e:
            raise WireFormatError(f"Malformed tensor entry {entry!r}: {e}") from e
        if dtype_name not in ALLOWED_DTYPES:
            raise WireFormatError(
                f"Tensor {name!r} has dtype {dtype_name!r}, which is not "
                f"allowed. Allowed dtypes: {sorted(ALLOWED_DTYPES)}."
            )
        dtype = _np_dtype(dtype_name)
        if any(d < 0 for d in shape):
            raise WireFormatError(f"Tensor {name!r} has a negative dimension {shape}.")
        expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes != expected or off < 0 or off + nbytes > len(payload):
            raise WireFormatError(
                f"Tensor {name!r}: {nbytes} bytes at offset {off} do not match "
                f"shape {list(shape)} of {dtype_name} ({expected} bytes) within "
                f"a payload of {len(payload)} bytes."
            )
        arr = np.frombuffer(payload[off : off + nbytes], dtype=dtype)
        tensors[name] = arr.reshape(shape)
    return meta, tensors
