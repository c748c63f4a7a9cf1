"""The declared structure of a queue element: names, dtypes and shapes."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from tfdist.errors import ConfigError

__all__ = ["ElementSpec", "to_numpy_dtype"]

#: How an element is packed: one tensor, a tuple, or a dict.
STRUCTURES = ("single", "tuple", "dict")

Shape = tuple  # tuple[int | None, ...]


def to_numpy_dtype(dtype: Any) -> np.dtype:
    """Converts a ``tf.DType``, numpy dtype or dtype name to a numpy dtype.

    TensorFlow is not imported: a ``tf.DType`` is recognised by its
    ``as_numpy_dtype`` attribute. ``tf.string`` maps to ``object`` (bytes).

    Example:
        >>> to_numpy_dtype("float32")
        dtype('float32')
    """
    if hasattr(dtype, "as_numpy_dtype"):
        dtype = dtype.as_numpy_dtype
    try:
        return np.dtype(dtype)
    except TypeError as e:
        raise ConfigError(
            f"Unknown dtype. Received: dtype={dtype!r}. Pass a tf.DType, a "
            f"numpy dtype or a name such as 'float32'."
        ) from e


def _to_shape(shape: Any) -> Shape | None:
    if shape is None:
        return None
    if hasattr(shape, "as_list"):  # tf.TensorShape
        if getattr(shape, "rank", 0) is None:
            return None
        shape = shape.as_list()
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    return tuple(None if d is None or d == -1 else int(d) for d in shape)


@dataclasses.dataclass(frozen=True)
class ElementSpec:
    """Names, dtypes and per-example shapes of the components of an element.

    Args:
        names: one name per component. Tuple components are named "0", "1", ...
        dtypes: numpy dtypes, one per component.
        shapes: per-example shapes (``None`` for an unknown dimension), or
            ``None`` for a component whose shape is not declared; it is then
            fixed by the first element enqueued.
        structure: "single" (an element is one tensor), "tuple" or "dict".
    """

    names: tuple
    dtypes: tuple
    shapes: tuple
    structure: str = "tuple"

    def __post_init__(self):
        if self.structure not in STRUCTURES:
            raise ConfigError(
                f"Unknown element structure. Received: structure="
                f"{self.structure!r}. Use one of {STRUCTURES}."
            )
        if not (len(self.names) == len(self.dtypes) == len(self.shapes)) or not self.names:
            raise ConfigError(
                "names, dtypes and shapes must have one entry per component "
                f"(at least one). Received: names={self.names!r}, dtypes="
                f"{self.dtypes!r}, shapes={self.shapes!r}."
            )
        if self.structure == "single" and len(self.names) != 1:
            raise ConfigError(
                f"A 'single' element has one component. Received: names={self.names!r}."
            )

    @classmethod
    def from_declaration(
        cls,
        dtypes: Any,
        shapes: Any = None,
        names: Sequence[str] | None = None,
    ) -> "ElementSpec":
        """Builds a spec from TF1-style ``dtypes``/``shapes``/``names`` arguments.

        A single dtype (not a list) declares single-tensor elements; a list
        declares tuples; ``names`` turns the element into a dict.

        Example:
            >>> spec = ElementSpec.from_declaration(["float32", "int64"], [[2], []])
            >>> spec.shapes
            ((2,), ())
        """
        single = not isinstance(dtypes, (list, tuple))
        dtype_list = [dtypes] if single else list(dtypes)
        if shapes is None:
            shape_list = [None] * len(dtype_list)
        elif single:
            shape_list = [shapes]
        else:
            shape_list = list(shapes)
        if len(shape_list) != len(dtype_list):
            raise ConfigError(
                "Give one shape per dtype. Received: "
                f"dtypes={dtypes!r}, shapes={shapes!r}."
            )
        if names is not None:
            if single or len(names) != len(dtype_list):
                raise ConfigError(
                    "Give one name per dtype (and dtypes as a list). Received: "
                    f"dtypes={dtypes!r}, names={names!r}."
                )
            if len(set(names)) != len(names):
                raise ConfigError(f"Component names must be unique. Received: names={names!r}.")
            structure, name_list = "dict", [str(n) for n in names]
        else:
            structure = "single" if single else "tuple"
            name_list = [str(i) for i in range(len(dtype_list))]
        return cls(
            names=tuple(name_list),
            dtypes=tuple(to_numpy_dtype(d) for d in dtype_list),
            shapes=tuple(_to_shape(s) for s in shape_list),
            structure=structure,
        )

    @classmethod
    def infer(cls, element: Any, batched: bool = False) -> "ElementSpec":
        """Infers a fully defined spec from one element (or one batch)."""
        if isinstance(element, Mapping):
            structure, names, values = "dict", [str(k) for k in element], list(element.values())
        elif isinstance(element, (tuple, list)):
            structure, values = "tuple", list(element)
            names = [str(i) for i in range(len(values))]
        else:
            structure, names, values = "single", ["0"], [element]
        arrays = [np.asarray(v) for v in values]
        return cls(
            names=tuple(names),
            dtypes=tuple(a.dtype for a in arrays),
            shapes=tuple(tuple(a.shape[1:] if batched else a.shape) for a in arrays),
            structure=structure,
        )

    # -- (un)packing ----------------------------------------------------------

    def flatten(self, element: Any) -> list:
        """Returns the element's components as a list in declaration order."""
        if self.structure == "dict":
            if not isinstance(element, Mapping) or set(element) != set(self.names):
                got = sorted(element) if isinstance(element, Mapping) else type(element).__name__
                raise ValueError(
                    f"Expected a dict with keys {list(self.names)}. Received: {got}."
                )
            return [element[n] for n in self.names]
        if self.structure == "single":
            # TF1 accepted a 1-tuple of components as well as the tensor.
            if isinstance(element, tuple) and len(element) == 1:
                return [element[0]]
            return [element]
        if not isinstance(element, (tuple, list)) or len(element) != len(self.names):
            got = len(element) if isinstance(element, (tuple, list)) else type(element).__name__
            raise ValueError(
                f"Expected a tuple of {len(self.names)} components. Received: {got}."
            )
        return list(element)

    def pack(self, components: Sequence[Any]) -> Any:
        """Inverse of :meth:`flatten`."""
        if self.structure == "dict":
            return dict(zip(self.names, components))
        if self.structure == "single":
            return components[0]
        return tuple(components)

    def convert(self, components: Sequence[Any], batched: bool) -> list:
        """Converts components to numpy arrays of the declared dtype and checks shapes."""
        out = []
        for name, dtype, shape, value in zip(self.names, self.dtypes, self.shapes, components):
            arr = np.asarray(value, dtype=dtype)
            got = arr.shape[1:] if batched else arr.shape
            if batched and arr.ndim == 0:
                raise ValueError(
                    f"enqueue_many needs a leading batch dimension. Received: a "
                    f"scalar for component {name!r}."
                )
            if shape is not None and (
                len(got) != len(shape)
                or any(d is not None and d != g for d, g in zip(shape, got))
            ):
                raise ValueError(
                    f"Component {name!r} has per-example shape {list(got)}, which "
                    f"does not match the declared shape {list(shape)}. Received: "
                    f"shape={list(arr.shape)}{' (batched)' if batched else ''}."
                )
            out.append(arr)
        return out

    def declaration(self) -> tuple:
        """``(dtypes, shapes, names)`` that :meth:`from_declaration` turns back into this spec."""
        if self.structure == "single":
            return self.dtypes[0], self.shapes[0], None
        names = list(self.names) if self.structure == "dict" else None
        return list(self.dtypes), list(self.shapes), names

    def with_shapes(self, shapes: Sequence[Shape]) -> "ElementSpec":
        return dataclasses.replace(self, shapes=tuple(tuple(s) for s in shapes))

    # -- dict round trip (for the wire) ---------------------------------------

    def to_dict(self) -> dict:
        return {
            "names": list(self.names),
            "dtypes": [d.name for d in self.dtypes],
            "shapes": [None if s is None else list(s) for s in self.shapes],
            "structure": self.structure,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ElementSpec":
        return cls(
            names=tuple(d["names"]),
            dtypes=tuple(np.dtype(x) for x in d["dtypes"]),
            shapes=tuple(_to_shape(s) for s in d["shapes"]),
            structure=d["structure"],
        )
