"""Training and evaluation batches from the uint8 splits, the fastest way each backend has.

* TensorFlow: a tf.data pipeline; gathering, augmenting (TensorFlow's own
  image kernel with `augment.draw`'s parameters) and prefetching run on the
  host's cores in parallel with the training step.
* JAX: the uint8 split is put on the device once, and each batch is gathered
  and augmented there by one jitted call, so no pixel crosses from the host
  per step and TensorFlow is never imported (a GPU machine with a CUDA JAX
  has none).

Both yield exactly ``steps_per_epoch(N, B) * (epochs - start_epoch)`` batches
of ``(float32 images (B, H, W, C) in [0, 255], int32 labels (B,))``; batch j
of epoch k holds examples ``epoch_order(seed, k)[j B : (j + 1) B]`` augmented
by `augment.augment` from (seed, k, example). That is the same on both
backends, and epoch k is the same whether a pipeline starts at epoch 0 or at
``start_epoch=k``, which is what makes a resumed run equal an uninterrupted
one. Per-channel normalisation happens inside the model, so an exported model
takes plain pixels.
"""

import math
import time

import keras
import numpy as np

from experiments import augment
from experiments.data import epoch_order, steps_per_epoch
from experiments.run_config import AUGMENTATIONS
from performer_keras.options import check_choice, check_positive

_WARMUP_BATCHES = 5


def train_batches(images, labels, batch_size, seed, kind, start_epoch=0, epochs=1):
    """Shuffled, augmented training batches for epochs ``start_epoch .. epochs - 1`` (an iterable).

    ``images`` uint8 ``(N, H, W, C)``, ``labels`` integer ``(N,)``; ``kind``
    one of `AUGMENTATIONS`. The last ``N mod batch_size`` examples of each
    epoch's order wait for another epoch, so every step has the same shape.
    """
    check_choice("augmentation", kind, AUGMENTATIONS)
    labels = _check_arrays(images, labels)
    steps = steps_per_epoch(len(labels), batch_size)
    if not 0 <= start_epoch <= epochs:
        raise ValueError(f"Need 0 <= start_epoch <= epochs, got {start_epoch} and {epochs}")

    # Drawn as each epoch starts: orders for every epoch at once would take epochs x N
    # integers, gigabytes for a large split trained long.
    def batch_orders(epoch):
        """Epoch `epoch`'s example indices, one row a step: int32 (steps, batch_size)."""
        return epoch_order(seed, epoch, len(labels))[: steps * batch_size].reshape(steps, batch_size)

    epoch_range = range(start_epoch, epochs)
    if keras.backend.backend() == "jax":
        return _jax_train(images, labels, batch_orders, epoch_range, seed, kind)
    return _tf_train(images, labels, batch_orders, epoch_range, (steps, batch_size), seed, kind)


