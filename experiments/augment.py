"""Training augmentation as pure functions of (seed, epoch, example), in `keras.ops`.

Two decisions shape the module:

* **keras.ops only**, so the same code runs on every backend: JAX runs it in
  a jitted function on the accelerator next to the uint8 training split
  (`pipelines.py`). TensorFlow's tf.data pipeline takes the parameters from
  `draw` and warps with TensorFlow's own image kernel, three times faster on
  the host; a test holds the two to float tolerance, so both backends train
  on the same augmented batches.
* **A counter-based hash, not a random generator.** Each example's draws are
  ``lowbias32`` (C. Wellons' integer hash) of (seed, epoch, example index,
  draw): no state, the same bits on every backend and device, and epoch k of
  a resumed run is drawn exactly as in an uninterrupted one.

The distributions (see `AUGMENTATIONS`):

* ``"rotate"``: rotation about the image centre by an angle uniform in
  [-10, 10] degrees, bilinear, zero fill (MNIST-like grayscale digits).
* ``"rotate_shift"``: the same rotation, then a move by whole pixels uniform
  in -3..3 on each axis (about 0.1 of a 28-pixel side, the usual
  ``RandomAffine(10, translate=(0.1, 0.1))`` of MNIST recipes). A patch
  embedding is not translation-equivariant below the patch size, so a
  ViT learns the shifts from data; the `cpu` profile's MNIST rows use it.
* ``"crop_flip"``: pad 4 zero pixels on each side, crop back to H x W at an
  offset uniform in -4..4 on each axis, then a left-right flip with
  probability 1/2 (CIFAR-like photographs). Whole-pixel moves, so the result
  is an exact copy of the padded crop.
* ``"none"``.
"""

import math

from keras import ops

from experiments.run_config import AUGMENTATIONS
from performer_keras.options import check_choice

MAX_ROTATION_DEGREES = 10.0
CROP_PADDING = 4
MAX_SHIFT_PIXELS = 3
# Draws per example: rotate uses the first, rotate_shift all three (angle, shift y, shift x),
# crop_flip all three (shift y, shift x, flip).
DRAWS = 3
_GOLDEN = 0x9E3779B9  # spreads the draw counter over the 32 bits before hashing


def augment(images, index, epoch, seed, kind):
    """Augmented float32 copies of ``images`` ``(B, H, W, C)`` (any dtype, pixel units).

    ``index`` ``(B,)`` holds each image's position in the training split and
    ``epoch`` the epoch: with ``seed`` they fix every random choice (`draw`).
    """
    images = ops.cast(images, "float32")
    parameters = draw(kind, seed, epoch, index)
    if "angle" in parameters:  # rotate, rotate_shift
        return rotate(images, parameters["angle"], parameters.get("shift_y", 0.0), parameters.get("shift_x", 0.0))
    if kind == "crop_flip":
        return crop_flip(images, parameters["shift_y"], parameters["shift_x"], parameters["flip"])
    return images


def draw(kind, seed, epoch, index):
    """Each example's augmentation parameters, ``(B,)`` tensors by name, from (seed, epoch, index).

    ``rotate``: ``angle`` in radians, uniform in +-10 degrees.
    ``rotate_shift``: that ``angle`` and whole-pixel ``shift_y`` and
    ``shift_x`` (float32) uniform in -3..3. ``crop_flip``: whole-pixel
    ``shift_y`` and ``shift_x`` uniform in -4..4 and a boolean ``flip`` with
    probability 1/2. ``none``: nothing.
    """
    check_choice("augmentation", kind, AUGMENTATIONS)
    if kind == "none":
        return {}
    draws = uniforms(seed, epoch, index)
    angle = (2.0 * draws[:, 0] - 1.0) * (MAX_ROTATION_DEGREES * math.pi / 180.0)
    if kind == "rotate":
        return {"angle": angle}
    if kind == "rotate_shift":
        shifts = _whole_pixels(draws[:, 1:3], MAX_SHIFT_PIXELS)
        return {"angle": angle, "shift_y": shifts[:, 0], "shift_x": shifts[:, 1]}
    shifts = _whole_pixels(draws[:, :2], CROP_PADDING)
    return {"shift_y": shifts[:, 0], "shift_x": shifts[:, 1], "flip": draws[:, 2] < 0.5}


def _whole_pixels(draws, limit):
    """Uniform [0, 1) draws as whole-pixel shifts uniform in -limit..limit (float32)."""
    # A uniform offset 0..2p of a p-padded image is a shift -p..p of the original.
    return ops.floor(draws * (2 * limit + 1)) - limit


