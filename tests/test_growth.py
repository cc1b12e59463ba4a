"""Results are size-checked before an op runs (gpuremote/daemon/growth.py).

Two parts. The bound functions themselves, pure, on NumPy arrays: for a spread of small realistic
calls, NumPy runs the op for real and the bound must be at least what it allocated, so the bounds
are proven upper bounds rather than guesses. Then a real daemon with a 64 MiB emulated device gets
each hostile expanding op: the client sees CuPy's OutOfMemoryError, the daemon's peak RSS does not
move, nothing stays allocated, and the same session and a second one keep working.
"""

from __future__ import annotations

import gc
import math
import time

import numpy as np
import pytest

from gpuremote.daemon import growth
from gpuremote.errors import OutOfMemoryError
from gpuremote.meta import NOT_ARRAY, Unknown, nout_of, numpy_callable
from gpuremote.surface import PROPERTIES, SURFACE

from conftest import BACKEND, DaemonProcess, backend_args


# -- the bounds, against NumPy ---------------------------------------------------------------------

def meta_of(obj):                       # the daemon's view of an argument (Session._meta_of)
    if isinstance(obj, np.ndarray):
        return tuple(obj.shape), obj.dtype
    return NOT_ARRAY


def run(name, args, kwargs):
    """What the daemon runs for a surface name, on NumPy (Session._invoke)."""
    entry = SURFACE[name]
    if name == "ndarray.__getitem__":                   # a scalar index gives CuPy's 0-d view
        r = args[0][args[1]]
        key = args[1] if isinstance(args[1], tuple) else (args[1],)
        return r if isinstance(r, np.ndarray) else args[0][key + (Ellipsis,)]
    if name.startswith("ndarray."):
        attr = getattr(args[0], entry.attr)
        return attr if entry.attr in PROPERTIES else attr(*args[1:], **kwargs)
    if name.startswith("random."):
        return getattr(np.random.RandomState(0), entry.attr)(*args, **kwargs)
    return numpy_callable(name)(*args, **kwargs)


def owner(arr):
    """The buffer's owner, as the emulated daemon finds it (through as_strided's DummyArray too)."""
    from gpuremote.daemon.backends.emulated import EmulatedBackend
    return EmulatedBackend.owner(None, arr)[0]


def allocated(result, inputs) -> int:
    """Bytes of the buffers the result holds that no input held: what the ledger charges."""
    held = {id(owner(a)) for a in inputs if isinstance(a, np.ndarray)}
    items = result if isinstance(result, (tuple, list)) else [result]
    total = 0
    for r in items:
        r = np.asarray(r)
        o = owner(r)
        if id(o) not in held:
            held.add(id(o))
            total += o.nbytes
    return total


rng = np.random.default_rng(7)
F, F32, C, I, I8, B = np.float64, np.float32, np.complex128, np.int64, np.int8, np.bool_


def a(*shape, dtype=F):
    if np.dtype(dtype).kind == "b":
        return rng.random(shape) > 0.5
    if np.dtype(dtype).kind in "iu":
        return rng.integers(0, 5, shape).astype(dtype)
    if np.dtype(dtype).kind == "c":
        return (rng.random(shape) + 1j * rng.random(shape)).astype(dtype)
    return rng.random(shape).astype(dtype)


def bc(shape, dtype=F):
    """A broadcast view: one element of memory, `shape` logically."""
    return np.broadcast_to(a(1, dtype=dtype), shape)


