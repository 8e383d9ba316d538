"""Where the host's calls go: the component's imports (``wit_world``) inside a component, or
the in-memory host of :mod:`sluice_guest.testing` when a topology runs under plain CPython.

A backend has ``log(level, message)``, ``now_ms()`` and ``open_store(name)``; a store has
``get``, ``put``, ``delete``, ``write_batch``, ``range``, ``prefix`` (bytes in and out, a scan
with ``next_page(max)`` giving (key, value) pairs) and raises :class:`StoreFailure`."""

from __future__ import annotations


class StoreFailure(Exception):
    """The host refused a store call: an undeclared store, or its storage failed."""


_backend = None


def set_backend(backend):
    """Replaces the backend (the test driver's); returns the one before."""
    global _backend
    previous, _backend = _backend, backend
    return previous


def backend():
    global _backend
    if _backend is None:
        _backend = _ComponentHost()
    return _backend


class _ComponentHost:
    """The host of a component: the WIT imports, through componentize-py's bindings.

    Made when the component is built (``_component`` makes it at import): a component's
    Python is a snapshot of the interpreter taken at build time, and a module not imported
    then cannot be imported while it runs (it has no files)."""

    def __init__(self):
        try:
            from componentize_py_types import Err
            from wit_world.imports import host, state
            from wit_world.imports import sluice_topology_types_0_1_0 as types
        except ImportError:
            raise RuntimeError(
                "no Sluice host here: a topology's code runs in a component built by `sluice build`, "
                "or under plain Python through sluice_guest.testing.TestDriver"
            ) from None
        self._host = host
        self._state = state
        self._err = Err
        self._levels = [types.Level.TRACE, types.Level.DEBUG, types.Level.INFO, types.Level.WARN, types.Level.ERROR]

    def log(self, level: int, message: str):
        self._host.log(self._levels[max(0, min(4, int(level)))], message)

    def now_ms(self) -> int:
        return self._host.now_ms()

    def open_store(self, name: str):
        return _ComponentStore(self._state, self._err, name)


def _state_error(err) -> StoreFailure:
    value = getattr(err, "value", err)
    return StoreFailure(getattr(value, "value", str(value)))


class _ComponentStore:
    __slots__ = ("_inner", "_err")

    def __init__(self, state, err, name: str):
        self._err = err
        try:
            self._inner = state.Store.open(name)
        except err as e:
            raise _state_error(e) from None

    def _call(self, method, *args):
        try:
            return method(*args)
        except self._err as e:
            raise _state_error(e) from None

    def get(self, key: bytes):
        return self._call(self._inner.get, key)

    def put(self, key: bytes, value: bytes):
        self._call(self._inner.put, key, value)

    def delete(self, key: bytes):
        self._call(self._inner.delete, key)

    def write_batch(self, entries):
        self._call(self._inner.write_batch, entries)

    def range(self, start, end):
        return _ComponentScan(self, self._call(self._inner.range, start, end))

    def prefix(self, prefix: bytes):
        return _ComponentScan(self, self._call(self._inner.prefix, prefix))


class _ComponentScan:
    __slots__ = ("_store", "_inner")

    def __init__(self, store, inner):
        self._store = store
        self._inner = inner

    def next_page(self, max_entries: int):
        page = self._store._call(self._inner.next_page, max_entries)
        return [(e.key, e.value) for e in page]
