"""A memo table with a size bound, for the caches on the per-op hot paths.

Loops repeat the same shapes, signatures and source lines, so a dict lookup replaces work that
costs microseconds; a program that never repeats must not grow the table without end. When a
table is full it forgets everything (cheaper than tracking recency, and a loop refills it within
one iteration). Reads are plain dict reads (`get`), at dict speed.
"""

from __future__ import annotations

from typing import Any


class Memo(dict):
    """A dict that forgets all its entries when `put` finds it holding `limit` of them."""

    __slots__ = ("limit",)

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def put(self, key: Any, value: Any) -> Any:
        """Remember `value` under `key` and return it."""
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        return value