def eval_batches(images, labels, batch_size):
    """Batches in split order, no augmentation, the last partial batch kept (a re-iterable).

    Every example counts exactly once, so accuracies are over the whole split.
    """
    check_positive("batch_size", batch_size)
    labels = _check_arrays(images, labels)
    if keras.backend.backend() == "jax":
        return _DeviceBatches(images, labels, batch_size)
    import tensorflow as tf

    images, labels = tf.constant(images), tf.constant(labels)
    return (
        tf.data.Dataset.range(len(labels))
        .batch(batch_size)
        .map(lambda index: (tf.cast(tf.gather(images, index), tf.float32), tf.gather(labels, index)),
             num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .prefetch(tf.data.AUTOTUNE)
    )


def pipeline_throughput(images, labels, batch_size, kind, seed=0, batches=50):
    """Images per second the training pipeline alone delivers, after a warm-up.

    Compare it with the model's images/s to see whether input is the
    bottleneck. The first batches (tracing, compiling, buffer filling) are not
    timed; the last batch is brought to the host, so an asynchronous device
    has finished everything timed.
    """
    check_positive("batches", batches)
    steps = steps_per_epoch(len(labels), batch_size)
    epochs = math.ceil((_WARMUP_BATCHES + batches) / steps)
    iterator = iter(train_batches(images, labels, batch_size, seed, kind, epochs=epochs))
    for _ in range(_WARMUP_BATCHES):
        keras.ops.convert_to_numpy(next(iterator)[0])
    start = time.perf_counter()
    for _ in range(batches):
        last = next(iterator)
    keras.ops.convert_to_numpy(last[0])
    return batches * batch_size / (time.perf_counter() - start)


def _check_arrays(images, labels):
    images, labels = np.asarray(images), np.asarray(labels)
    if images.ndim != 4 or labels.ndim != 1 or len(images) != len(labels):
        raise ValueError(f"Need images (N, H, W, C) and labels (N,), got {images.shape} and {labels.shape}")
    return labels.astype(np.int32)


def _tf_train(images, labels, batch_orders, epoch_range, orders_shape, seed, kind):
    import tensorflow as tf

    steps, batch_size = orders_shape
    batch_shape = (batch_size, *images.shape[1:])
    images, labels = tf.constant(images), tf.constant(labels)

    def epoch_steps(epoch):
        epoch = tf.cast(epoch, tf.int32)
        # The order is numpy's permutation (`epoch_order`), so the pipeline calls back into
        # Python for it, once an epoch.
        orders = tf.numpy_function(lambda e: batch_orders(int(e)), [epoch], tf.int32, stateful=False)
        return tf.data.Dataset.from_tensor_slices((tf.ensure_shape(orders, orders_shape), tf.fill([steps], epoch)))

    def load(index, epoch):
        batch = tf.cast(tf.gather(images, index), tf.float32)
        if kind != "none":
            batch = _tf_warp(batch, augment.draw(kind, seed, epoch, index))
        return tf.ensure_shape(batch, batch_shape), tf.gather(labels, index)

    return (
        tf.data.Dataset.range(epoch_range.start, epoch_range.stop)
        .flat_map(epoch_steps)
        # flat_map cannot know its length; Keras needs it to run an epoch without steps_per_epoch.
        .apply(tf.data.experimental.assert_cardinality(steps * len(epoch_range)))
        .map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .prefetch(tf.data.AUTOTUNE)
    )


def _tf_warp(batch, parameters):
    """`augment.rotate` (with or without shifts) or `augment.crop_flip` by TensorFlow's ImageProjectiveTransformV3 (3x faster on a CPU).

    Each row maps output pixel (x, y) to the input point
    ``(a0 x + a1 y + a2, b0 x + b1 y + b2)``, read bilinearly (rotation) or
    nearest (whole-pixel crop and flip) with zero fill: the maps of `augment`.
    """
    import tensorflow as tf

    height, width = batch.shape[1], batch.shape[2]
    rotates = "angle" in parameters  # rotate, rotate_shift: bilinear; crop_flip: whole pixels
    if rotates:
        cos, sin = tf.cos(parameters["angle"]), tf.sin(parameters["angle"])
        cx, cy = (width - 1) / 2.0, (height - 1) / 2.0
        shift_x, shift_y = parameters.get("shift_x", 0.0), parameters.get("shift_y", 0.0)
        rows = [cos, -sin, cx - cos * cx + sin * cy + shift_x, sin, cos, cy - sin * cx - cos * cy + shift_y]
    else:
        sign = tf.where(parameters["flip"], -1.0, 1.0)
        offset_x = parameters["shift_x"] + tf.where(parameters["flip"], float(width - 1), 0.0)
        zeros, ones = tf.zeros_like(sign), tf.ones_like(sign)
        rows = [sign, zeros, offset_x, zeros, ones, parameters["shift_y"]]
    zeros = tf.zeros_like(rows[0])
    return tf.raw_ops.ImageProjectiveTransformV3(
        images=batch, transforms=tf.stack([*rows, zeros, zeros], axis=1), output_shape=[height, width],
        fill_value=0.0, interpolation="BILINEAR" if rotates else "NEAREST", fill_mode="CONSTANT",
    )


def _jax_train(images, labels, batch_orders, epoch_range, seed, kind):
    import jax

    images, labels = jax.device_put(images), jax.device_put(labels)

    # The split is an argument, not a closure, so XLA does not fold it into the program as a
    # constant. The step's row of the epoch's order is taken inside the call: indexing a device
    # array from Python would be one more dispatch, host time spent on every step.
    @jax.jit
    def load(images, labels, epoch_orders, step, epoch):
        index = epoch_orders[step]
        return augment.augment(keras.ops.take(images, index, axis=0), index, epoch, seed, kind), labels[index]

    def generate():
        for epoch in epoch_range:
            epoch_orders = jax.device_put(batch_orders(epoch))
            for step in range(len(epoch_orders)):
                yield load(images, labels, epoch_orders, step, epoch)

    return generate()


class _DeviceBatches(keras.utils.PyDataset):
    """Evaluation batches sliced from a split that sits on the JAX device."""

    def __init__(self, images, labels, batch_size):
        import jax

        super().__init__()
        self.images, self.labels = jax.device_put(images), jax.device_put(labels)
        self.batch_size = batch_size

    def __len__(self):
        return math.ceil(len(self.labels) / self.batch_size)

    def __getitem__(self, step):
        window = slice(step * self.batch_size, (step + 1) * self.batch_size)
        return keras.ops.cast(self.images[window], "float32"), self.labels[window]
