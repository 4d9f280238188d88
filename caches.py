"""Small caches every part may use: values by key, the least recently used dropped past a size."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

V = TypeVar("V")


class LruCache(Generic[V]):
    """Values by key, the least recently used dropped past ``size``; built outside the lock (two
    threads may build one value, which is pure, at once). Holds the compiled filters and views."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._items: OrderedDict[tuple[str, ...], V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, ...], build: Callable[[], V]) -> V:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = build()
        with self._lock:
            self._items[key] = value
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return value
