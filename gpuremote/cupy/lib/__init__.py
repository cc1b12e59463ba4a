"""cupy.lib: stride_tricks (sliding_window_view forwarded; as_strided refused, see there)."""

from gpuremote.cupy.lib import stride_tricks  # noqa: F401