x34, v5, v6 = a(3, 4), a(5), a(6)
sq = a(4, 4) + 4 * np.eye(4)
CASES = [
    # derived rules (exact) and their fallbacks
    ("add", (x34, a(4)), {}), ("multiply", (x34, 2.5), {}), ("where", (x34 > 0.5,), {}),
    ("where", (x34 > 0.5, x34, 0.0), {}), ("matmul", (x34, a(4, 2)), {}), ("dot", (v5, v5), {}),
    ("ndarray.astype", (x34, C), {}), ("zeros_like", (x34,), {"shape": (5, 6)}), ("zeros", ((3, 4),), {}),
    ("full", ((2, 3), np.asarray(2.0)), {}), ("eye", (np.asarray(4),), {}), ("arange", (np.asarray(7),), {}),
    ("linspace", (0, 1, 5), {"retstep": True}), ("linspace", (a(3), a(2, 1), 4), {}),
    ("logspace", (a(3), 2.0, 4), {}), ("random.normal", (a(3), 1.0), {}),
    ("random.uniform", (0.0, 1.0), {"size": (3, 4)}),
    # reductions and accumulations, also of empty and broadcast inputs
    ("sum", (x34,), {}), ("ndarray.sum", (x34, 0), {}), ("max", (a(3, 4, dtype=I8),), {"axis": 1}),
    ("mean", (a(0, 5),), {"axis": 0}), ("std", (bc((50, 40)),), {"axis": 0}), ("var", (a(3, 4, dtype=C),), {}),
    ("argmax", (x34,), {"axis": 1}), ("count_nonzero", (x34,), {"axis": 0}), ("nansum", (x34,), {"axis": 1}),
    ("cumsum", (a(3, 4, dtype=B),), {"axis": 0}), ("ndarray.cumprod", (x34,), {}), ("nancumsum", (x34,), {}),
    ("any", (x34,), {"axis": (0, 1), "keepdims": True}),
    # views and copies a layout forces
    ("ndarray.reshape", (x34, 2, 6), {}), ("ndarray.reshape", (x34.T, 12), {}), ("reshape", (bc((3, 4)), (12,)), {}),
    ("reshape", (x34, (4, 3)), {"order": "F"}), ("ravel", (x34.T,), {}), ("ndarray.ravel", (x34,), {}),
    ("ndarray.flatten", (x34,), {}), ("ndarray.imag", (x34,), {}), ("ndarray.imag", (a(3, dtype=C),), {}),
    ("transpose", (x34,), {}), ("broadcast_to", (v5, (4, 5)), {}), ("ndarray.T", (x34,), {}),
    ("split", (a(6), 3), {}), ("array_split", (a(7), [2, 5]), {}), ("broadcast_arrays", (v5, a(3, 1)), {}),
    # indexing: basic views, fancy gathers, masks
    ("ndarray.__getitem__", (x34, (slice(1, 3), 2)), {}), ("ndarray.__getitem__", (x34, 1), {}),
    ("ndarray.__getitem__", (x34, np.array([0, 2, 2])), {}),
    ("ndarray.__getitem__", (x34, (np.array([[0], [2]]), np.array([[1, 3, 0]]))), {}),
    ("ndarray.__getitem__", (a(4, 5, 6), (np.array([1, 2]), slice(None), np.array([0, 1]))), {}),
    ("ndarray.__getitem__", (a(4, 5, 6), (Ellipsis, np.array([1, 2, 3]))), {}),
    ("ndarray.__getitem__", (a(4, 5, 6), (None, slice(1, 3), [0, 1], None)), {}),
    ("ndarray.__getitem__", (x34, x34 > 0.5), {}), ("ndarray.__getitem__", (a(3, 4, 5), (x34 > 0.3, 1)), {}),
    ("ndarray.__getitem__", (x34, (True,)), {}), ("ndarray.__getitem__", (a(0, 3), np.array([], int)), {}),
    ("ndarray.__getitem__", (bc((2000, 3)), np.arange(5)), {}),
    # what grows: joins, repeats, pads, products
    ("concatenate", ([x34, x34, a(1, 4)],), {}), ("concatenate", ([a(3, dtype=I8), a(2, dtype=np.uint8)],), {}),
    ("stack", ([v5] * 7,), {}), ("hstack", ((v5, a(2, dtype=C)),), {}), ("vstack", ([v5, v5],), {}),
    ("dstack", ([x34, x34],), {}), ("column_stack", ((v5, v5),), {}), ("concatenate", ([v5, v5],), {"dtype": C}),
    ("tile", (v5, (3, 2)), {}), ("tile", (x34, 3), {}), ("tile", (v5, np.array([2, 3])), {}), ("tile", (v5, 0), {}),
    ("repeat", (x34, 3), {}), ("repeat", (x34, np.array([1, 0, 4]), 0), {}), ("ndarray.repeat", (x34, [1, 2, 3, 4], 1), {}),
    ("repeat", (v5, np.array([2, 2, 0, 1, 3])), {}), ("repeat", (a(2, 0), 5, 1), {}),
    ("pad", (x34, 2), {}), ("pad", (x34, ((1, 2), (3, 0))), {"mode": "reflect"}), ("pad", (v5, np.array([4, 1])), {}),
    ("pad", (x34, (2,)), {"mode": "constant", "constant_values": 7}), ("pad", (a(0, 2), 3), {}),
    ("kron", (x34, a(2, 3)), {}), ("kron", (v5, a(2, 2, dtype=I8)), {}), ("outer", (v5, a(2, 3)), {}),
    ("inner", (x34, a(2, 4)), {}), ("inner", (v5, 3.0), {}), ("vdot", (v5, v5), {}),
    ("tensordot", (a(3, 4, 5), a(4, 5, 2)), {}), ("tensordot", (x34, v6), {"axes": 0}),
    ("tensordot", (x34, a(3, 2)), {"axes": ([0], [0])}), ("tensordot", (x34, a(4, 2)), {"axes": 1}),
    ("einsum", ("ij,jk->ik", x34, a(4, 2)), {}), ("einsum", ("i,j", v5, v6), {}), ("einsum", ("ii", sq), {}),
    ("einsum", ("...ij->...ji", a(2, 3, 4)), {}), ("einsum", ("bij,bjk->bik", a(2, 3, 4), a(2, 4, 5)), {}),
    ("einsum", (x34, [0, 1], a(4, 2), [1, 2]), {}), ("einsum", ("ij,jk,kl->il", x34, a(4, 5), a(5, 2)), {"optimize": True}),
    ("diag", (v5,), {}), ("diag", (v5, -2), {}), ("diag", (x34,), {}), ("diagflat", (x34, 1), {}),
    ("tril", (x34,), {}), ("triu", (v5, 1), {}), ("tri", (4, 6, 1), {}), ("tri", (np.asarray(3),), {"dtype": I8}),
    ("indices", ((3, 4),), {}), ("indices", ((2, 3, 4),), {"sparse": True, "dtype": I8}),
    ("meshgrid", (v5, v6), {}), ("meshgrid", (v5, v6, a(2)), {"indexing": "ij"}),
    ("meshgrid", (v5, v6), {"sparse": True}), ("meshgrid", (v5, v6), {"copy": False}),
    ("cross", (a(4, 3), a(4, 3)), {}), ("cross", (a(3, 1, 3), a(1, 4, 2)), {}), ("cross", (a(3, 5), a(3, 5)), {"axis": 0}),
    ("take", (x34, np.array([[0, 1], [2, 2]])), {}), ("take", (x34, np.array([0, 3, 3, 1]), 1), {}),
    ("ndarray.take", (x34, [2, 0]), {"axis": 0}), ("take_along_axis", (x34, np.argsort(x34, axis=1), 1), {}),
    ("take_along_axis", (x34, np.zeros((1, 2), int), 1), {}), ("take_along_axis", (v5, np.array([0, 4, 4, 4])), {"axis": 0}),
    ("choose", (np.array([[0], [1], [1]]), [a(1, 4), a(3, 4)]), {}), ("choose", (np.array([0, 1, 0]), np.stack([a(3), a(3)])), {}),
    ("searchsorted", (np.sort(v6), a(3, 4)), {}), ("ndarray.searchsorted", (np.sort(v6), 0.5), {}),
    ("digitize", (x34, np.array([0.2, 0.5, 0.9])), {}),
    ("percentile", (x34, 50), {}), ("quantile", (x34, a(5)), {"axis": 1}), ("quantile", (x34, [0.1, 0.9]), {"axis": 0}),
    ("median", (x34,), {"axis": 0}), ("nanmedian", (a(0, 4),), {"axis": 0}), ("average", (x34,), {"axis": 0, "weights": a(3)}),
    ("average", (x34,), {"weights": a(3, 4, dtype=C), "returned": True}),
    ("cov", (x34,), {}), ("cov", (x34,), {"rowvar": False}), ("cov", (v5, v5), {}), ("corrcoef", (a(6, 3),), {}),
    ("histogram", (v6,), {"bins": 4}), ("histogram", (v6, np.array([0.0, 0.3, 1.0])), {}),
    ("histogram", (v6,), {"bins": 3, "weights": a(6, dtype=F32)}),
    ("bincount", (np.array([0, 7, 2, 2]),), {}), ("bincount", (np.array([1, 3]),), {"minlength": 9}),
    ("bincount", (np.array([], int),), {}), ("bincount", (np.array([2, 5]), a(2)), {}),
    ("isin", (x34, v5), {}), ("isin", (np.array([1, 9, 40]), np.array([0, 40])), {"kind": "table"}),
    ("diff", (x34,), {}), ("diff", (x34, 2, 0), {}), ("diff", (a(3, 4, dtype=I8),), {"prepend": 0, "append": a(3, 1)}),
    ("gradient", (x34,), {}), ("gradient", (v6, 0.5), {}), ("gradient", (a(3, 4, 5),), {"axis": (0, 2)}),
    ("cumulative_sum", (v5,), {"include_initial": True}), ("cumulative_sum", (a(3, 4, dtype=I8),), {"axis": 1}),
    ("polyval", (a(3), x34), {}), ("polyval", (a(3, 2), a(4, 1)), {}), ("polyfit", (v6, a(6), 2), {}),
    ("polyfit", (v6, a(6, 2), 3), {"cov": True}), ("unwrap", (x34 * 10,), {}), ("interp", (x34, [0.0, 1.0], [1.0, 2.0]), {}),
    ("interp", (v5, np.array([0.0, 1.0]), a(2, dtype=C)), {}),
    ("sort", (x34,), {}), ("sort", (bc((30, 4)),), {"axis": 0}), ("argsort", (a(3, 4, dtype=I8),), {}),
    ("ndarray.argsort", (x34,), {}), ("lexsort", ((v5, a(5)),), {}), ("partition", (v6, 2), {}),
    ("argpartition", (x34, 1), {}), ("roll", (x34, (1, 2), (0, 1)), {}), ("copy", (bc((20, 3)),), {}),
    ("ascontiguousarray", (x34.T,), {"dtype": C}), ("asfortranarray", (x34,), {}), ("trace", (a(3, 4, 5),), {}),
    ("ndarray.trace", (sq,), {}), ("array_equal", (x34, x34), {}), ("allclose", (a(3, 1), a(1, 4)), {}),
    ("array_equiv", (v5, a(3, 5)), {}), ("convolve", (v6, a(3)), {}), ("correlate", (v5, a(9)), {"mode": "full"}),
    # dynamic results
    ("nonzero", (x34 > 0.5,), {}), ("ndarray.nonzero", (a(2, 3, 4) > 0.5,), {}), ("flatnonzero", (x34,), {}),
    ("argwhere", (x34,), {}), ("unique", (a(20, dtype=I),), {"return_index": True, "return_inverse": True,
                                                            "return_counts": True}),
    ("compress", (np.array([True, False, True]), x34, 0), {}), ("extract", (x34 > 0.5, x34), {}),
    ("trim_zeros", (np.array([0, 0, 1, 2, 0]),), {}), ("intersect1d", (v5, v5), {"return_indices": True}),
    ("union1d", (v5, a(3)), {}), ("setdiff1d", (v6, v5), {}), ("setxor1d", (v5, v6), {}),
    # linear algebra, also on stacks
    ("linalg.inv", (np.stack([sq, sq]),), {}), ("linalg.pinv", (x34,), {}), ("linalg.solve", (sq, a(4)), {}),
    ("linalg.solve", (np.stack([sq] * 2)[:, None], a(1, 3, 4, 2)), {}), ("linalg.norm", (x34,), {}),
    ("linalg.norm", (x34,), {"axis": 1}), ("linalg.det", (np.stack([sq] * 3),), {}), ("linalg.det", (a(5, 0, 0),), {}),
    ("linalg.slogdet", (sq,), {}), ("linalg.qr", (a(6, 3),), {}), ("linalg.qr", (a(6, 3),), {"mode": "complete"}),
    ("linalg.qr", (a(3, 6),), {"mode": "r"}), ("linalg.svd", (a(6, 3),), {}),
    ("linalg.svd", (a(2, 6, 3),), {"full_matrices": False}), ("linalg.svd", (a(6, 3),), {"compute_uv": False}),
    ("linalg.eigh", (sq + sq.T,), {}), ("linalg.eigvalsh", (sq + sq.T,), {}), ("linalg.cholesky", (sq @ sq.T,), {}),
    ("linalg.lstsq", (a(6, 3), a(6, 2)), {}), ("linalg.lstsq", (a(3, 6), a(3)), {}),
    ("linalg.matrix_power", (sq, 5), {}), ("linalg.matrix_rank", (x34,), {}),
    ("linalg.tensorsolve", (a(6, 2, 3) + np.eye(6).reshape(6, 2, 3), a(6)), {}),
    ("linalg.tensorinv", (np.eye(6).reshape(6, 2, 3),), {"ind": 1}),
    ("linalg.multi_dot", ([x34, a(4, 5), a(5, 2)],), {}), ("linalg.multi_dot", ([v6, a(6, 7), a(7, 1000)],), {}),
    # fft
    ("fft.fft", (v5,), {}), ("fft.fft", (v5, 16), {}), ("fft.ifft", (x34,), {"n": 3, "axis": 0}),
    ("fft.rfft", (v6,), {}), ("fft.irfft", (a(5, dtype=C),), {}), ("fft.irfft", (a(5, dtype=C), 20), {}),
    ("fft.hfft", (a(4, dtype=C),), {}), ("fft.ihfft", (v6,), {}), ("fft.fft2", (x34,), {"s": (5, 9)}),
    ("fft.ifft2", (a(2, 3, 4),), {}), ("fft.fftn", (a(2, 3, 4),), {"s": (4, 4)}), ("fft.ifftn", (x34,), {"axes": (0,)}),
    ("fft.rfft2", (x34,), {}), ("fft.irfft2", (a(3, 4, dtype=C),), {}), ("fft.rfftn", (a(2, 3, 4),), {"s": (2, 8, 8)}),
    ("fft.irfftn", (a(3, 4, dtype=C),), {"s": (3, 10)}), ("fft.fft", (a(8, dtype=F32),), {}),
    ("fft.fftshift", (x34,), {}), ("fft.ifftshift", (v5,), {"axes": 0}), ("fft.fftfreq", (8, 0.1), {}),
    ("fft.rfftfreq", (9,), {}), ("fft.fftfreq", (5,), {"d": a(3, 1)}),
    ("random.permutation", (10,), {}), ("random.permutation", (x34,), {}),
    # ufunc methods and the functions added with them
    ("add.reduce", (x34,), {"axis": 0}), ("multiply.reduce", (a(3, 4, dtype=I8),), {"axis": None}),
    ("add.accumulate", (x34,), {"axis": 1}), ("subtract.outer", (v5, x34), {}),
    ("add.outer", (a(3, dtype=I8), a(4, dtype=I8)), {"dtype": C}),
    ("append", (x34, a(7, dtype=C)), {}), ("append", (x34, a(2, 4)), {"axis": 0}), ("delete", (x34, [0, 2], 1), {}),
    ("iscomplex", (a(5, dtype=C),), {}), ("isreal", (x34,), {}), ("packbits", (a(3, 10, dtype=B),), {}),
    ("ravel_multi_index", ((a(5, dtype=I), a(1, 5, dtype=I)), (5, 5)), {}), ("resize", (x34, (7, 9)), {}),
    ("resize", (v5, 2), {}), ("resize", (a(0), (3, 2)), {}),
    ("select", ([a(3, 1) > 0.5, a(1, 4) > 0.2], [a(3, 1), a(1, 4, dtype=C)]), {}),
    ("vander", (v5,), {}), ("vander", (a(3, dtype=F32), 8), {}),
    ("unravel_index", (a(2, 3, dtype=I), (5, 5)), {}), ("unravel_index", (7, (2, 4)), {}),
    ("diag_indices", (5,), {}), ("diag_indices", (3, 4), {}), ("tril_indices", (6, -1), {}),
    ("triu_indices", (4, 2, 9), {}), ("tril_indices", (0,), {}),
    ("nanpercentile", (x34, 50), {}), ("nanquantile", (x34, a(3)), {"axis": 1}),
    ("unpackbits", (a(3, 4, dtype=np.uint8),), {}), ("unpackbits", (a(3, 4, dtype=np.uint8), 1), {}),
    ("unpackbits", (a(3, 4, dtype=np.uint8), 0), {"count": 40}), ("unpackbits", (a(5, dtype=np.uint8),), {"count": -3}),
    ("histogram2d", (v5, v5), {}), ("histogram2d", (a(30), a(30)), {"bins": (3, 7)}),
    ("histogram2d", (a(30), a(30)), {"bins": [np.linspace(0, 1, 4), 6]}),
    ("ix_", (a(3, dtype=I), a(4, dtype=B)), {}), ("ix_", ([0, 1, 2], [1]), {}),
    ("lib.stride_tricks.sliding_window_view", (x34, (2, 2)), {}),
]


