"""cupy.cuda.memory: OutOfMemoryError and the memory pool view of the current session.

The daemon frees an array's memory as soon as its last reference is released, so the pool
holds no cached blocks: used_bytes() == total_bytes() and free_all_blocks() has nothing to do.
"""

from __future__ import annotations

from gpuremote.cupy._core import service_call
from gpuremote.errors import OutOfMemoryError  # noqa: F401


class MemoryPool:
    def used_bytes(self) -> int:
        """Bytes this process's session holds on the current device."""
        return int(service_call("cuda.MemoryPool.used_bytes", value=True))

    def total_bytes(self) -> int:
        return int(service_call("cuda.MemoryPool.total_bytes", value=True))

    def free_bytes(self) -> int:
        return 0

    def n_free_blocks(self) -> int:
        return 0

    def free_all_blocks(self, stream=None) -> None:
        service_call("cuda.MemoryPool.free_all_blocks")

    def get_limit(self) -> int:
        return int(service_call("cuda.runtime.memGetInfo", value=True)[1])


_DEFAULT = MemoryPool()


def get_default_memory_pool() -> MemoryPool:
    return _DEFAULT
