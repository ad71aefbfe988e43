"""2D rotary position embedding (axial RoPE and RoPE-Mixed)."""

import numpy as np
import keras
from keras import ops

from performer_keras.options import check_bool, check_finite, check_float_dtype, check_positions, check_rank


def axial_frequencies(dim, base):
    """(dim/2, 2) frequencies: first dim/4 pairs follow rows, the rest columns."""
    theta = base ** (-np.arange(dim // 4) / (dim // 4))
    zeros = np.zeros_like(theta)
    row_pairs = np.stack([theta, zeros], axis=-1)
    col_pairs = np.stack([zeros, theta], axis=-1)
    return np.concatenate([row_pairs, col_pairs]).astype("float32")


@keras.saving.register_keras_serializable(package="performer_keras")
class RotaryEmbedding2D(keras.layers.Layer):
    """2D rotary embedding (Su et al., arXiv:2104.09864; Heo et al., arXiv:2403.13298).

    Every vector x (the last axis, length `dim`, divisible by 4) is cut into
    dim/2 interleaved pairs; pair p is rotated by the angle
    a_p = f_p . (row, col):

        x:      [x0 x1 | x2 x3 | ... | x_{d/2-2} x_{d/2-1} | x_{d/2} x_{d/2+1} | ...]
        pair:     p0      p1             p_{d/4-1}               p_{d/4}      ...
        axial:  row*t0  row*t1 ...      row*t_{d/4-1}           col*t0       ...
        (x_{2p}, x_{2p+1}) -> (x_{2p} cos a_p - x_{2p+1} sin a_p,
                               x_{2p} sin a_p + x_{2p+1} cos a_p)

    with t_i = base^(-i / (d/4)): half of the dimensions rotate with the row,
    half with the column. `mixed=True` (RoPE-Mixed) makes the (dim/2, 2)
    frequency matrix f a learned weight per head, initialised to the axial one,
    so pairs can rotate along any direction of the grid. Since
    R(p_i)^T R(p_j) = R(p_j - p_i), q_i^T k_j depends only on p_j - p_i, and
    rotations preserve norms.

    Args:
        mixed: learn the frequencies per head (RoPE-Mixed).
        base: frequency base of the axial initialisation (100 suits image grids
            of tens of patches).

    Call arguments:
        inputs: (batch, heads, tokens, dim) vectors to rotate.
        positions: (tokens, 2) float (row, column) of each token.

    Returns: rotated inputs, same shape and dtype. Cost: O(N d).
    """

    def __init__(self, mixed=False, base=100.0, **kwargs):
        super().__init__(**kwargs)
        check_float_dtype(self)
        self.mixed = check_bool("mixed", mixed)
        self.base = float(check_finite("base", base, low=0.0, low_open=True))

    def build(self, inputs_shape, positions_shape=None):
        check_rank("RotaryEmbedding2D", inputs_shape, "(batch, heads, tokens, dim)", known=("heads", "dim") if self.mixed else ("dim",))
        dim = int(inputs_shape[-1])
        if dim % 4:
            raise ValueError(
                f"2D rope rotates pairs along rows and columns, so the rotated "
                f"dimension must be divisible by 4; got {dim}. Choose a head "
                f"dimension (width / heads) or num_features divisible by 4."
            )
        frequencies = axial_frequencies(dim, self.base)
        if self.mixed:
            heads = int(inputs_shape[-3])
            self.frequencies = self.add_weight(
                name="frequencies",
                shape=(heads, dim // 2, 2),
                initializer=keras.initializers.Constant(np.broadcast_to(frequencies, (heads, dim // 2, 2))),
            )
        else:
            self.frequencies = frequencies[None]  # (1, dim/2, 2), a constant

    def call(self, inputs, positions):
        frequencies = ops.cast(self.frequencies, "float32")
        positions = ops.cast(positions, "float32")
        check_positions("RotaryEmbedding2D", inputs.shape, positions.shape)
        angles = ops.matmul(frequencies, ops.transpose(positions))  # (heads, dim/2, tokens)
        angles = ops.transpose(angles, (0, 2, 1))  # (heads, tokens, dim/2)
        cos, sin = ops.cos(angles), ops.sin(angles)
        x = ops.cast(inputs, "float32")
        pairs = ops.reshape(x, ops.shape(x)[:-1] + (-1, 2))  # (batch, heads, tokens, dim/2, 2)
        even, odd = pairs[..., 0], pairs[..., 1]
        rotated = ops.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1)
        return ops.cast(ops.reshape(rotated, ops.shape(x)), inputs.dtype)

    def compute_output_shape(self, inputs_shape, positions_shape=None):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(mixed=self.mixed, base=self.base)
        return config