def case_id(case):
    return case[0]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("name,args,kwargs", CASES, ids=[case_id(c) for c in CASES])
def test_bound_is_an_upper_bound(name, args, kwargs):
    with np.errstate(all="ignore"):
        real = allocated(run(name, args, kwargs), list(args) + list(kwargs.values()))
    entry = SURFACE[name]
    tight = growth.bound(entry, args, kwargs, meta_of)
    loose = growth.bound(entry, args, kwargs, meta_of, room=2**62)
    assert tight >= real and loose >= real, (name, tight, loose, real)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("name,args,kwargs", CASES, ids=[case_id(c) for c in CASES])
def test_result_count_without_metadata_is_numpys(name, args, kwargs):
    """meta.nout_of, which the client asks when it cannot derive the results' metadata (inputs too
    large to probe, data-dependent shapes), names as many handles as NumPy returns arrays."""
    with np.errstate(all="ignore"):
        result = run(name, args, kwargs)
    real = len(result) if isinstance(result, (tuple, list)) else 1
    try:
        n = nout_of(SURFACE[name], args, kwargs, meta_of)
    except Unknown:
        return                          # the client fetches the metadata it needs and asks again
    assert n == real, (name, n, real)


def test_every_surface_name_has_a_bound():
    assert [n for n, e in SURFACE.items() if not growth.known(e)] == []


