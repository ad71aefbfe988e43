"""Circulant-STRING: learned commuting rotations applied by FFT."""

import keras
from keras import ops

from performer_keras.options import check_finite, check_float_dtype, check_positions, check_rank


@keras.saving.register_keras_serializable(package="performer_keras")
class CirculantString(keras.layers.Layer):
    """Circulant-STRING position encoding (Schenck et al., ICML 2025, arXiv:2502.02562).

        R(r) = exp(r_row L_row + r_col L_col),   L = C - C^T,

    with C circulant (first column c, learned per head). Circulant matrices
    commute and are diagonalised by the DFT: the eigenvalues of L are
    fft(c) - conj(fft(c)) = 2i Im(fft(c)) =: i lambda, so

        R(r) z = irfft(exp(i (r_row lambda_row + r_col lambda_col)) * rfft(z))

    in O(d log d) per token, never forming a d x d matrix. L is
    antisymmetric, so R(r) is orthogonal (norms are preserved) and
    R(r_i)^T R(r_j) = R(r_j - r_i): q_i^T k_j depends only on p_j - p_i.
    FFTs run in float32 (JAX's FFT rejects half precision).

    Args:
        initializer_stddev: std of the initial c, scaled by 1/sqrt(dim) so the
            initial lambda (radians per patch) have std about 0.7 at any dim.

    Call arguments:
        inputs: (batch, heads, tokens, dim). positions: (tokens, 2) float.

    Returns: rotated inputs, same shape and dtype. Cost: O(N d log d).
    """

    def __init__(self, initializer_stddev=0.5, **kwargs):
        super().__init__(**kwargs)
        check_float_dtype(self)
        self.initializer_stddev = check_finite("initializer_stddev", initializer_stddev, low=0.0)

    def build(self, inputs_shape, positions_shape=None):
        check_rank("CirculantString", inputs_shape, "(batch, heads, tokens, dim)", known=("heads", "dim"))
        heads, dim = int(inputs_shape[-3]), int(inputs_shape[-1])
        self.dim = dim
        initializer = keras.initializers.RandomNormal(stddev=self.initializer_stddev / dim**0.5)
        self.row_generator = self.add_weight(name="row_generator", shape=(heads, dim), initializer=initializer)
        self.col_generator = self.add_weight(name="col_generator", shape=(heads, dim), initializer=initializer)

    def eigenvalues(self):
        """(2, heads, dim//2 + 1) lambda of L_row and L_col: 2 Im(rfft(c))."""
        _, row_imag = ops.rfft(ops.cast(self.row_generator, "float32"))
        _, col_imag = ops.rfft(ops.cast(self.col_generator, "float32"))
        return ops.stack([2.0 * row_imag, 2.0 * col_imag])

    def call(self, inputs, positions):
        eigenvalues = self.eigenvalues()  # (2, heads, K)
        positions = ops.cast(positions, "float32")
        check_positions("CirculantString", inputs.shape, positions.shape)
        # (heads, tokens, K): r_row lambda_row + r_col lambda_col
        angles = (
            positions[None, :, 0:1] * eigenvalues[0][:, None, :]
            + positions[None, :, 1:2] * eigenvalues[1][:, None, :]
        )
        cos, sin = ops.cos(angles), ops.sin(angles)
        real, imag = ops.rfft(ops.cast(inputs, "float32"))  # (batch, heads, tokens, K)
        rotated = (real * cos - imag * sin, real * sin + imag * cos)
        return ops.cast(ops.irfft(rotated, fft_length=self.dim), inputs.dtype)

    def compute_output_shape(self, inputs_shape, positions_shape=None):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config["initializer_stddev"] = self.initializer_stddev
        return config
