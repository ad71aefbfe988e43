"""over_batch: a batch-independent tensor broadcast over the batch, its gradient summed by halving on JAX."""

import keras
import numpy as np
import pytest
from keras import ops

from performer_keras import batch_broadcast
from performer_keras.batch_broadcast import broadcast_summed_by_halving, over_batch, sum_by_halving
from profiles.batch_sum import gradient_function

from layer_test_case import to_numpy


def gradient(broadcast, t, a):
    """d sum(a * broadcast(t, batch)) / dt, compiled with XLA on the suite's backend, as the profile times it."""
    return to_numpy(gradient_function(broadcast, jit_compile=True)(ops.convert_to_tensor(t), ops.convert_to_tensor(a)))


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8, 13])
def test_sum_by_halving_is_the_sum_over_the_first_axis(count):
    x = np.random.default_rng(count).normal(size=(count, 3, 4)).astype("float32")
    np.testing.assert_allclose(to_numpy(sum_by_halving(ops.convert_to_tensor(x))), x.sum(axis=0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("batch", [1, 6, 7])
def test_the_halving_gradient_is_the_plain_broadcasts(batch):
    rng = np.random.default_rng(batch)
    t = rng.normal(size=(3, 5, 5)).astype("float32")
    a = rng.normal(size=(batch, 3, 5, 5)).astype("float32")
    forward = to_numpy(broadcast_summed_by_halving(ops.convert_to_tensor(t), batch))
    np.testing.assert_array_equal(forward, np.broadcast_to(t, (batch, *t.shape)))
    expected = a.sum(axis=0)  # d/dt sum(a * t), by hand
    np.testing.assert_allclose(gradient(broadcast_summed_by_halving, t, a), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gradient(lambda t, batch: t[None], t, a), expected, rtol=1e-5, atol=1e-5)


def test_over_batch_sums_by_halving_only_on_the_halving_backends_with_a_known_batch(monkeypatch):
    calls = []
    monkeypatch.setattr(batch_broadcast, "broadcast_summed_by_halving", lambda x, batch: calls.append(batch) or x[None])
    t = ops.ones((2, 3))
    monkeypatch.setattr(batch_broadcast, "HALVING_BACKENDS", (keras.backend.backend(),))
    assert tuple(over_batch(t, 4).shape) == (1, 2, 3) and calls == [4]
    assert tuple(over_batch(t, None).shape) == (1, 2, 3) and calls == [4]  # a batch unknown to the graph
    monkeypatch.setattr(batch_broadcast, "HALVING_BACKENDS", ())
    assert tuple(over_batch(t, 4).shape) == (1, 2, 3) and calls == [4]


@pytest.mark.parametrize("variant", ["softmax-absolute", "softmax-kerple", "favor-kerple"])
def test_the_layers_train_alike_with_the_halving_gradient_and_without(variant, monkeypatch):
    """The position embedding, kerple's logit bias and its dense weights go through over_batch: one SGD step (lr 1)
    with the halving forced on this backend changes every weight as the plain broadcast does."""
    from performer_keras.registry import create_model

    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, size=(5, 14, 14, 1)).astype("float32")
    labels = rng.integers(0, 10, size=(5,))
    halving_calls, steps = [], []
    halving = batch_broadcast.broadcast_summed_by_halving
    monkeypatch.setattr(batch_broadcast, "broadcast_summed_by_halving",
                        lambda x, batch: halving_calls.append(tuple(x.shape)) or halving(x, batch))
    for backends in ((), (keras.backend.backend(),)):
        monkeypatch.setattr(batch_broadcast, "HALVING_BACKENDS", backends)
        keras.utils.set_random_seed(0)
        model = create_model(variant, (14, 14, 1), 10, "tiny", **({"toeplitz_path": "dense"} if "kerple" in variant else {}))
        model.compile(optimizer=keras.optimizers.SGD(1.0), loss="sparse_categorical_crossentropy", jit_compile=True)
        before = [to_numpy(w) for w in model.weights]
        model.train_on_batch(images, labels)
        steps.append([to_numpy(w) - b for w, b in zip(model.weights, before)])
    assert halving_calls, "no tensor went through the halving"
    for plain, halved in zip(*steps):
        np.testing.assert_allclose(halved, plain, rtol=1e-4, atol=1e-6)
    assert any(np.abs(step).max() > 1e-3 for step in steps[1])


def test_the_profile_times_both_gradients_alternately_and_writes_the_command(tmp_path, monkeypatch):
    import json

    from profiles import batch_sum

    row = batch_sum.time_pair(3, (2, 5, 5), jit_compile=True, rounds=2)
    assert len(row["plain"]["ms_all"]) == len(row["halving"]["ms_all"]) == 2
    assert row["speedup"] == pytest.approx(row["plain"]["ms"] / row["halving"]["ms"])
    monkeypatch.setattr(batch_sum, "SHAPES", {"tiny": (3, (4, 4))})
    assert batch_sum.main(["--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("*/*/batch_sum.json")
    record = json.loads(path.read_text())
    assert record["command"].endswith(f"python -m profiles.batch_sum --out {tmp_path}")
    settings = [True] if keras.backend.backend() == "jax" else [False, True]
    assert [r["xla"] for r in record["rows"]] == settings and all(r["case"] == "tiny" for r in record["rows"])