def test_views_and_exact_rules_are_tight():
    """The common path must not refuse what fits: views cost nothing, derived rules are exact."""
    b = lambda name, *args, room=None, **kw: growth.bound(SURFACE[name], args, kw, meta_of, room)  # noqa: E731
    big = a(1000, 100)
    assert b("ndarray.__getitem__", big, (slice(None, None, 2), 3)) == 0
    assert b("ndarray.reshape", big, 100, 1000) == 0 and b("ravel", big) == 0 and b("ndarray.T", big) == 0
    assert b("ndarray.reshape", big.T, 100_000) == big.nbytes                    # a copy
    assert b("add", big, big) == big.nbytes and b("ndarray.astype", big, np.dtype(F32)) == big.nbytes // 2
    assert b("sum", big, room=0) == 8 and b("ndarray.sum", big, 1, room=0) == 1000 * 8
    assert b("ndarray.__getitem__", big, np.arange(10)) == 10 * 100 * 8
    assert b("take", big, np.arange(7), 1) == 1000 * 7 * 8
    assert b("searchsorted", np.sort(big[0]), v5) == 5 * 8
    assert b("concatenate", [big, big]) == 2 * big.nbytes


def test_hostile_bounds_without_running():
    """The bounds of requests NumPy could not even allocate come back at once, and large."""
    b = lambda name, *args, **kw: growth.bound(SURFACE[name], args, kw, meta_of)  # noqa: E731
    assert b("tile", v5, (10**6, 10**6)) == 5 * 10**12 * 8
    assert b("bincount", np.array([2**40])) == (2**40 + 1) * 8
    assert b("repeat", v5, np.array([2**62] * 5)) >= 5 * 2**62 * 8        # no int64 wrap-around
    assert b("fft.fft", v5, 2**40) >= 2**40 * 16
    assert b("ndarray.__getitem__", a(10**3), (np.zeros((10**5, 1), int), np.zeros((1, 10**5), int))) == 10**10 * 8
    assert b("array_split", v5, 10**9) >= 10**9 * 100                    # views, but 10**9 host objects
    assert b("isin", np.array([1]), np.array([0, 2**40]), kind="table") > 2**40
    assert b("unpackbits", np.zeros(4, np.uint8), count=2**40) >= 2**40
    assert b("histogram2d", v5, v5, bins=10**6) >= 10**12 * 8
    with pytest.raises(NotImplementedError, match="integer and array bins"):
        b("histogram", v5, bins="auto")
    with pytest.raises(NotImplementedError, match="integer and array bins"):
        b("histogram2d", v5, v5, bins=["auto", 3])
    with pytest.raises(ValueError, match="elements where a few values"):
        b("tile", v5, np.ones(10**5, int))


