"""Typed key-value state: :class:`Store` over the host's stores (RocksDB and a compacted
changelog topic per store, so state survives crashes and moves with its task)."""

from __future__ import annotations

from typing import Iterator, Optional

from . import _host
from ._core import Error
from .codec import Bytes, Codec, CodecError, Str
from .codec.ordered import Tuple

__all__ = ["Store", "Scan"]

#: How many entries a scan fetches from the host per call.
PAGE = 256


class Store:
    """A store the topology declared, with keys and values in the given codecs:
    ``Store("counts", key=Str, value=U64)``. Open it in ``init`` and keep it.

    Entries are kept in the byte order of their encoded keys and scans return them in that
    order: for ``Tuple`` and ``Ordered`` keys it is the order of the values."""

    __slots__ = ("name", "key_codec", "value_codec", "_inner")

    def __init__(self, name: str, key: Codec = Bytes, value: Codec = Bytes):
        self.name = name
        self.key_codec = key
        self.value_codec = value
        try:
            self._inner = _host.backend().open_store(name)
        except _host.StoreFailure as e:
            raise Error(f"store {name!r}: {e}") from None

    def _fail(self, e) -> Error:
        return Error(f"store {self.name!r}: {e}")

    def _key(self, key) -> bytes:
        try:
            return self.key_codec.encode(key)
        except CodecError as e:
            raise Error(f"store {self.name!r}: encoding a key: {e}") from None

    def _value(self, value) -> bytes:
        try:
            return self.value_codec.encode(value)
        except CodecError as e:
            raise Error(f"store {self.name!r}: encoding a value: {e}") from None

    def _decode(self, codec: Codec, what: str, data: bytes):
        try:
            return codec.decode(data)
        except CodecError as e:
            raise Error(f"store {self.name!r}: decoding a {what}: {e}") from None

    def get(self, key, default=None):
        """The value under ``key``, or ``default``."""
        try:
            found = self._inner.get(self._key(key))
        except _host.StoreFailure as e:
            raise self._fail(e) from None
        return default if found is None else self._decode(self.value_codec, "value", found)

    def put(self, key, value) -> None:
        k, v = self._key(key), self._value(value)
        try:
            self._inner.put(k, v)
        except _host.StoreFailure as e:
            raise self._fail(e) from None

    def delete(self, key) -> None:
        k = self._key(key)
        try:
            self._inner.delete(k)
        except _host.StoreFailure as e:
            raise self._fail(e) from None

    def write_batch(self, entries) -> None:
        """Puts (a value) and deletes (None) several entries in one call to the host:
        ``entries`` is an iterable of (key, value or None)."""
        encoded = [(self._key(k), None if v is None else self._value(v)) for k, v in entries]
        try:
            self._inner.write_batch(encoded)
        except _host.StoreFailure as e:
            raise self._fail(e) from None

    def range(self, start=None, end=None) -> "Scan":
        """Entries with ``start <= key < end`` (None leaves a bound open), in key order."""
        s = None if start is None else self._key(start)
        e = None if end is None else self._key(end)
        try:
            return Scan(self, self._inner.range(s, e))
        except _host.StoreFailure as err:
            raise self._fail(err) from None

    def prefix(self, prefix) -> "Scan":
        """Entries whose key starts with ``prefix``: leading elements (a shorter tuple) of a
        ``Tuple`` key, text a ``Str`` key starts with, bytes for a ``Bytes`` key."""
        codec = self.key_codec
        try:
            if isinstance(codec, Tuple):
                raw = codec.encode_prefix(prefix)
            elif codec is Str:
                raw = Str.encode(prefix)
            elif codec is Bytes:
                raw = Bytes.encode(prefix)
            else:
                raise Error(f"store {self.name!r}: a {codec!r} key has no prefixes; use prefix_bytes")
        except CodecError as e:
            raise Error(f"store {self.name!r}: encoding a key prefix: {e}") from None
        return self.prefix_bytes(raw)

    def prefix_bytes(self, prefix: bytes) -> "Scan":
        """Entries whose *encoded* key starts with the bytes ``prefix``."""
        try:
            return Scan(self, self._inner.prefix(bytes(prefix)))
        except _host.StoreFailure as e:
            raise self._fail(e) from None

    def delete_range(self, start=None, end=None) -> int:
        """Deletes every entry with ``start <= key < end`` and returns how many there were.
        It scans the range a page at a time and deletes each page in one write batch: every
        entry costs a read and a changelog tombstone (see the Rust SDK's ``delete_range``)."""
        s = None if start is None else self._key(start)
        e = None if end is None else self._key(end)
        deleted = 0
        try:
            scan = self._inner.range(s, e)
            while True:
                page = scan.next_page(PAGE)
                if not page:
                    return deleted
                deleted += len(page)
                self._inner.write_batch([(k, None) for k, _ in page])
        except _host.StoreFailure as err:
            raise self._fail(err) from None


class Scan:
    """The (key, value) entries of a range or prefix scan, fetched a page at a time."""

    __slots__ = ("_store", "_inner", "_page", "_at", "_done")

    def __init__(self, store: Store, inner):
        self._store = store
        self._inner = inner
        self._page = []
        self._at = 0
        self._done = False

    def __iter__(self) -> Iterator:
        return self

    def __next__(self):
        while True:
            if self._at < len(self._page):
                k, v = self._page[self._at]
                self._at += 1
                store = self._store
                return store._decode(store.key_codec, "key", k), store._decode(store.value_codec, "value", v)
            if self._done:
                raise StopIteration
            try:
                self._page = self._inner.next_page(PAGE)
            except _host.StoreFailure as e:
                self._done = True
                raise self._store._fail(e) from None
            self._at = 0
            if not self._page:
                self._done = True
