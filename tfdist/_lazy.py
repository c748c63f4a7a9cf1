"""A package's public names, imported when first used (PEP 562 module ``__getattr__``).

``tfdist``, ``tfdist.data`` and ``tfdist.strategies`` name what they export
without importing it: a process that needs none of TensorFlow (a parameter
server, the launcher, the shared-queue server, the exit watchdog's module)
does not import it through a package's ``__init__``.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


def lazy_names(package: str, names: Mapping[str, str],
               namespace: dict) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``names`` maps each public name to the module it lives in.

    A name equal to its module's last component (``"ps": "tfdist.ps"``) is the
    module itself; any other is the module's attribute. The first use imports
    the module and stores the value in ``namespace`` (the package's
    ``globals()``), so later uses are plain lookups.
    """
    def __getattr__(name: str) -> Any:
        module_name = names.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(module_name)
        value = module if module_name.endswith("." + name) else getattr(module, name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return list(namespace.get("__all__") or sorted(names))

    return __getattr__, __dir__
