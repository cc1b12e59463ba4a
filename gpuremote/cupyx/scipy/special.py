"""cupyx.scipy.special, forwarded: the names listed under "scipy.special." in the surface table.
The emulated backend computes them with SciPy (install scipy on the daemon host).

Every function follows one dtype rule (gpuremote.meta.special_dtype): float32 when every array
argument is float32, float64 otherwise (scalars do not count). Where this differs from SciPy or
CuPy, and what differs besides, each function's docstring says.

softmax, log_softmax, logsumexp and polygamma are not surface names: they are composed here of
forwarded calls (max, exp, sum, log, where and the elementwise functions above), so their arrays
stay on the device and the daemon bounds every allocation before it is made.
"""

# (names imported here start with "_": the module's public names are cupyx.scipy.special's alone)
import numpy as _numpy
from numpy.lib.array_utils import normalize_axis_tuple as _normalize_axis_tuple

import gpuremote.cupy as _cp
from gpuremote.cupy import _namespace
from gpuremote.cupy._core import ndarray as _ndarray
from gpuremote.meta import special_dtype as _special_dtype
from gpuremote.surface import SPECIAL_INPUTS as _SPECIAL_INPUTS

__all__ = _namespace.populate(globals(), "scipy.special.")

# What differs from SciPy or CuPy, by name (the rest of the elementwise functions take the same
# arguments as both and give their values).
_NOTES = {
    "zeta": "q is required, as in CuPy: SciPy's one-argument Riemann zeta(x) is zeta(x, 1.0) here.",
    "expn": "n is truncated toward zero where it is not an integer (SciPy warns, CuPy does not); an "
            "integer n array gives float64, as every non-float32 array does.",
    "round": "Halves round to even, as in both; -0.5 gives -0.0 on a CuPy daemon (cupy.round) and 0.0 "
             "on the emulated one (SciPy's round).",
    "radian": "radian(d, m, s): degrees, arc minutes and arc seconds to radians.",
}


def _document(name: str) -> None:
    nin = _SPECIAL_INPUTS[name]
    doc = (f"scipy.special.{name} of {nin} argument{'s' if nin > 1 else ''}, elementwise on the gpuremote "
           "device (CuPy's cupyx.scipy.special on a GPU daemon, SciPy's on the emulated one). Takes device "
           "arrays and real scalars, no keywords (no out=, dtype=); float32 when every array is float32, "
           "else float64 (bool, integer and float16 arrays included, where SciPy and CuPy pick other loops).")
    globals()[name].__doc__ = doc + (" " + _NOTES[name] if name in _NOTES else "")


for _name in __all__:
    _document(_name)
del _name
# What polygamma is made of: populate() defined these, under names no import here shows.
_forwarded = {name: globals()[name] for name in ("gamma", "zeta", "psi")}


# -- composed functions ----------------------------------------------------------------------

def _device_array(x, fn: str, what: str) -> _ndarray:
    """x, a device array (as CuPy, which takes no host data here)."""
    if type(x) is not _ndarray:
        hint = ": convert it with cupy.asarray first" if isinstance(x, (list, tuple, _numpy.ndarray)) else ""
        raise TypeError(f"{fn}() takes a device array (cupy.ndarray) for {what}, not "
                        f"{type(x).__module__}.{type(x).__name__}{hint}")
    return x


def _real_scalar(v, fn: str) -> None:
    if isinstance(v, (complex, _numpy.complexfloating)) or not isinstance(v, (int, float, _numpy.number, _numpy.bool_)):
        raise TypeError(f"{fn}() takes device arrays and real scalars, not {type(v).__name__}"
                        + (": convert it with cupy.asarray first" if isinstance(v, (list, tuple)) else ""))


def _as_dtype(v, dtype) -> _ndarray:
    """A device array of `dtype`: an array cast (itself where it has the dtype), a scalar filled in
    on the device (0-d), so that the forwarded calls made of it all compute in `dtype`."""
    if type(v) is _ndarray:
        return v.astype(dtype, copy=False)
    return _cp.full((), v, dtype=dtype)


def _real_input(x, fn: str, what: str = "x") -> _ndarray:
    """x as a device array of the rule's dtype (TypeError for a complex one, as meta.special_dtype)."""
    x = _device_array(x, fn, what)
    return x.astype(_special_dtype([x.dtype]), copy=False)


def softmax(x, axis=None):
    """exp(x) / sum(exp(x)) along `axis` (None: the whole array; an int or a tuple of ints), shifted
    by the maximum first so that no exponential overflows. Result dtype by the module's rule: a
    float16 array gives float64 (SciPy and CuPy: float16), a bool array float64 (SciPy refuses it).
    x must be a device array (as CuPy; SciPy takes host data and scalars). An empty reduction raises
    ValueError, as in both; an axis whose maximum is inf, or all -inf, gives nan, as in both."""
    x = _real_input(x, "softmax")
    e = _cp.exp(x - _cp.max(x, axis=axis, keepdims=True))
    return e / _cp.sum(e, axis=axis, keepdims=True)


def log_softmax(x, axis=None):
    """log(softmax(x, axis)), computed as (x - max) - log(sum(exp(x - max))): exact where softmax
    underflows to 0. A maximum that is not finite shifts by 0 instead, as SciPy and CuPy do, with
    their results there (an axis all -inf gives nan; one holding inf gives nan there, -inf beside).
    Dtype and arguments as softmax."""
    x = _real_input(x, "log_softmax")
    shift = _cp.max(x, axis=axis, keepdims=True)
    shift = _cp.where(_cp.isfinite(shift), shift, 0)
    t = x - shift
    return t - _cp.log(_cp.sum(_cp.exp(t), axis=axis, keepdims=True))


