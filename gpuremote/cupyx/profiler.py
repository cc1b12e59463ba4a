"""cupyx.profiler for gpuremote: benchmark (host and device time of a function) and time_range.

benchmark times each call twice: on the host with perf_counter around the call, and on each device
with a pair of cupy.cuda.Event records around it. The daemon records the events in the op stream,
so a device time is that of the call's ops on the daemon's device, with no network in it. Calls are
asynchronous here as in CuPy, so the host time is the time to issue the call's ops.
"""

from __future__ import annotations

import functools
import math
import numbers
import time

import numpy

import gpuremote.cupy as _cupy

__all__ = ["benchmark", "time_range"]


def _line(label: str, seconds: numpy.ndarray) -> str:
    us = seconds * 1e6
    text = f"    {label}:{us.mean():9.3f} us"
    if us.size > 1:
        text += f"   +/-{us.std():6.3f} (min:{us.min():9.3f} / max:{us.max():9.3f}) us"
    return text


class BenchmarkResult:
    """The times benchmark measured, in seconds: `cpu_times` (one per call) and `gpu_times` (a row
    per device). Printed, one line: the name, then mean, spread, min and max of each, as CuPy's."""

    def __init__(self, name: str, cpu_times: list, gpu_times: list, devices: tuple):
        self.name = name
        self.cpu_times = numpy.asarray(cpu_times, dtype=numpy.float64)
        self.gpu_times = numpy.asarray(gpu_times, dtype=numpy.float64).reshape(len(devices), -1)
        self.devices = devices

    def to_str(self, show_gpu: bool = False) -> str:
        parts = [_line("CPU", self.cpu_times)]
        if show_gpu:
            parts += [_line(f"GPU-{d}", row) for d, row in zip(self.devices, self.gpu_times)]
        return f"{self.name:<20s}:" + " ".join(parts)

    def __str__(self) -> str:
        return self.to_str(show_gpu=True)

    __repr__ = __str__


def _count(value, what: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"benchmark: {what} must be an integer of at least {least}, not {value!r}")
    return int(value)


def benchmark(func, args=(), kwargs=None, n_repeat=10000, *, name=None, n_warmup=10, max_duration=math.inf,
              devices=None) -> BenchmarkResult:
    """Time func(*args, **kwargs): n_warmup untimed calls, then up to n_repeat timed ones, stopping
    early once max_duration seconds have gone by. Each timed call is measured on the host and on
    each of `devices` (process device ids; the current device by default).

    Reading a call's device time waits for its end event, so every repeat is a sync point with each
    device's daemon (a round trip) besides the call's own ops.
    """
    if not callable(func):
        raise ValueError(f"benchmark: func must be callable, not {type(func).__name__}")
    if not isinstance(args, tuple) or not isinstance(kwargs, (dict, type(None))):
        raise ValueError("benchmark: args must be a tuple and kwargs a dict")
    n_repeat, n_warmup = _count(n_repeat, "n_repeat", 1), _count(n_warmup, "n_warmup", 0)
    if isinstance(max_duration, bool) or not isinstance(max_duration, numbers.Real) or math.isnan(max_duration):
        raise ValueError(f"benchmark: max_duration must be a number of seconds, not {max_duration!r}")
    name = getattr(func, "__name__", "function") if name is None else name
    if not isinstance(name, str):
        raise ValueError(f"benchmark: name must be a string, not {type(name).__name__}")
    devices = (_cupy.cuda.get_device_id(),) if devices is None else devices
    if not isinstance(devices, tuple):
        raise ValueError("benchmark: devices must be a tuple of device ids")
    kwargs = kwargs or {}

    def record(events):
        for event, device in zip(events, devices):
            with _cupy.cuda.Device(device):
                event.record()

    before, after = [_cupy.cuda.Event() for _ in devices], [_cupy.cuda.Event() for _ in devices]
    for _ in range(n_warmup):
        func(*args, **kwargs)
    record(before)
    for event in before:            # the warm-up's ops are done before the first timed call
        event.synchronize()
    cpu, gpu = [], [[] for _ in devices]
    spent = 0.0
    for _ in range(n_repeat):
        record(before)
        start = time.perf_counter()
        func(*args, **kwargs)
        cpu.append(time.perf_counter() - start)
        record(after)
        for times, b, a in zip(gpu, before, after):
            times.append(_cupy.cuda.get_elapsed_time(b, a) * 1e-3)     # waits for `a`
        spent += time.perf_counter() - start
        if spent > max_duration:
            break
    return BenchmarkResult(name, cpu, gpu, devices)


class time_range:
    """A named range of code (`with time_range("step"):`) or of each call of a function
    (`@time_range()`) for a profiler's timeline, CuPy's NVTX range.

    An NVTX range only shows in a CUDA profiler attached to the process, and changes nothing the
    program computes. This process has no CUDA context (its device work runs in the daemon), so
    here the range marks nothing: it takes CuPy's arguments and, with sync=True, waits for the
    current device on entry and exit as CuPy's does, so code written for CuPy runs unchanged.
    Profile the daemon's process to see its device work.
    """

    def __init__(self, message=None, color_id=None, argb_color=None, sync=False):
        if color_id is not None and argb_color is not None:
            raise ValueError("time_range: give color_id or argb_color, not both")
        self.message, self.color_id, self.argb_color, self.sync = message, color_id, argb_color, sync

    def __enter__(self):
        if self.message is None:
            raise ValueError("time_range: a range used with `with` needs a message")
        if self.sync:
            _cupy.cuda.Device().synchronize()
        return self

    def __exit__(self, *exc):
        if self.sync:
            _cupy.cuda.Device().synchronize()

    def __call__(self, func):
        ranged = time_range(func.__name__ if self.message is None else self.message, self.color_id,
                            self.argb_color, self.sync)

        @functools.wraps(func)
        def inner(*args, **kwargs):
            with ranged:
                return func(*args, **kwargs)
        return inner
