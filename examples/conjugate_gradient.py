"""Solve a sparse-structured SPD system (the 2-D Poisson matrix) by conjugate gradients, with CuPy.

    python examples/conjugate_gradient.py            # `import cupy`: real CuPy, or gpuremote's under `gpuremote run`
    python examples/conjugate_gradient.py --numpy    # the same program on NumPy

The residual norm is read back every --check-every iterations: the only points where the
host waits for the device.
"""

from __future__ import annotations

import argparse
import sys


def poisson_apply(xp, u, n):
    """A @ u for the 5-point Laplacian on an n x n grid (Dirichlet boundary), without forming A."""
    g = u.reshape(n, n)
    out = 4 * g
    out[1:, :] -= g[:-1, :]
    out[:-1, :] -= g[1:, :]
    out[:, 1:] -= g[:, :-1]
    out[:, :-1] -= g[:, 1:]
    return out.reshape(n * n)


def solve(xp, n: int = 64, tol: float = 1e-8, max_iter: int = 2000, check_every: int = 25, out=print) -> dict:
    b = xp.ones(n * n)
    x = xp.zeros(n * n)
    r = b - poisson_apply(xp, x, n)
    p = r.copy()
    rs = r @ r
    b_norm = float(xp.linalg.norm(b))
    it = 0
    for it in range(1, max_iter + 1):
        ap = poisson_apply(xp, p, n)
        alpha = rs / (p @ ap)
        x += alpha * p
        r -= alpha * ap
        rs_new = r @ r
        p = r + (rs_new / rs) * p
        rs = rs_new
        if it % check_every == 0:
            rel = float(xp.sqrt(rs)) / b_norm
            out(f"iteration {it:5d}  relative residual {rel:.3e}")
            if rel < tol:
                break
    residual = float(xp.linalg.norm(b - poisson_apply(xp, x, n))) / b_norm
    out(f"converged after {it} iterations: relative residual {residual:.3e}, x[center] = {float(x[(n * n) // 2 + n // 2]):.6f}")
    return {"iterations": it, "residual": residual}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numpy", action="store_true", help="run on NumPy instead of CuPy")
    parser.add_argument("-n", type=int, default=64, help="grid side (the system has n*n unknowns)")
    parser.add_argument("--tol", type=float, default=1e-8)
    parser.add_argument("--check-every", type=int, default=25)
    args = parser.parse_args(argv)
    if args.numpy:
        import numpy as xp
    else:
        import cupy as xp
    result = solve(xp, args.n, args.tol, check_every=args.check_every)
    return 0 if result["residual"] < args.tol * 10 else 1


if __name__ == "__main__":
    sys.exit(main())
