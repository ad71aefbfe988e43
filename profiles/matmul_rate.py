"""How fast this device multiplies matrices: the ceiling the engine benchmark's training rates are read against.

A training step of the small ViT is mostly matmuls, so "could it train 1.5x
faster?" has a measurable bound: its FLOPs per second against the rate the
same backend reaches on (a) large square matmuls, about the device's float
peak, and (b) the very matmul shapes of the ViT's forward pass at the
training batch, which are thin (inner dimension 16-128) and reach much less.
`profiles/engine.py --roofline` times both beside its training subjects.

Each shape is multiplied `copies` times, on its own operands, in one compiled
call (XLA: `tf.function(jit_compile=True)` or `jax.jit`), so the call's
dispatch is a small part of its time, as `steps_per_execution` makes it for
training; the products are returned, not reduced, so nothing lets XLA skip
the work.
"""

import functools
import statistics
import time

import keras
import numpy as np

from experiments.cli import BACKENDS
from performer_keras.options import check_choice, check_positive


def square_shapes(size=2048):
    """One (size, size) by (size, size) product: about the device's float peak."""
    return [((size, size), (size, size))]


def vit_shapes(batch, tokens, width, heads, mlp_dim):
    """The matmuls of one ViT block's forward pass at `batch` images of `tokens` tokens, as (a, b) shapes.

    q, k, v and the output projection (rows x width by width x width), the
    MLP's two layers, and per head q k^T and the weights times v (batched
    over images x heads) -- the shapes `flops.analytic_attention_flops`
    counts for softmax attention.
    """
    rows, head = batch * tokens, width // heads
    return ([((rows, width), (width, width))] * 4 + [((rows, width), (width, mlp_dim)), ((rows, mlp_dim), (mlp_dim, width))]
            + [((batch * heads, tokens, head), (batch * heads, head, tokens)),
               ((batch * heads, tokens, tokens), (batch * heads, tokens, head))])


def matmul_flops(shapes):
    """FLOPs of one product of each (a, b) in `shapes`, 2 per multiply-add."""
    return sum(2 * int(np.prod(a)) * b[-1] for a, b in shapes)


def matmul_gflops(shapes, copies=8, calls=5, dtype="float32", seed=0):
    """GFLOP/s of `shapes`' products, each done `copies` times per compiled call: the median of `calls` timed calls.

    `dtype` is the operands' (a training run's compute dtype: "bfloat16" under
    mixed_bfloat16). The first call compiles and is not timed.
    """
    check_positive("copies", copies)
    check_positive("calls", calls)
    backend = check_choice("backend", keras.backend.backend(), BACKENDS)
    rng = np.random.default_rng(seed)
    # Each copy its own operands of exactly these shapes (no added batch dimension, which XLA would lower as
    # another kind of dot).
    operands = [keras.ops.cast(rng.standard_normal(shape).astype("float32"), dtype)
                for _ in range(copies) for pair in shapes for shape in pair]

    def products(*tensors):
        return [keras.ops.matmul(a, b) for a, b in zip(tensors[::2], tensors[1::2])]

    if backend == "tensorflow":
        import tensorflow as tf

        # Eager TensorFlow runs synchronously by default: the call returns once the products exist.
        run = functools.partial(tf.function(products, jit_compile=True, autograph=False), *operands)
    else:
        import jax

        compiled = jax.jit(products)

        def run():
            jax.block_until_ready(compiled(*operands))
    run()
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - start)
    return copies * matmul_flops(shapes) / statistics.median(seconds) / 1e9
