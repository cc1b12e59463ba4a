"""The training example through a real daemon: same results as NumPy, and no waiting.

DESIGN decision 3 promises that a training loop blocks only where it reads a value: here
the loss, every `log_every` steps. The client statistics prove it step by step.
"""

import importlib.util
import pathlib

import numpy as np

import gpuremote

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "train_mlp.py"


def load_example():
    spec = importlib.util.spec_from_file_location("train_mlp", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_training_blocks_only_where_it_reads_the_loss(cp):
    ex = load_example()
    (xtr, ytr), _ = ex.load_digits()
    model = ex.MLP(cp, xtr.shape[1], 32, 10, lr=0.1)
    x, y = cp.asarray(xtr), cp.asarray(ytr)
    log_every, batch = 5, 64
    model.step(x[:batch], y[:batch]).get()  # warm-up: everything below starts from a synced state
    for step in range(20):
        before = gpuremote.stats()
        loss = model.step(x[step * batch:(step + 1) * batch], y[step * batch:(step + 1) * batch])
        if step % log_every == 0:
            assert np.isfinite(float(loss))
        after = gpuremote.stats()
        expected = 1 if step % log_every == 0 else 0
        assert after["round_trips"] - before["round_trips"] == expected, f"step {step}"
        assert after["ops"] > before["ops"]
    assert gpuremote.stats()["messages"] > 0


def test_training_matches_numpy(cp):
    ex = load_example()
    lines_np, lines_remote = [], []
    ref = ex.train(np, epochs=2, hidden=32, log_every=10, out=lines_np.append)
    got = ex.train(cp, epochs=2, hidden=32, log_every=10, out=lines_remote.append)
    assert got["steps"] == ref["steps"]
    np.testing.assert_allclose(got["losses"], ref["losses"], rtol=1e-4)
    assert abs(got["accuracy"] - ref["accuracy"]) < 1e-9
