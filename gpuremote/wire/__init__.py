"""The wire: generated messages (gpuremote.v1) and the value codec that fills them."""

from gpuremote.v1 import daemon_pb2 as pb
from gpuremote.v1 import value_pb2 as vpb

__all__ = ["pb", "vpb"]