def _reduced_shape(shape: tuple, axis) -> tuple:
    """`shape` with the axes reduced kept as 1 (keepdims)."""
    axes = _normalize_axis_tuple(range(len(shape)) if axis is None else axis, len(shape))
    return tuple(1 if i in axes else n for i, n in enumerate(shape))


def _squeezed(x: _ndarray, axis, keepdims: bool) -> _ndarray:
    return x if keepdims else _cp.squeeze(x, axis=axis)


def logsumexp(a, axis=None, b=None, keepdims=False, return_sign=False):
    """log(sum(b * exp(a))) along `axis` (None, an int or a tuple of ints), computed as SciPy does:
    shifted by the maximum, whose terms are summed apart (so log1p keeps the precision of the small
    rest), and taken directly where that is not finite (inf inputs). `b` (a device array or a real
    scalar, broadcast with `a`) weights the terms; a zero weight drops its term even where a is inf
    or nan. A negative sum gives nan, or with return_sign=True (log|sum|, sign) with sign in
    {-1, 0, 1}.

    Differences: a must be a device array (CuPy too; SciPy takes host data). The dtype follows the
    module's rule (float16 gives float64, SciPy keeps float16; a float64 NumPy scalar b leaves float32
    as it is, SciPy widens). A 0-d `a` is taken as 1-d, as SciPy.
    An empty reduction gives -inf with sign 0 (SciPy 1.17: sign -1; CuPy raises). CuPy 13 sums
    without setting the maximum's terms apart: its results can differ from these in the last digits
    where the other terms are tiny against the maximum's."""
    a = _device_array(a, "logsumexp", "a")
    if b is None:
        dtype = _special_dtype([a.dtype])
    elif type(b) is _ndarray:
        dtype = _special_dtype([a.dtype, b.dtype])
    else:
        _real_scalar(b, "logsumexp")
        dtype = _special_dtype([a.dtype])
    a = a.astype(dtype, copy=False)
    if a.ndim == 0:
        a = a.reshape(1)
    if b is not None:
        b = _as_dtype(b, dtype)
        a = _cp.where(b == 0, -_numpy.inf, a)        # also broadcasts a against b
    if a.size == 0:
        out = _cp.full(_reduced_shape(a.shape, axis), -_numpy.inf, dtype=dtype)
        out = _squeezed(out, axis, keepdims)
        return (out, _cp.zeros_like(out)) if return_sign else out
    out, sign = _shifted_logsumexp(a, b, axis, return_sign)
    # Where the shifted sum is not finite (an inf or nan maximum, a sum that cancels to 0), the
    # direct log(sum(b * exp(a))) has the right limit, as SciPy takes it.
    total = _cp.sum(_cp.exp(a) if b is None else b * _cp.exp(a), axis=axis, keepdims=True)
    direct = _cp.log(_cp.abs(total) if return_sign else total)
    finite = _cp.isfinite(out)
    out = _squeezed(_cp.where(finite, out, direct), axis, keepdims)
    if not return_sign:
        return out
    return out, _squeezed(_cp.where(finite, sign, _cp.sign(total)), axis, keepdims)


def _shifted_logsumexp(a: _ndarray, b, axis, return_sign: bool) -> tuple[_ndarray, _ndarray]:
    """(log|sum|, sign of the sum) with the reduced axes kept, from the terms at the maximum (m, their
    weight) and the rest (s, relative to m): log(m * (1 + s)) + max = log1p(s) + log(m) + max. Not
    finite where the maximum is not, or where the terms cancel: logsumexp then sums directly."""
    top = _cp.max(a, axis=axis, keepdims=True)
    at_top = a == top
    rest = _cp.exp(_cp.where(at_top, -_numpy.inf, a) - top)
    if b is None:
        m = _cp.sum(at_top, axis=axis, keepdims=True, dtype=a.dtype)
    else:
        rest = b * rest
        m = _cp.sum(_cp.where(at_top, b, 0), axis=axis, keepdims=True)
    s = _cp.sum(rest, axis=axis, keepdims=True)
    s = _cp.where(s == 0, s, s / m)
    sign = _cp.sign(s + 1) * _cp.sign(m)
    s = _cp.where(s < -1, -s - 2, s)                # |1 + s| = 1 + (-s - 2) there: log1p takes it
    out = _cp.log1p(s) + _cp.log(_cp.abs(m)) + top
    if not return_sign:
        out = _cp.where(sign < 0, _numpy.nan, out)   # the log of a negative sum
    return out, sign


def polygamma(n, x):
    """The n-th derivative of the digamma function: psi(x) where n == 0, else
    (-1)**(n+1) * gamma(n+1) * zeta(n+1, x), SciPy's definition (nan for a non-integer n).
    n and x: device arrays or real scalars, broadcast together. Dtype by the module's rule, so an
    int n scalar with a float32 x gives float32 (SciPy: float64; CuPy takes arrays only)."""
    arrays = []
    for v in (n, x):
        if type(v) is _ndarray:
            arrays.append(v.dtype)
        else:
            _real_scalar(v, "polygamma")
    dtype = _special_dtype(arrays)
    n, x = _as_dtype(n, dtype), _as_dtype(x, dtype)
    higher = (-1.0) ** (n + 1) * _forwarded["gamma"](n + 1.0) * _forwarded["zeta"](n + 1, x)
    return _cp.where(n == 0, _forwarded["psi"](x), higher)


__all__ += ["softmax", "log_softmax", "logsumexp", "polygamma"]


def __getattr__(attr):
    raise _namespace.unknown_attribute(__name__, attr)
