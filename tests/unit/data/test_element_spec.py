"""ElementSpec: declaration, inference, (un)packing and checks."""

import numpy as np
import pytest

from tfdist.data.element_spec import ElementSpec, to_numpy_dtype
from tfdist.errors import ConfigError


def test_declaration_kinds():
    single = ElementSpec.from_declaration("float32", [3])
    assert single.structure == "single" and single.shapes == ((3,),)
    tup = ElementSpec.from_declaration(["float32", "int64"], [[2], []])
    assert tup.structure == "tuple" and tup.names == ("0", "1")
    d = ElementSpec.from_declaration(["float32", "int64"], [[2], []], names=["x", "y"])
    assert d.structure == "dict" and d.pack([1, 2]) == {"x": 1, "y": 2}


def test_tf_dtype_duck_typing_without_tensorflow():
    class FakeDType:
        as_numpy_dtype = np.float16

    assert to_numpy_dtype(FakeDType()) == np.float16
    with pytest.raises(ConfigError, match="Unknown dtype"):
        to_numpy_dtype("no-such-type")


def test_mismatched_declaration_says_what_was_received():
    with pytest.raises(ConfigError, match="Received: dtypes"):
        ElementSpec.from_declaration(["float32", "int64"], [[2]])
    with pytest.raises(ConfigError, match="names"):
        ElementSpec.from_declaration(["float32"], names=["a", "b"])


def test_convert_checks_shapes_and_batch_dimension():
    spec = ElementSpec.from_declaration(["float32", "int64"], [[2], []])
    a, b = spec.convert(spec.flatten(([1, 2], 3)), batched=False)
    assert a.dtype == np.float32 and b.dtype == np.int64
    with pytest.raises(ValueError, match=r"declared shape \[2\]"):
        spec.convert(spec.flatten(([1, 2, 3], 3)), batched=False)
    with pytest.raises(ValueError, match="leading batch dimension"):
        spec.convert(spec.flatten(([[1, 2]], 3)), batched=True)
    with pytest.raises(ValueError, match="tuple of 2"):
        spec.flatten(([1, 2],))


def test_infer_and_dict_round_trip():
    spec = ElementSpec.infer({"x": np.zeros((4, 3), np.float32), "y": np.arange(4)}, batched=True)
    assert spec.structure == "dict" and spec.shapes == ((3,), ())
    assert ElementSpec.from_dict(spec.to_dict()) == spec
