"""How fast this device multiplies matrices: the ceiling the engine benchmark's training rates are read against.

    python -m profiles.matmul_rate                   # -> profiles/results/<device>/<backend>/matmul_rate.json
    KERAS_BACKEND=jax python -m profiles.matmul_rate

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

Run alone, it times `machine_shapes()` in `ROUNDS` alternating rounds
(medians) and records them with the CPU's identity (`latency.cpu_identity`):
the quick answer to whether this machine is the one a committed time was
measured on, as one device name can cover machines several times apart.
Stop other work on the machine first.
"""

import functools
import statistics
import sys
import time

from experiments.cli import BACKENDS, parser, start_backend

start_backend()  # before the imports below load Keras: why, in the docstring of profiles/__init__.py

import keras
import numpy as np

from experiments.run_config import RunConfig
from performer_keras.options import check_choice, check_positive
from performer_keras.registry import SIZES
from profiles import bench
from profiles.__main__ import DEFAULT_OUT

ROUNDS = 3
# Products per compiled call: of a ViT block's thin matmuls, and of a large square (34 GFLOP a call at 2048, a few
# tenths of a second on a 2-core CPU).
COPIES, SQUARE_COPIES = 8, 2


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


def matmul_gflops(shapes, copies=COPIES, calls=5, dtype="float32", seed=0):
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


def machine_shapes(batch_size=RunConfig.batch_size):
    """{name: (shapes, copies)} that `main` times: `square_shapes()` and one block's forward matmuls of the small
    and the reference ViT on MNIST at `batch_size` (train.py's default)."""
    shapes = {"square 2048": (square_shapes(), SQUARE_COPIES)}
    for size in ("small", "reference"):
        config = SIZES[size]
        tokens = bench.token_count((28, 28, 1), config["patch_size"])
        shapes[f"{size} ViT block, MNIST, batch {batch_size}"] = (
            vit_shapes(batch_size, tokens, config["width"], config["heads"], config["mlp_dim"]), COPIES)
    return shapes


def main(argv=None):
    args = parser("python -m profiles.matmul_rate", __doc__, "out", "rounds").parse_args(argv)
    rounds = args.rounds or ROUNDS
    subjects = machine_shapes()
    samples = {name: [] for name in subjects}
    for _ in range(rounds):
        for name, (shapes, copies) in subjects.items():
            samples[name].append(matmul_gflops(shapes, copies=copies))
    rows = [{"shapes": name, "gflop_per_call": copies * matmul_flops(shapes) / 1e9,
             "gflops_per_second": statistics.median(samples[name]), "samples": samples[name]}
            for name, (shapes, copies) in subjects.items()]
    for row in rows:
        print(f"{row['shapes']}: {row['gflops_per_second']:.1f} GFLOP/s (median of {rounds})", flush=True)
    path = bench.write_record(args.out or DEFAULT_OUT, "matmul_rate", "profiles.matmul_rate", argv, rounds=rounds,
                              rows=rows)
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