# -- against a daemon ------------------------------------------------------------------------------

CAPACITY = "64MiB"
# The requests are sized against a 64 MiB emulated device; a GPU daemon's capacity is its real memory.
on_emulated = pytest.mark.skipif(BACKEND == "cupy", reason="sized for a 64 MiB emulated device")
N = 8192        # array inputs above meta.PROBE_ELEMENTS: the client leaves their metadata to the daemon


@pytest.fixture(scope="module")
def small():
    d = DaemonProcess(*backend_args(devices=1, memory=CAPACITY))
    yield d
    d.stop()


@pytest.fixture(scope="module")
def cp(small):
    """Two sessions on the small daemon: devices 0 and 1 of this process are the same device."""
    import gpuremote.cupy
    gpuremote.disconnect()
    gpuremote.connect(small.address)
    gpuremote.connect(small.address)
    yield gpuremote.cupy
    gpuremote.disconnect()


def peak_rss(d: DaemonProcess | None, reset: bool = False) -> int:
    """The daemon's peak RSS (VmHWM; this process's for None); `reset` first lowers it to the current
    RSS, so that each case is measured alone (a high-water mark left by one case would hide the next)."""
    pid = "self" if d is None else d.proc.pid
    if reset:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc status")


def settled(d: DaemonProcess, cp, timeout: float = 10.0) -> list[int]:
    """The daemon's memory in use once both sessions' queued releases have reached it."""
    gc.collect()
    for i in (0, 1):
        cp.cuda.Device(i).synchronize()
    deadline = time.monotonic() + timeout
    used = [dev.memory_used for dev in d.info().devices]
    while used != [0] and time.monotonic() < deadline:
        time.sleep(0.02)
        used = [dev.memory_used for dev in d.info().devices]
    return used


