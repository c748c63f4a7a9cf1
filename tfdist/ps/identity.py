"""A variable's identity in a job: its creation order and its path with Keras's auto-name counters renumbered.

Keras names an object without a name from a per-process counter
(``dense``, ``dense_1``, …; ``adam``, ``adam_1``, …). An object created
*outside* the model (an optimizer or a layer a script builds first, on the
chief only) shifts those counters, so the same model gets
``sequential/dense_1/kernel`` in one process and ``sequential/dense/kernel``
in another. :class:`CanonicalNames` removes that dependence: every path
component ``base`` or ``base_N`` (the variable's own name too: a weight
created without a name is ``variable_N``) is renumbered by the order in which the
job's own variables first name it (the first ``dense*`` seen becomes
``dense``, the second ``dense_1``, …), and the flattened paths inside
optimizer slot names (``adam_1/sequential_dense_1_kernel_momentum``) follow
the same map. Two workers that create the same variables in the same order
get the same names, whatever they created before; a fresh process that
builds only the model gets exactly these names from Keras, which is what
:func:`tfdist.checkpoint.load_into` matches them against.

Pure string logic, no TensorFlow.
"""

from __future__ import annotations

import re

__all__ = ["CanonicalNames"]

_COUNTER = re.compile(r"^(?P<base>.*?)(?:_(?P<n>\d+))?$")


class CanonicalNames:
    """Renumbers Keras's auto-name counters in variable paths, in the order names are first seen.

    Example:

    >>> names = CanonicalNames()        # the chief built Dense and Adam once before the model
    >>> names.canonical("sequential/dense_1/kernel")
    'sequential/dense/kernel'
    >>> names.canonical("sequential/dense_2/kernel")
    'sequential/dense_1/kernel'
    >>> names.canonical("adam_1/sequential_dense_2_kernel_momentum")
    'adam/sequential_dense_1_kernel_momentum'

    Feed every variable of the job once, in creation order: the map depends
    on that order (and only on it).
    """

    def __init__(self):
        #: base → the original components seen with that base, in order (their index is the new counter).
        self._seen: dict[str, list[str]] = {}
        #: original component → canonical component.
        self._map: dict[str, str] = {}
        self._embedded: re.Pattern | None = None

    def _component(self, part: str) -> str:
        known = self._map.get(part)
        if known is not None:
            return known
        base = _COUNTER.match(part).group("base") or part
        seen = self._seen.setdefault(base, [])
        seen.append(part)
        canonical = base if len(seen) == 1 else f"{base}_{len(seen) - 1}"
        self._map[part] = canonical
        self._embedded = None
        return canonical

    def _leaf(self, leaf: str) -> str:
        """The variable's own name, with the paths flattened into it (optimizer slots) renumbered."""
        renamed = {k: v for k, v in self._map.items() if k != v}
        if not renamed:
            return leaf
        if self._embedded is None:
            alternatives = "|".join(re.escape(k) for k in sorted(renamed, key=len, reverse=True))
            self._embedded = re.compile(rf"(?:(?<=_)|^)({alternatives})(?=_|$)")
        return self._embedded.sub(lambda m: renamed[m.group(1)], leaf)

    def canonical(self, name: str) -> str:
        """``name`` (a variable path, ``/``-separated) with its counters renumbered; records new components."""
        *scopes, leaf = name.split("/")
        own = self._component(leaf)  # a weight created without a name: ``variable``, ``variable_1``, …
        return "/".join([*(self._component(p) for p in scopes), own if own != leaf else self._leaf(leaf)])
