"""Subscribing to straggler verdicts: a listener base class and a dispatcher.

Anything that acts on verdicts — a user's hook, a strategy that stops
waiting for a straggler, a partial all-reduce that leaves it out — is a
:class:`StragglerListener` (subclass it and override the hooks it needs) or
a pair of plain callables. :class:`EventDispatcher` hands every
:class:`~tfdist.straggler.verdicts.StragglerEvent` to each of them, in the
order they subscribed. Exceptions raised by a listener propagate: a broken
hook stops training instead of failing silently.

Example:

>>> seen = []
>>> bus = EventDispatcher()
>>> _ = bus.subscribe(on_detected=lambda worker, info: seen.append(worker))
>>> from tfdist.straggler.verdicts import DetectorName, EventKind, StragglerEvent
>>> bus.dispatch([StragglerEvent(EventKind.DETECTED, 2, DetectorName.EWMA, 0, 9, 9, None, 0.5, 0.8)])
>>> seen
[2]
"""

from __future__ import annotations

from typing import Callable, Iterable

from tfdist.straggler.verdicts import EventKind, StragglerEvent

__all__ = ["StragglerListener", "EventDispatcher", "Hook"]

#: A hook: ``hook(worker_id, event)``.
Hook = Callable[[int, StragglerEvent], None]


class StragglerListener:
    """Receives straggler events. Override the hooks you need; both do nothing by default."""

    def on_straggler_detected(self, worker: int, info: StragglerEvent) -> None:
        """Called when ``worker`` becomes a straggler; ``info`` says which rule, when, and why."""

    def on_straggler_recovered(self, worker: int, info: StragglerEvent) -> None:
        """Called when straggler ``worker`` is normal again."""


class _CallableListener(StragglerListener):
    def __init__(self, on_detected: Hook | None, on_recovered: Hook | None):
        self._detected, self._recovered = on_detected, on_recovered

    def on_straggler_detected(self, worker, info):
        if self._detected is not None:
            self._detected(worker, info)

    def on_straggler_recovered(self, worker, info):
        if self._recovered is not None:
            self._recovered(worker, info)

    def __repr__(self) -> str:
        return f"CallableListener(on_detected={self._detected!r}, on_recovered={self._recovered!r})"


class EventDispatcher:
    """Delivers events to subscribed listeners, in subscription order."""

    def __init__(self):
        self._listeners: list[StragglerListener] = []

    @property
    def listeners(self) -> tuple[StragglerListener, ...]:
        return tuple(self._listeners)

    def subscribe(
        self,
        listener: StragglerListener | None = None,
        *,
        on_detected: Hook | None = None,
        on_recovered: Hook | None = None,
    ) -> StragglerListener:
        """Adds a listener object, or a pair of callables ``hook(worker, info)``.

        Returns:
            The listener added (pass it to :meth:`unsubscribe`).

        Raises:
            TypeError: neither a listener nor a callable was given, or a hook
                is not callable.
        """
        if listener is None:
            for name, hook in (("on_detected", on_detected), ("on_recovered", on_recovered)):
                if hook is not None and not callable(hook):
                    raise TypeError(f"`{name}` must be callable as hook(worker, info). Received: {name}={hook!r}.")
            if on_detected is None and on_recovered is None:
                raise TypeError("Give a StragglerListener, or on_detected= / on_recovered= callables.")
            listener = _CallableListener(on_detected, on_recovered)
        elif not all(hasattr(listener, h) for h in ("on_straggler_detected", "on_straggler_recovered")):
            raise TypeError(
                "A listener needs on_straggler_detected(worker, info) and on_straggler_recovered(worker, info) "
                f"(subclass tfdist.straggler.StragglerListener). Received: {listener!r}."
            )
        self._listeners.append(listener)
        return listener

    def unsubscribe(self, listener: StragglerListener) -> None:
        """Removes a listener; unknown listeners are ignored."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    def dispatch(self, events: Iterable[StragglerEvent]) -> None:
        """Calls each listener's hook for each event."""
        for event in events:
            for listener in list(self._listeners):
                if event.kind is EventKind.DETECTED:
                    listener.on_straggler_detected(event.worker, event)
                else:
                    listener.on_straggler_recovered(event.worker, event)
