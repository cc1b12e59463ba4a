"""Build hook for the compiled fast paths (native/); everything else is in pyproject.toml.

gpuremote._replay (native/replay.c): the daemon's loop over replayed calls.
gpuremote._forward (native/forward.c): the client's path for a call it already replays.

Both are optional: where no C compiler is found the install goes on without them, and the same
steps run in Python (gpuremote/daemon/session.py, gpuremote/cupy/_core.py), only slower."""

from setuptools import Extension, setup

setup(ext_modules=[Extension(f"gpuremote._{name}", [f"native/{name}.c"], optional=True, extra_compile_args=["-O2"])
                   for name in ("replay", "forward")])
