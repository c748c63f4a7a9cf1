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
import math
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from tfdist.errors import WireFormatError

__all__ = ["ALIGNMENT", "ALLOWED_DTYPES", "MAGIC", "aligned_empty", "decode", "dtype_name", "encode", "encode_chunks"]

MAGIC = b"TFD1"
_LEN = struct.Struct("<I")
_MAX_HEADER_BYTES = 64 * 1024 * 1024
#: Most dimensions a tensor may have.
_MAX_RANK = 32

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


#: Byte alignment of :func:`aligned_empty`'s arrays: TensorFlow's (``EIGEN_MAX_ALIGN_BYTES``), so that a
#: tensor may alias them (``tf.experimental.dlpack``) instead of copying.
ALIGNMENT = 64

_DTYPE_NAMES: dict[np.dtype, str] = {}


def dtype_name(dtype: np.dtype) -> str:
    """``dtype.name``, cached: numpy computes the name in Python on every access (tens of µs)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype.name
    return name


def aligned_empty(shape, dtype=np.float32) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts at a multiple of :data:`ALIGNMENT` bytes."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = (-raw.ctypes.data) % ALIGNMENT
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def _dtype_name(arr: np.ndarray) -> str:
    name = dtype_name(arr.dtype)
    if name not in ALLOWED_DTYPES:
        raise WireFormatError(
            f"Cannot send a tensor of dtype {name!r}. "
            f"Allowed dtypes: {sorted(ALLOWED_DTYPES)}."
        )
    return name


_NP_DTYPES: dict[str, np.dtype] = {}


def _np_dtype(name: str) -> np.dtype:
    dtype = _NP_DTYPES.get(name)
    if dtype is None:
        if name == "bfloat16":
            import ml_dtypes  # shipped with TensorFlow

            dtype = np.dtype(ml_dtypes.bfloat16)
        else:
            dtype = np.dtype(name)
        _NP_DTYPES[name] = dtype
    return dtype


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
    return b"".join(encode_chunks(meta, tensors))


def encode_chunks(
    meta: Mapping[str, Any] | None = None,
    tensors: Mapping[str, np.ndarray] | None = None,
) -> list[bytes | memoryview]:
    """The message of :func:`encode` as consecutive pieces (views of the arrays), for streaming writes."""
    entries = []
    buffers = []
    offset = 0
    for name, value in (tensors or {}).items():
        if not isinstance(name, str):
            raise WireFormatError(f"Tensor names are strings. Received: {_short(name)}.")
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
    try:
        header = json.dumps(
            {"meta": dict(meta or {}), "tensors": entries}, separators=(",", ":"), allow_nan=False
        ).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise WireFormatError(f"Cannot encode the message header as JSON (NaN/Infinity or a non-JSON value?): {e}") from e
    pad = (-(len(MAGIC) + _LEN.size + len(header))) % 8
    return [MAGIC, _LEN.pack(len(header)), header, b"\0" * pad, *buffers]


def _reject_constant(name: str):
    raise ValueError(f"{name} is not allowed in a tfdist message header")


def _header_int(entry: Mapping[str, Any], field: str, name: Any) -> int:
    value = entry.get(field)
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireFormatError(
            f"Tensor {_short(name)}: {field} must be an integer. Received: {field}={_short(value)}."
        )
    return value


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters (messages never echo a whole request)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def decode(message: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Decodes a message made by :func:`encode`.

    Any input either decodes or raises :class:`~tfdist.errors.WireFormatError`
    (never another exception): the header must be a JSON object with an
    object ``meta`` and a list ``tensors`` of entries whose ``name`` and
    ``dtype`` are strings, whose ``shape``, ``offset`` and ``nbytes`` are
    non-negative integers that fit the payload, with no name twice. JSON's
    ``NaN``/``Infinity`` constants are refused.

    Returns:
        ``(meta, tensors)``; the arrays are read-only views into ``message``.

    Raises:
        WireFormatError: the message is not a valid tfdist message.
    """
    if not isinstance(message, (bytes, bytearray, memoryview)):
        raise WireFormatError(f"A tfdist message is bytes. Received: {type(message).__name__}.")
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
        header = json.loads(bytes(view[head : head + hlen]), parse_constant=_reject_constant)
    except RecursionError:
        raise WireFormatError("Malformed tfdist message header: JSON nested too deeply.") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise WireFormatError(f"Malformed tfdist message header: {_short(str(e), 200)}") from None
    if not isinstance(header, dict) or not isinstance(header.get("meta"), dict) \
            or not isinstance(header.get("tensors"), list):
        raise WireFormatError(
            "Malformed tfdist message header: expected an object with an object `meta` and a list "
            f"`tensors`. Received: {_short(header)}."
        )
    meta, entries = header["meta"], header["tensors"]
    start = head + hlen
    start += (-start) % 8
    payload = view[start:]
    tensors: dict[str, np.ndarray] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            raise WireFormatError(f"Malformed tensor entry: expected an object. Received: {_short(entry)}.")
        name, dtype_name = entry.get("name"), entry.get("dtype")
        if not isinstance(name, str):
            raise WireFormatError(f"A tensor's name must be a string. Received: name={_short(name)}.")
        if name in tensors:
            raise WireFormatError(f"Tensor {_short(name)} appears twice in one message; send each name once.")
        if not isinstance(dtype_name, str) or dtype_name not in ALLOWED_DTYPES:
            raise WireFormatError(
                f"Tensor {_short(name)} has dtype {_short(dtype_name)}, which is not "
                f"allowed. Allowed dtypes: {sorted(ALLOWED_DTYPES)}."
            )
        shape = entry.get("shape")
        if not isinstance(shape, list) or len(shape) > _MAX_RANK:
            raise WireFormatError(
                f"Tensor {_short(name)}: shape must be a list of at most {_MAX_RANK} integers. "
                f"Received: shape={_short(shape)}."
            )
        dims = []
        for d in shape:
            if isinstance(d, bool) or not isinstance(d, int) or d < 0:
                raise WireFormatError(
                    f"Tensor {_short(name)}: dimensions must be non-negative integers. Received: shape={_short(shape)}."
                )
            dims.append(d)
        off = _header_int(entry, "offset", name)
        nbytes = _header_int(entry, "nbytes", name)
        dtype = _np_dtype(dtype_name)
        # Python integers do not overflow; compare the element count against what the payload can hold.
        count = math.prod(dims)
        expected = count * dtype.itemsize
        if nbytes != expected or off < 0 or off + nbytes > len(payload):
            raise WireFormatError(
                f"Tensor {_short(name)}: {_short(nbytes)} bytes at offset {_short(off)} do not match "
                f"shape {_short(dims)} of {dtype_name} ({expected} bytes) within "
                f"a payload of {len(payload)} bytes."
            )
        try:
            tensors[name] = np.frombuffer(payload[off : off + nbytes], dtype=dtype).reshape(dims)
        except ValueError as e:  # e.g. a zero-size tensor with a dimension numpy cannot represent
            raise WireFormatError(f"Tensor {_short(name)}: shape {_short(dims)} is not representable: {e}") from None
    return meta, tensors
