"""The CuPy backend: arrays on real GPUs.

Device i of the daemon is physical GPU `devices[i]`. Every op runs inside that device's
context and on the CUDA stream the client's stream id maps to (created on first use, per
session); the null stream is CuPy's current stream. Accounting charges each allocation's
pool block size (arr.data.mem.size), so views share their owner's bytes as on the emulated
backend. This is the only module of gpuremote that imports cupy.
"""

from __future__ import annotations

import contextlib
import importlib
import re
from typing import Any

import numpy

from gpuremote.daemon.backends.base import Backend, DeviceProps, special_function

_RANDOM_ALIASES = {"random": "random_sample", "ranf": "random_sample", "sample": "random_sample"}


MIN_CUPY = (14, 0)


def check_cupy_version(version: str) -> None:
    """Refuse a CuPy older than 14: clients derive result dtypes with NumPy 2's promotion rules
    (NEP 50), which CuPy follows from 14 on; CuPy 13 promotes scalars by value (float32 array +
    numpy.float64 scalar is float32 there, float64 here), and a client would describe its results
    with the wrong dtype."""
    found = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
    if found < MIN_CUPY:
        raise RuntimeError(f"the cupy backend needs CuPy 14 or newer (found {version}): clients derive result "
                           "dtypes with NumPy 2's type promotion, which CuPy follows from version 14. "
                           "Upgrade it on this host: pip install -U 'cupy-cuda12x>=14' (or 'gpuremote[gpu]')")


class CupyRandom:
    """cupy.random.RandomState with the module-level aliases (random, ranf, sample) resolved."""

    def __init__(self, cupy, seed):
        self._rs = cupy.random.RandomState(seed)

    def __getattr__(self, name):
        return getattr(self._rs, _RANDOM_ALIASES.get(name, name))