def uniforms(seed, epoch, index):
    """``(B, DRAWS)`` float32 in [0, 1), a pure function of (seed, epoch, index[b], draw)."""
    key = _hash(ops.bitwise_xor(_hash(_word(seed % 2**32)), _word(epoch)))
    example = _hash(ops.bitwise_xor(key, _hash(_word(index))))  # (B,)
    counters = _word([(draw * _GOLDEN) % 2**32 for draw in range(DRAWS)])
    bits = _hash(ops.bitwise_xor(example[:, None], counters[None, :]))
    # The top 24 bits are exact in float32 and give a uniform grid on [0, 1).
    return ops.cast(ops.right_shift(bits, _word(8)), "float32") * (1.0 / (1 << 24))


def _word(value):
    return ops.cast(value, "uint32")


def _hash(x):
    """lowbias32: a bijection of uint32 whose output bits each depend on every input bit."""
    x = ops.bitwise_xor(x, ops.right_shift(x, _word(16)))
    x = ops.multiply(x, _word(0x7FEB352D))
    x = ops.bitwise_xor(x, ops.right_shift(x, _word(15)))
    x = ops.multiply(x, _word(0x846CA68B))
    return ops.bitwise_xor(x, ops.right_shift(x, _word(16)))


def rotate(images, angles, shift_y=0.0, shift_x=0.0):
    """Turn float32 ``images`` ``(B, H, W, C)`` by ``angles`` ``(B,)`` radians about the centre.

    Output pixel (x, y) reads the input at that point rotated about the
    centre (cx, cy) and moved by (``shift_x``, ``shift_y``) (``(B,)`` or
    scalars), bilinearly, with zeros outside; a positive angle turns the
    image counter-clockwise as displayed, like ``np.rot90``, and a positive
    shift moves the content up and to the left, like `crop_flip`'s.
    """
    height, width = images.shape[1], images.shape[2]
    y, x = _grid(height, width)
    cx, cy = (width - 1) / 2.0, (height - 1) / 2.0
    cos, sin = ops.cos(angles)[:, None, None], ops.sin(angles)[:, None, None]
    shift_y, shift_x = ops.reshape(shift_y, (-1, 1, 1)), ops.reshape(shift_x, (-1, 1, 1))
    source_x = cos * (x - cx) - sin * (y - cy) + cx + shift_x
    source_y = sin * (x - cx) + cos * (y - cy) + cy + shift_y
    return _bilinear(images, source_y, source_x)


def crop_flip(images, shift_y, shift_x, flip):
    """The zero-padded crop of each image moved by whole-pixel shifts, then mirrored where ``flip``.

    Output pixel (x, y) reads input pixel (x + shift_x, y + shift_y), or
    (W - 1 - x + shift_x, y + shift_y) when flipped; outside is zero.
    """
    height, width = images.shape[1], images.shape[2]
    y, x = _grid(height, width)
    x = ops.where(flip[:, None, None], (width - 1) - x, x)
    source_x = ops.cast(x + shift_x[:, None, None], "int32")
    source_y = ops.cast(y + shift_y[:, None, None], "int32")
    return _gather(images, source_y, source_x)


def _grid(height, width):
    """Output pixel coordinates as float32 ``(1, H, W)`` rows y and columns x."""
    y = ops.cast(ops.arange(height), "float32")[None, :, None] * ops.ones((1, 1, width))
    x = ops.cast(ops.arange(width), "float32")[None, None, :] * ops.ones((1, height, 1))
    return y, x


def _bilinear(images, source_y, source_x):
    """Bilinear samples at float ``(B, H, W)`` points: the four neighbours, each zero outside."""
    y0, x0 = ops.floor(source_y), ops.floor(source_x)
    fy, fx = source_y - y0, source_x - x0
    y0, x0 = ops.cast(y0, "int32"), ops.cast(x0, "int32")
    total = 0.0
    for dy, wy in ((0, 1.0 - fy), (1, fy)):
        for dx, wx in ((0, 1.0 - fx), (1, fx)):
            total = total + _gather(images, y0 + dy, x0 + dx) * (wy * wx)[..., None]
    return total


def _gather(images, source_y, source_x):
    """``images[b, source_y, source_x, :]`` for int32 ``(B, H, W)`` points, zero where outside."""
    batch, height, width, channels = images.shape
    inside = (source_y >= 0) & (source_y < height) & (source_x >= 0) & (source_x < width)
    flat = ops.clip(source_y, 0, height - 1) * width + ops.clip(source_x, 0, width - 1)
    flat = ops.repeat(ops.reshape(flat, (-1, height * width, 1)), channels, axis=2)
    pixels = ops.take_along_axis(ops.reshape(images, (-1, height * width, channels)), flat, axis=1)
    pixels = ops.reshape(pixels, (-1, height, width, channels))
    return ops.where(inside[..., None], pixels, 0.0)