G = 2**27       # elements: 1 GiB of float64, which NumPy would allocate and fill were it not refused
HOSTILE = {
    "tile": lambda cp: cp.tile(cp.ones(N), (10**6, 10**6)),
    "tile-big": lambda cp: cp.tile(cp.ones(N), G // N),
    "kron": lambda cp: cp.kron(cp.ones(10**5), cp.ones(10**5)),
    "kron-big": lambda cp: cp.kron(cp.ones(N), cp.ones(G // N)),
    "outer": lambda cp: cp.outer(cp.ones(N), cp.ones(G // N)),
    "pad": lambda cp: cp.pad(cp.ones(N), G),
    "repeat": lambda cp: cp.repeat(cp.ones(N), G // N),
    "ndarray.repeat": lambda cp: cp.ones((N, 2)).repeat(G // N, axis=0),
    "repeat-array": lambda cp: cp.repeat(cp.ones(N), cp.full(N, G // N)),
    "bincount": lambda cp: cp.bincount(cp.asarray([2**40])),
    "bincount-big": lambda cp: cp.bincount(cp.asarray([G])),
    "indices": lambda cp: cp.indices((10**5,) * 3),
    "indices-big": lambda cp: cp.indices((2**13, 2**13)),
    "tri": lambda cp: cp.tri(10**7),
    "tri-big": lambda cp: cp.tri(2**14),
    "diag": lambda cp: cp.diag(cp.ones(2**14)),
    "diagflat": lambda cp: cp.diagflat(cp.ones((N, 2))),
    "meshgrid": lambda cp: cp.meshgrid(cp.ones(N), cp.ones(G // N))[0],
    "einsum-outer": lambda cp: cp.einsum("i,j->ij", cp.ones(N), cp.ones(G // N)),
    "tensordot": lambda cp: cp.tensordot(cp.ones(N), cp.ones(G // N), axes=0),
    "fft-n": lambda cp: cp.fft.fft(cp.ones(N), n=2**40),
    "fft-n-big": lambda cp: cp.fft.fft(cp.ones(N), n=G),
    "fftfreq": lambda cp: cp.fft.fftfreq(2**40),
    "fftfreq-big": lambda cp: cp.fft.fftfreq(G),
    "permutation": lambda cp: cp.random.permutation(2**40),
    "permutation-big": lambda cp: cp.random.permutation(G),
    "concatenate": lambda cp: (lambda x: cp.concatenate([x] * (G // N)))(cp.ones(N)),
    "getitem-fancy": lambda cp: (lambda x, i: x[i[:, None], cp.arange(2**10)[None, :]])(
        cp.ones((2**10, 2**10)), cp.arange(G // 2**10) % 2**10),
    "take-broadcast-index": lambda cp: cp.take(cp.ones(N), cp.broadcast_to(cp.zeros(1, dtype=cp.int64), (G,))),
    "sort-broadcast": lambda cp: cp.sort(cp.broadcast_to(cp.ones(1), (G,))),
    "std-broadcast": lambda cp: cp.broadcast_to(cp.ones(1), (G,)).std(),
    "svd-full": lambda cp: cp.linalg.svd(cp.ones((2**14, 2)))[0],
    "cov": lambda cp: cp.cov(cp.ones((2**14, 2))),
    "histogram-bins": lambda cp: cp.histogram(cp.ones(N), bins=G)[0],
    "polyfit-deg": lambda cp: cp.polyfit(cp.arange(N, dtype=cp.float64), cp.ones(N), G // N),
    "unpackbits-count": lambda cp: cp.unpackbits(cp.zeros(N, dtype=cp.uint8), count=G),
    "histogram2d-bins": lambda cp: cp.histogram2d(cp.ones(N), cp.ones(N), bins=2**14)[0],
}


@on_emulated
@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_expanding_op_is_refused(small, cp, case):
    baseline = settled(small, cp)
    peak = peak_rss(small, reset=True)
    with pytest.raises(cp.cuda.memory.OutOfMemoryError, match="Out of memory allocating"):
        HOSTILE[case](cp).get()
    assert cp.cuda.memory.OutOfMemoryError is OutOfMemoryError
    assert peak_rss(small) - peak < 32 * 2**20, "the daemon allocated before refusing"
    assert small.proc.poll() is None
    assert float(cp.ones(4).sum()) == 4.0                           # the same session works
    with cp.cuda.Device(1):                                         # and a second one
        assert int(cp.arange(10).sum()) == 45
    assert settled(small, cp) == baseline                          # nothing stays allocated


@on_emulated
def test_what_fits_still_runs(small, cp):
    """Right below the capacity the same ops run and give NumPy's answers."""
    host = np.arange(N, dtype=np.float64)
    x = cp.asarray(host)
    np.testing.assert_array_equal(cp.tile(x, 2).get(), np.tile(host, 2))
    np.testing.assert_array_equal(cp.bincount(cp.asarray([3, 1000])).get(), np.bincount([3, 1000]))
    np.testing.assert_array_equal(x[cp.arange(4)[:, None], ].get(), host[np.arange(4)[:, None]])
    big = cp.ones(int(math.sqrt(2**20)))                            # 8 MiB outer product of 64 MiB
    assert cp.outer(big, big).shape == (1024, 1024)
    assert float(cp.broadcast_to(cp.ones(1), (2**20,)).std()) == 0.0


# Tiny inputs with expanding value arguments: the client derives metadata by running NumPy on
# stand-ins of small inputs, which must not build these results on the client either.
CLIENT_SIDE = {
    "tile-huge": lambda cp: cp.tile(cp.ones(3), (10**6, 10**6)),
    "tile-big": lambda cp: cp.tile(cp.ones(3), G),
    "pad-big": lambda cp: cp.pad(cp.ones(3), G),
    "repeat-big": lambda cp: cp.repeat(cp.ones(4), G),
    "getitem-broadcast": lambda cp: cp.ones((4, 4))[cp.arange(2**16)[:, None] % 4, cp.arange(2**16)[None, :] % 4],
}


@on_emulated
@pytest.mark.parametrize("case", list(CLIENT_SIDE))
def test_client_does_not_build_what_it_probes(small, cp, case):
    peak = peak_rss(None, reset=True)
    with pytest.raises(cp.cuda.memory.OutOfMemoryError, match="Out of memory allocating"):
        CLIENT_SIDE[case](cp).shape                                   # noqa: B018 -- metadata from the daemon
    assert peak_rss(None) - peak < 64 * 2**20, "the client built the result to learn its shape"
    assert float(cp.ones(4).sum()) == 4.0
