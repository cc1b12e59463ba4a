"""The API surface: every CuPy name gpuremote forwards, listed once.

The client builds `gpuremote.cupy` from this table and the daemon refuses any call whose
name is not in it (DESIGN decision 2). Each entry names the metadata rule (`gpuremote.meta`)
that derives the result's shape and dtype on the client without a round trip:

  elementwise  broadcast of the array arguments; dtype from NumPy's own promotion
  reduce       axis/keepdims rule (sum, max, argmax, std, ...)
  accumulate   cumsum-like: same shape, or flat when axis is None
  matmul, dot  the matrix product rules
  view         computed by NumPy on zero-strided stand-ins (O(1): transpose, reshape, indexing)
  ravel        flat copy of the input
  creation     shape from an argument (zeros, full, eye, arange, ...)
  like         shape of an array argument (zeros_like, ...)
  random       shape from `size`
  probe        computed by NumPy on small zero stand-ins; unknown (fetched on demand) for large inputs
  dynamic      depends on the data (nonzero, unique, boolean masks): fetched on demand
  none         returns nothing (in-place writes, seeding)
  self         in-place operator: returns its first argument
  special      cupyx.scipy.special: broadcast of the arguments; float32 for float32 arrays, else float64
  generator    a cupy.random.Generator method: shape from `size`, dtype from `dtype` (GENERATOR_METHODS)
  value        returns a host value to the caller (a sync point)
"""

from __future__ import annotations

import dataclasses


def is_service(name: str) -> bool:
    """Names the daemon serves itself (device queries, events, kernels, item) rather than by
    calling an array function or method; they are never call templates."""
    return name.startswith(("cuda.", "kernel.", "session.")) or name == "ndarray.item"


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str           # surface name: "add", "linalg.inv", "ndarray.sum", "ndarray.__add__"
    rule: str           # metadata rule, see the module docstring
    nout: int = 1       # arrays returned; nout_of() refines the variable ones
    # served by the daemon itself (is_service), not by an array function or method
    service: bool = dataclasses.field(init=False, compare=False)
    # the attribute name inside its namespace ("sum" for "ndarray.sum")
    attr: str = dataclasses.field(init=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "service", is_service(self.name))
        object.__setattr__(self, "attr", self.name.rpartition(".")[2])


_UFUNCS_1 = """negative positive absolute abs fabs sign sqrt square cbrt reciprocal exp exp2 expm1 log
    log2 log10 log1p sin cos tan arcsin arccos arctan sinh cosh tanh arcsinh arccosh arctanh deg2rad
    rad2deg degrees radians floor ceil trunc rint fix logical_not invert bitwise_not isnan isinf
    isfinite signbit conj conjugate angle real imag sinc i0 spacing around round nan_to_num"""
_UFUNCS_2 = """add subtract multiply divide true_divide floor_divide power float_power remainder mod fmod
    arctan2 hypot maximum minimum fmax fmin greater greater_equal less less_equal equal not_equal
    logical_and logical_or logical_xor bitwise_and bitwise_or bitwise_xor left_shift right_shift
    copysign nextafter ldexp gcd lcm heaviside logaddexp logaddexp2 clip where isclose"""
_UFUNCS_MULTI = {"divmod": 2, "modf": 2, "frexp": 2}
_REDUCE = """sum prod mean std var max min amax amin argmax argmin nansum nanprod nanmean nanstd nanvar
    nanmax nanmin nanargmax nanargmin any all count_nonzero ptp"""
_ACCUMULATE = "cumsum cumprod nancumsum nancumprod"
_VIEW = """transpose swapaxes moveaxis rollaxis squeeze expand_dims broadcast_to atleast_1d atleast_2d
    atleast_3d flip fliplr flipud rot90 diagonal reshape"""
_PROBE = """concatenate stack hstack vstack dstack column_stack tile repeat pad roll diff gradient
    tensordot kron outer inner vdot einsum trace diag diagflat tril triu cross convolve correlate
    sort argsort lexsort partition argpartition searchsorted take take_along_axis choose
    median percentile quantile nanmedian average cov corrcoef histogram bincount_fixed digitize
    interp copy ascontiguousarray asfortranarray array_equal allclose array_equiv
    meshgrid indices split array_split hsplit vsplit dsplit broadcast_arrays tri
    polyval polyfit unwrap cumulative_sum append delete iscomplex isreal packbits ravel_multi_index
    resize select vander unravel_index diag_indices tril_indices triu_indices nanpercentile nanquantile
    unpackbits histogram2d""".replace("bincount_fixed", "")
_DYNAMIC = """nonzero flatnonzero argwhere unique compress extract trim_zeros bincount in1d isin
    intersect1d union1d setdiff1d setxor1d ix_"""
_CREATION = "zeros ones empty full eye identity arange linspace logspace"
_LIKE = "zeros_like ones_like empty_like full_like"
_NONE = "copyto put place putmask fill_diagonal"
_VALUE = "shares_memory may_share_memory"       # answered with a host bool (a sync point)

