"""The gradient of a tensor shared by every example: XLA's sum over the batch against `sum_by_halving`.

    python -m profiles.batch_sum                     # -> profiles/results/<device>/<backend>/batch_sum.json
    KERAS_BACKEND=jax python -m profiles.batch_sum

A layer that adds or multiplies a batch-independent tensor t into a batch
(the ViT's position embedding, kerple's N x N logit bias and weights) gets
the gradient of t as the upstream gradient summed over the batch axis. For
each shape of `SHAPES` this times, compiled (`jax.jit`; TensorFlow: a
`tf.function` with and without XLA), the gradient of sum(a * broadcast(t))
with respect to t, where broadcast is the plain `t[None]` or
`batch_broadcast.over_batch` forced to sum by halving, in `ROUNDS` rounds
that alternate the two (medians), and checks that both give the same
gradient. `KernelAttention` and `PositionEmbedding` sum by halving where
this file says it pays (`batch_broadcast.HALVING_BACKENDS`).
"""

import statistics
import sys
import time

from experiments.cli import parser, start_backend

start_backend()  # before the imports below load Keras: why, in the docstring of profiles/__init__.py

import keras
import numpy as np
from keras import ops

from performer_keras.batch_broadcast import broadcast_summed_by_halving
from profiles import bench
from profiles.__main__ import DEFAULT_OUT

# name -> (batch, shape of the shared tensor).
SHAPES = {
    "dense kerple weights, `cpu` heads, 2,305 tokens, batch 4 (kerple_paths)": (4, (4, 2305, 2305)),
    "kerple bias of a reference ViT layer, 65 tokens, batch 128": (128, (8, 65, 65)),
    "position embedding of the reference ViT, 65 tokens, batch 128": (128, (65, 256)),
    "kerple bias of a small ViT layer, 50 tokens, batch 256": (256, (4, 50, 50)),
}
ROUNDS = 7


def gradient_function(broadcast, jit_compile):
    """t, a -> d sum(a * broadcast(t)) / dt, compiled for the backend."""
    loss = lambda t, a: ops.sum(a * broadcast(t, a.shape[0]))
    if keras.backend.backend() == "jax":
        import jax

        return jax.jit(jax.grad(loss))
    import tensorflow as tf

    def gradient(t, a):
        with tf.GradientTape() as tape:
            tape.watch(t)
            value = loss(t, a)
        return tape.gradient(value, t)

    return tf.function(gradient, jit_compile=jit_compile)


def time_pair(batch, shape, jit_compile, rounds=ROUNDS):
    """{"plain": {...}, "halving": {...}, "speedup"}: median ms of each gradient, alternating, and plain over halving."""
    rng = np.random.default_rng(0)
    t = ops.convert_to_tensor(rng.normal(size=shape).astype("float32"))
    a = ops.convert_to_tensor(rng.normal(size=(batch, *shape)).astype("float32"))
    functions = {"plain": gradient_function(lambda t, batch: t[None], jit_compile),
                 "halving": gradient_function(broadcast_summed_by_halving, jit_compile)}
    results = {name: np.asarray(f(t, a)) for name, f in functions.items()}  # compiles
    np.testing.assert_allclose(results["halving"], results["plain"], rtol=1e-4, atol=1e-3)
    samples = {name: [] for name in functions}
    for _ in range(rounds):
        for name, f in functions.items():
            start = time.perf_counter()
            np.asarray(f(t, a))
            samples[name].append(1000.0 * (time.perf_counter() - start))
    row = {name: {"ms": statistics.median(values), "ms_all": values} for name, values in samples.items()}
    return dict(row, speedup=row["plain"]["ms"] / row["halving"]["ms"])


def main(argv=None):
    args = parser("python -m profiles.batch_sum", __doc__, "out").parse_args(argv)
    settings = (None,) if keras.backend.backend() == "jax" else (False, True)
    rows = []
    for name, (batch, shape) in SHAPES.items():
        for jit_compile in settings:
            row = dict(case=name, batch=batch, shape=list(shape), xla=jit_compile in (None, True),
                       **time_pair(batch, shape, jit_compile))
            rows.append(row)
            print(f"{name}{'' if jit_compile is None else ', XLA' if jit_compile else ', no XLA'}: plain "
                  f"{row['plain']['ms']:.2f} ms, halving {row['halving']['ms']:.2f} ms, x{row['speedup']:.2f}",
                  flush=True)
    path = bench.write_record(args.out or DEFAULT_OUT, "batch_sum", "profiles.batch_sum", argv, rounds=ROUNDS,
                              rows=rows)
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
