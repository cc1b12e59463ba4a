"""Build hook for the one compiled module, gpuremote._native (native/replay.c: the daemon's replay
loop). Everything else is in pyproject.toml. The module is optional: where no C compiler is found the
install goes on without it and the daemon runs the same loop in Python (gpuremote/daemon/session.py)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("gpuremote._native", ["native/replay.c"], optional=True,
                             extra_compile_args=["-O2"])])