_LINALG = {
    "dot": "dot", "matmul": "matmul", "linalg.inv": "probe", "linalg.pinv": "probe",
    "linalg.solve": "probe", "linalg.norm": "probe", "linalg.det": "probe", "linalg.slogdet": "probe",
    "linalg.qr": "probe", "linalg.svd": "probe", "linalg.eigh": "probe", "linalg.eigvalsh": "probe",
    "linalg.cholesky": "probe", "linalg.lstsq": "dynamic", "linalg.matrix_power": "probe",
    "linalg.matrix_rank": "probe", "linalg.tensorsolve": "probe", "linalg.tensorinv": "probe",
    "linalg.multi_dot": "probe",
}
_FFT = """fft ifft fft2 ifft2 fftn ifftn rfft irfft rfft2 irfft2 rfftn irfftn hfft ihfft fftshift
    ifftshift"""
_FFT_CREATION = "fftfreq rfftfreq"
_RANDOM = """rand randn random random_sample ranf sample uniform normal standard_normal randint
    random_integers exponential standard_exponential poisson binomial beta gamma standard_gamma
    lognormal laplace logistic chisquare geometric gumbel rayleigh weibull choice"""
_RANDOM_PROBE = "permutation"
_RANDOM_NONE = "seed shuffle"
# cupy.random.Generator (default_rng) methods, those CuPy's Generator has: name -> (position of
# `size`, position of `dtype` or None where it takes none, the result's default dtype). Forwarded
# as "random.Generator.<name>"; "random.default_rng" makes one.
GENERATOR_METHODS = {
    "random": (0, 1, "float64"), "standard_normal": (0, 1, "float64"), "standard_exponential": (0, 1, "float64"),
    "integers": (2, 3, "int64"), "beta": (2, 3, "float64"), "standard_gamma": (1, 2, "float64"),
    "exponential": (1, None, "float64"), "gamma": (2, None, "float64"), "poisson": (1, None, "int64"),
}
# cupyx.scipy.special basics: elementwise functions of real arguments, name -> number of inputs. The
# emulated backend computes them with SciPy, the cupy backend with cupyx (daemon/backends). Only names
# CuPy (13.6, 14) and SciPy both have; zeta takes q, as CuPy's does (SciPy's one-argument Riemann zeta is not
# CuPy's); softmax, log_softmax, logsumexp and polygamma are composed on the client (cupyx/scipy/special.py).
SPECIAL_INPUTS = {n: 1 for n in """erf erfc erfcx erfinv erfcinv gamma gammaln digamma psi expit logit
    log_expit ndtr ndtri log_ndtr i0 i0e i1 i1e j0 j1 y0 y1 k0 k0e k1 k1e entr expm1 log1p exp2 exp10
    cbrt ellipk ellipkm1 exprel sindg cosdg tandg cotdg round""".split()} | {n: 2 for n in """xlogy xlog1py
    beta betaln rel_entr kl_div huber boxcox boxcox1p gammainc gammaincc gammaincinv gammainccinv zeta binom
    expn""".split()} | {"radian": 3}

# ndarray methods and properties: name -> rule.
_METHODS = {
    "astype": "astype", "copy": "like", "reshape": "view", "ravel": "ravel", "flatten": "ravel",
    "transpose": "view", "swapaxes": "view", "squeeze": "view", "diagonal": "view", "view": "probe",
    "sum": "reduce", "mean": "reduce", "std": "reduce", "var": "reduce", "max": "reduce",
    "min": "reduce", "argmax": "reduce", "argmin": "reduce", "prod": "reduce", "any": "reduce",
    "all": "reduce", "ptp": "reduce", "cumsum": "accumulate", "cumprod": "accumulate",
    "dot": "dot", "clip": "elementwise", "conj": "elementwise", "conjugate": "elementwise",
    "round": "elementwise", "take": "probe", "repeat": "probe", "argsort": "probe", "trace": "probe",
    "nonzero": "dynamic", "sort": "none", "fill": "none", "put": "none", "__setitem__": "none",
    "__getitem__": "view", "T": "view", "real": "view", "imag": "view", "searchsorted": "probe",
    "partition": "none", "argpartition": "probe", "compress": "dynamic", "choose": "probe",
}
# Binary ufuncs whose methods are forwarded as "<ufunc>.reduce", ".accumulate", ".outer" and ".at"
# (cupy.add.at(x, idx, v) is a scatter-add, in place).
UFUNC_METHODS = """add subtract multiply maximum minimum logical_and logical_or bitwise_and bitwise_or
    bitwise_xor""".split()
_OPERATORS_2 = """add sub mul truediv floordiv mod pow matmul and or xor lshift rshift
    eq ne lt le gt ge divmod"""
_OPERATORS_1 = "neg pos abs invert"

