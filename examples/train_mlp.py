"""Train a small MLP classifier with plain SGD on scikit-learn's handwritten digits, with CuPy.

    python examples/train_mlp.py                 # `import cupy`: real CuPy, or gpuremote's under `gpuremote run`
    python examples/train_mlp.py --numpy         # the same program on NumPy, for comparison

The loop is written the way GPU code should be: everything stays on the device, and the
host reads one number (the loss) every --log-every steps, so only those steps wait.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy


def load_digits(seed: int = 0):
    """8x8 digit images (1797 of them, shipped inside scikit-learn), split 80/20."""
    from sklearn.datasets import load_digits as _load
    data = _load()
    x = (data.data / 16.0).astype(numpy.float32)
    y = data.target.astype(numpy.int64)
    order = numpy.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    cut = int(len(x) * 0.8)
    return (x[:cut], y[:cut]), (x[cut:], y[cut:])


class MLP:
    """Two layers, ReLU, softmax cross-entropy; parameters live on the device of `xp`."""

    def __init__(self, xp, n_in: int, n_hidden: int, n_out: int, lr: float, seed: int = 0):
        rng = numpy.random.default_rng(seed)
        self.xp, self.lr = xp, numpy.float32(lr)
        self.w1 = xp.asarray((rng.standard_normal((n_in, n_hidden)) * numpy.sqrt(2.0 / n_in)).astype(numpy.float32))
        self.b1 = xp.zeros(n_hidden, dtype=numpy.float32)
        self.w2 = xp.asarray((rng.standard_normal((n_hidden, n_out)) * numpy.sqrt(1.0 / n_hidden)).astype(numpy.float32))
        self.b2 = xp.zeros(n_out, dtype=numpy.float32)

    def forward(self, x):
        h = x @ self.w1 + self.b1
        a = self.xp.maximum(h, 0)
        return h, a, a @ self.w2 + self.b2

    def step(self, x, y):
        """One SGD step on batch (x, y); returns the batch loss as a 0-d device array (no wait)."""
        xp = self.xp
        n = x.shape[0]
        h, a, logits = self.forward(x)
        shifted = logits - logits.max(axis=1, keepdims=True)
        e = xp.exp(shifted)
        p = e / e.sum(axis=1, keepdims=True)
        rows = xp.arange(n)
        loss = -xp.log(p[rows, y] + numpy.float32(1e-9)).mean()
        g = p.copy()
        g[rows, y] -= 1
        g /= numpy.float32(n)
        dw2 = a.T @ g
        db2 = g.sum(axis=0)
        dh = (g @ self.w2.T) * (h > 0)
        dw1 = x.T @ dh
        db1 = dh.sum(axis=0)
        self.w1 -= self.lr * dw1
        self.b1 -= self.lr * db1
        self.w2 -= self.lr * dw2
        self.b2 -= self.lr * db2
        return loss

    def accuracy(self, x, y) -> float:
        return float((self.forward(x)[2].argmax(axis=1) == y).mean())


def train(xp, epochs: int = 20, batch: int = 64, hidden: int = 128, lr: float = 0.1, log_every: int = 20,
          seed: int = 0, out=print, data=None) -> dict:
    """Train and test; `data` is what load_digits(seed) returns (loaded here when not given)."""
    (xtr, ytr), (xte, yte) = data if data is not None else load_digits(seed)
    model = MLP(xp, xtr.shape[1], hidden, 10, lr, seed)
    x_dev, y_dev = xp.asarray(xtr), xp.asarray(ytr)
    x_test, y_test = xp.asarray(xte), xp.asarray(yte)
    order_rng = numpy.random.default_rng(seed + 1)
    step, losses = 0, []
    for epoch in range(epochs):
        perm = xp.asarray(order_rng.permutation(len(xtr)))
        xs, ys = x_dev[perm], y_dev[perm]
        for start in range(0, len(xtr) - batch + 1, batch):
            loss = model.step(xs[start:start + batch], ys[start:start + batch])
            if step % log_every == 0:
                value = float(loss)
                losses.append(value)
                out(f"epoch {epoch:3d}  step {step:5d}  loss {value:.4f}")
            step += 1
    acc = model.accuracy(x_test, y_test)
    out(f"test accuracy {acc:.4f} after {step} steps")
    return {"steps": step, "losses": losses, "accuracy": acc}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numpy", action="store_true", help="run on NumPy instead of CuPy")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.numpy:
        xp = numpy
    else:
        import cupy as xp
    data = load_digits(args.seed)     # importing scikit-learn takes about a second: not part of the timing
    if hasattr(xp, "cuda"):    # CuPy, or gpuremote's: start the device first (a CUDA context, a gpuremote session)
        xp.cuda.Device(0).synchronize()
    start = time.perf_counter()
    train(xp, args.epochs, args.batch, args.hidden, args.lr, args.log_every, args.seed, data=data)
    print(f"time {time.perf_counter() - start:.3f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
