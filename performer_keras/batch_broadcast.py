"""Broadcast a batch-independent tensor over the batch, with a gradient that XLA on JAX sums fast."""

import keras
from keras import ops

# Backends whose gradient of a shared tensor `over_batch` sums by halving. XLA in jaxlib 0.10
# sums over a leading axis of a few large slices an order of magnitude slower than it adds
# whole slices (jax-ml/jax#25187, open); TensorFlow's sums, with XLA or without, need no help
# (profiles/results/cpu-epyc-2core/<backend>/batch_sum.json, `python -m profiles.batch_sum`).
HALVING_BACKENDS = ("jax",)


def sum_by_halving(x):
    """x summed over its first axis by adding its halves until one slice is left: log2 steps of whole-slice adds."""
    while x.shape[0] > 1:
        half = x.shape[0] // 2
        folded = x[:half] + x[half:2 * half]
        x = ops.concatenate([folded, x[2 * half:]], axis=0) if x.shape[0] % 2 else folded
    return x[0]


def broadcast_summed_by_halving(x, batch_size):
    """x (*shape) broadcast to (batch_size, *shape), whose gradient `sum_by_halving` sums over the batch."""

    @ops.custom_gradient
    def broadcast(x):
        def gradient(*args, upstream=None):
            return sum_by_halving(args[0] if upstream is None else upstream)

        return ops.broadcast_to(x[None], (batch_size, *x.shape)), gradient

    return broadcast(x)


def over_batch(x, batch_size):
    """x (*shape) ready for an elementwise op with a (batch_size, *shape) tensor.

    The gradient of a plain broadcast (`x[None]`) is the upstream gradient
    summed over the batch axis. On `HALVING_BACKENDS` it is summed by
    halving (`broadcast_summed_by_halving`) instead; elsewhere, and where
    the batch size is not a Python int (a graph of unknown batch: the
    halving needs the count), x is broadcast plainly. The values, and the
    gradient up to float rounding, are the same either way.
    """
    if keras.backend.backend() in HALVING_BACKENDS and isinstance(batch_size, int):
        return broadcast_summed_by_halving(x, batch_size)
    return x[None]
