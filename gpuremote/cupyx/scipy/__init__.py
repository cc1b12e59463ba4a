"""cupyx.scipy for gpuremote: the special functions."""

from gpuremote.cupyx.scipy import special  # noqa: F401
