"""User CUDA kernels: RawKernel, RawModule, ElementwiseKernel, ReductionKernel.

Creating one only records its source (programs create kernels at import, on any machine).
Calling one sends the source with the launch; the daemon compiles it once per session and
caches it. The emulated backend cannot run CUDA code: the call raises CUDADeviceRequiredError.
"""

from __future__ import annotations

from gpuremote.cupy._core import _route, forward
from gpuremote.errors import CUDADeviceRequiredError


def _count_params(params: str) -> int:
    return len([p for p in params.split(",") if p.strip()])


def _check_backend(session, name: str) -> None:
    if session.backend != "cupy":
        raise CUDADeviceRequiredError(
            f"kernel {name!r} needs a CUDA device, but the daemon at {session.address} runs the "
            f"{session.backend} backend; run the daemon on a GPU host (gpuremote daemon --backend cupy)")


class RawKernel:
    def __init__(self, code: str, name: str, options=(), backend="nvrtc", translate_cucomplex=False,
                 enable_cooperative_groups=False, jitify=False, *, _module=None):
        if not isinstance(code, str) or not isinstance(name, str):
            raise TypeError("RawKernel needs the CUDA source and the kernel name as strings")
        self.code, self.name, self.options, self.backend = code, name, tuple(options), backend
        self._spec = {"code": code, "name": name, "options": list(self.options), "backend": backend,
                      "translate_cucomplex": bool(translate_cucomplex),
                      "enable_cooperative_groups": bool(enable_cooperative_groups), "jitify": bool(jitify)}
        if _module is not None:
            self._spec["name_expressions"] = list(_module)

    def __call__(self, grid, block, args, *, shared_mem=0):
        session, _, _ = _route(tuple(args), {})
        _check_backend(session, self.name)
        forward("kernel.raw", (self._spec, tuple(grid), tuple(block), tuple(args)), {"shared_mem": int(shared_mem)})


class RawModule:
    def __init__(self, code: str | None = None, path: str | None = None, options=(), backend="nvrtc",
                 translate_cucomplex=False, enable_cooperative_groups=False, name_expressions=None, jitify=False):
        if (code is None) == (path is None):
            raise TypeError("RawModule needs exactly one of code= and path=")
        if path is not None:
            with open(path) as f:
                code = f.read()
        self.code, self.options, self.backend = code, tuple(options), backend
        self.name_expressions = tuple(name_expressions or ())

    def get_function(self, name: str) -> RawKernel:
        return RawKernel(self.code, name, self.options, self.backend, _module=self.name_expressions)


class ElementwiseKernel:
    def __init__(self, in_params: str, out_params: str, operation: str, name: str = "kernel",
                 reduce_dims=True, preamble: str = "", no_return=False, return_tuple=False,
                 loop_prep: str = "", after_loop: str = "", options=()):
        self.name, self.nin, self.nout = name, _count_params(in_params), _count_params(out_params)
        self._spec = {"in_params": in_params, "out_params": out_params, "operation": operation, "name": name,
                      "reduce_dims": bool(reduce_dims), "preamble": preamble, "no_return": bool(no_return),
                      "return_tuple": bool(return_tuple), "loop_prep": loop_prep, "after_loop": after_loop,
                      "options": list(options)}

    def __call__(self, *args, size=None, block_size=None, **kwargs):
        session, _, _ = _route(args, kwargs)
        _check_backend(session, self.name)
        if len(args) not in (self.nin, self.nin + self.nout):
            raise TypeError(f"{self.name} takes {self.nin} inputs (and optionally {self.nout} outputs), "
                            f"got {len(args)} arguments")
        kw = {} if size is None else {"size": int(size)}
        if len(args) == self.nin + self.nout:
            forward("kernel.elementwise_into", (self._spec,) + args, kw)
            outs = args[self.nin:]
            return outs[0] if self.nout == 1 else outs
        return forward("kernel.elementwise", (self._spec,) + args, kw)


class ReductionKernel:
    def __init__(self, in_params: str, out_params: str, map_expr: str, reduce_expr: str, post_map_expr: str,
                 identity, name: str = "reduce_kernel", reduce_type=None, reduce_dims=True,
                 preamble: str = "", options=()):
        self.name = name
        self._spec = {"in_params": in_params, "out_params": out_params, "map_expr": map_expr,
                      "reduce_expr": reduce_expr, "post_map_expr": post_map_expr,
                      "identity": None if identity is None else str(identity), "name": name,
                      "reduce_type": reduce_type, "reduce_dims": bool(reduce_dims), "preamble": preamble,
                      "options": list(options)}

    def __call__(self, *args, out=None, axis=None, keepdims=False, stream=None):
        session, _, _ = _route(args, {})
        _check_backend(session, self.name)
        kw = {"axis": axis, "keepdims": bool(keepdims)}
        if out is not None:
            kw["out"] = out
        return forward("kernel.reduction", (self._spec,) + args, kw)