class CupyBackend(Backend):
    kind = "cupy"
    scoped = True       # activate() makes the op's device and stream current

    def __init__(self, devices: list[int] | None = None):
        import cupy
        check_cupy_version(cupy.__version__)
        self.xp = cupy
        self._cupy = cupy
        self.array_type = cupy.ndarray
        count = cupy.cuda.runtime.getDeviceCount()
        if count == 0:
            raise RuntimeError("no CUDA device found")
        self.physical = list(range(count)) if devices is None else list(devices)
        bad = [d for d in self.physical if not 0 <= d < count]
        if bad:
            raise ValueError(f"device(s) {bad} do not exist: this host has {count} GPU(s) (0..{count - 1})")
        props = []
        for i, phys in enumerate(self.physical):
            p = cupy.cuda.runtime.getDeviceProperties(phys)
            name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
            props.append(DeviceProps(i, name, int(p["totalGlobalMem"]), f"{p['major']}{p['minor']}",
                                     int(p["multiProcessorCount"])))
        self._free_events: dict[int, list] = {}
        super().__init__(props)

    def is_array(self, obj: Any) -> bool:
        return isinstance(obj, self._cupy.ndarray)

    def owner(self, arr):
        mem = getattr(arr.data, "mem", None)
        if mem is None:
            return arr, 0
        return mem, int(mem.size)

    def from_host(self, arr, device, owned=False):
        return self._cupy.asarray(arr)  # runs inside activate(): lands on the op's device and stream

    def to_host(self, arr, out=None):
        return arr.get(out=out)     # runs inside activate(): on the op's stream, blocking

    def empty(self, shape, dtype, device):
        return self._cupy.empty(shape, dtype)

    def resolve(self, name):
        if name.startswith("scipy.special."):
            import cupyx.scipy.special
            return special_function(getattr(cupyx.scipy.special, name.rpartition(".")[2]), self.is_array)
        if name.startswith("lib."):     # a submodule `import cupy` does not import
            importlib.import_module("cupy." + name.rpartition(".")[0])
        obj: Any = self._cupy
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj

    def _stream(self, device: int, stream: int, streams: dict):
        if stream == 0:
            return None
        s = streams.get((device, stream))
        if s is None:
            with self._cupy.cuda.Device(self.physical[device]):
                s = streams[(device, stream)] = self._cupy.cuda.Stream(non_blocking=True)
        return s

    def activate(self, device, stream, streams):
        stack = contextlib.ExitStack()
        stack.enter_context(self._cupy.cuda.Device(self.physical[device]))
        s = self._stream(device, stream, streams)
        if s is not None:
            stack.enter_context(s)
        return stack

    def synchronize(self, device, stream, streams):
        with self._cupy.cuda.Device(self.physical[device]) as dev:
            if stream is None:
                dev.synchronize()
                return
            s = self._stream(device, stream, streams)
            (s or self._cupy.cuda.get_current_stream()).synchronize()

    def record_event(self, device, stream, streams):
        with self._cupy.cuda.Device(self.physical[device]):
            event = self._cupy.cuda.Event()
            event.record(self._stream(device, stream, streams))
            return event

    def elapsed_ms(self, start, end):
        end.synchronize()
        return float(self._cupy.cuda.get_elapsed_time(start, end))

    def event_done(self, event):
        return bool(event.done)

    # Device time for the compute scheduler: a pair of CUDA events around each op, on the op's
    # stream, read once the GPU passed the second (launches return before the work is done).
    def _timing_event(self, device):
        try:
            return self._free_events.setdefault(device, []).pop()   # atomic: sessions share the list
        except IndexError:
            return self._cupy.cuda.Event()

    def time_begin(self, device, stream, streams):
        with self._cupy.cuda.Device(self.physical[device]):
            start = self._timing_event(device)
            start.record(self._stream(device, stream, streams) if streams is not None else None)
        return device, start

    def time_end(self, mark, device, stream, streams):
        with self._cupy.cuda.Device(self.physical[device]):
            end = self._timing_event(device)
            end.record(self._stream(device, stream, streams) if streams is not None else None)
        return mark[0], mark[1], end

    def time_poll(self, pending, block=False):
        device, start, end = pending
        if not block and not end.done:
            return None
        end.synchronize()
        seconds = float(self._cupy.cuda.get_elapsed_time(start, end)) / 1e3
        free = self._free_events.setdefault(device, [])
        if len(free) < 256:   # events are reused: creating one per op costs more than the op's launch
            free.extend((start, end))
        return seconds

    def mem_info(self, device):
        with self._cupy.cuda.Device(self.physical[device]):
            free, total = self._cupy.cuda.runtime.memGetInfo()
        mem = self.memory[device]
        return min(int(free), mem.capacity - mem.used), int(total)

    def random_state(self, seed):
        return CupyRandom(self._cupy, seed)

    def generator(self, seed):
        return self._cupy.random.default_rng(seed)

    def kernel(self, kind, spec):
        cp = self._cupy
        if kind == "raw":
            options = tuple(spec.get("options") or ())
            if spec.get("name_expressions") is not None:
                module = cp.RawModule(code=spec["code"], options=options, backend=spec.get("backend", "nvrtc"),
                                      name_expressions=list(spec["name_expressions"]) or None,
                                      jitify=bool(spec.get("jitify")))
                k = module.get_function(spec["name"])
            else:
                k = cp.RawKernel(spec["code"], spec["name"], options=options, backend=spec.get("backend", "nvrtc"),
                                 translate_cucomplex=bool(spec.get("translate_cucomplex")),
                                 enable_cooperative_groups=bool(spec.get("enable_cooperative_groups")),
                                 jitify=bool(spec.get("jitify")))

            def launch(grid, block, args, shared_mem=0):
                k(tuple(grid), tuple(block), tuple(_kernel_arg(a) for a in args), shared_mem=shared_mem)
            return launch
        if kind == "elementwise":
            return cp.ElementwiseKernel(spec["in_params"], spec["out_params"], spec["operation"], spec["name"],
                                        reduce_dims=spec["reduce_dims"], preamble=spec["preamble"],
                                        no_return=spec["no_return"], return_tuple=spec["return_tuple"],
                                        loop_prep=spec["loop_prep"], after_loop=spec["after_loop"],
                                        options=tuple(spec["options"]))
        if kind == "reduction":
            return cp.ReductionKernel(spec["in_params"], spec["out_params"], spec["map_expr"], spec["reduce_expr"],
                                      spec["post_map_expr"], spec["identity"], spec["name"],
                                      reduce_type=spec["reduce_type"], reduce_dims=spec["reduce_dims"],
                                      preamble=spec["preamble"], options=tuple(spec["options"]))
        raise ValueError(f"unknown kernel kind {kind!r}")


def _kernel_arg(a):
    """RawKernel arguments: device arrays as they are, NumPy scalars as they are, Python numbers
    as the C types CuPy would infer (int -> int64 would be wrong for `int` parameters, so users
    pass numpy scalars, as with CuPy itself)."""
    if isinstance(a, numpy.ndarray) and a.ndim == 0:
        return a[()]
    return a