# Names served by the daemon itself rather than by the array library.
_SERVICE = {
    "kernel.raw": "none", "kernel.elementwise": "dynamic", "kernel.elementwise_into": "none", "kernel.reduction": "dynamic",
    "cuda.Event.record": "none", "cuda.Event.elapsed": "value", "cuda.Event.query": "value",
    "cuda.runtime.getDeviceCount": "value", "cuda.runtime.getDeviceProperties": "value",
    "cuda.runtime.memGetInfo": "value", "cuda.MemoryPool.used_bytes": "value",
    "cuda.MemoryPool.total_bytes": "value", "cuda.MemoryPool.free_all_blocks": "none",
    "cuda.MemoryPool.set_limit": "value", "cuda.MemoryPool.get_limit": "value",
    "ndarray.item": "value", "ndarray.__copy_from__": "none", "cuda.memory.layout": "value",
    "session.memory_peak": "value",
}
PROPERTIES = frozenset({"T", "real", "imag"})


def _build() -> dict[str, Entry]:
    table: dict[str, Entry] = {}

    def add(names, rule, prefix="", nout=1):
        for n in names.split() if isinstance(names, str) else names:
            table[prefix + n] = Entry(prefix + n, rule, nout)

    add(_UFUNCS_1, "elementwise")
    add(_UFUNCS_2, "elementwise")
    for n, k in _UFUNCS_MULTI.items():
        table[n] = Entry(n, "elementwise", k)
    add(_REDUCE, "reduce")
    add(_ACCUMULATE, "accumulate")
    add(_VIEW, "view")
    add("ravel", "ravel")
    add(_PROBE, "probe")
    add(_DYNAMIC, "dynamic")
    add(_CREATION, "creation")
    add(_LIKE, "like")
    add(_NONE, "none")
    add(_VALUE, "value")
    for n, rule in _LINALG.items():
        table[n] = Entry(n, rule)
    add("sliding_window_view", "view", "lib.stride_tricks.")
    add(_FFT, "probe", "fft.")
    add(_FFT_CREATION, "probe", "fft.")
    add(_RANDOM, "random", "random.")
    add(_RANDOM_PROBE, "probe", "random.")
    add(_RANDOM_NONE, "none", "random.")
    for u in UFUNC_METHODS:
        table[f"{u}.reduce"] = Entry(f"{u}.reduce", "reduce")
        table[f"{u}.accumulate"] = Entry(f"{u}.accumulate", "accumulate")
        table[f"{u}.outer"] = Entry(f"{u}.outer", "probe")
        table[f"{u}.at"] = Entry(f"{u}.at", "none", 0)
    add(SPECIAL_INPUTS, "special", "scipy.special.")
    add(GENERATOR_METHODS, "generator", "random.Generator.")
    add("default_rng", "none", "random.")
    for n, rule in _METHODS.items():
        table["ndarray." + n] = Entry("ndarray." + n, rule)
    for op in _OPERATORS_2.split():
        table[f"ndarray.__{op}__"] = Entry(f"ndarray.__{op}__", "matmul" if op == "matmul" else "elementwise",
                                           2 if op == "divmod" else 1)
        if op not in ("eq", "ne", "lt", "le", "gt", "ge"):
            table[f"ndarray.__r{op}__"] = Entry(f"ndarray.__r{op}__", "rmatmul" if op == "matmul" else "elementwise",
                                                2 if op == "divmod" else 1)
        if op not in ("eq", "ne", "lt", "le", "gt", "ge", "divmod"):
            table[f"ndarray.__i{op}__"] = Entry(f"ndarray.__i{op}__", "self")
    for op in _OPERATORS_1.split():
        table[f"ndarray.__{op}__"] = Entry(f"ndarray.__{op}__", "elementwise")
    for n, rule in _SERVICE.items():
        table[n] = Entry(n, rule, 0 if rule in ("none", "value") else 1)
    for e in list(table.values()):
        if e.rule in ("none", "self", "value"):
            table[e.name] = dataclasses.replace(e, nout=0)
    return table


SURFACE: dict[str, Entry] = _build()
NAMESPACES = ("linalg.", "fft.", "random.", "ndarray.", "kernel.", "cuda.", "scipy.special.", "lib.stride_tricks.")


def lookup(name: str) -> Entry:
    """The entry for `name`; KeyError with a message naming the table otherwise."""
    try:
        return SURFACE[name]
    except KeyError:
        raise KeyError(f"{name!r} is not in gpuremote's API surface table") from None


def module_names(prefix: str = "") -> list[str]:
    """Attribute names of one namespace ('' for the top level, 'linalg.', 'fft.', 'random.')."""
    out = []
    for name in SURFACE:
        if prefix:
            if name.startswith(prefix) and "." not in name[len(prefix):]:
                out.append(name[len(prefix):])
        elif not name.startswith(NAMESPACES) and "." not in name:     # not a ufunc's method
            out.append(name)
    return out
