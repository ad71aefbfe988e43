"""2D Toeplitz relative position bias, applied densely, by FFT or by DFT matmuls."""

import numpy as np
import keras
from keras import ops

from performer_keras.options import (check_axis, check_choice, check_float_dtype, check_grid_size, check_grid_tokens,
                                     check_non_negative, check_positive, check_rank)


# How `ToeplitzBias2D.call` computes its sum: all three exact, see the class docstring.
PATHS = ("fft", "dft", "dense")


def _swap_last_axes(x):
    return ops.swapaxes(x, -1, -2)


def fast_fft_length(n):
    """The smallest length >= n with no prime factor above 5.

    Any length >= 2H - 1 keeps the circular correlation free of wrap-around,
    and FFT libraries are much slower on lengths with a large prime factor:
    a 64 x 64 grid needs 127, a prime, and gets 128.
    """
    n = max(int(n), 1)
    while True:
        m = n
        for p in (2, 3, 5):
            while m % p == 0:
                m //= p
        if m == 1:
            return n
        n += 1


def padded_fft_shape(grid_size):
    """(P, Q): the FFT path's padded grid for an (H, W) patch grid, the smallest fast lengths >= 2H - 1, 2W - 1."""
    height, width = grid_size
    return fast_fft_length(2 * height - 1), fast_fft_length(2 * width - 1)


def real_fft2(x, shape):
    """2D DFT of real (..., R, C), zero-padded to `shape` (P, Q), as (real, imag) of shape (..., Q//2 + 1, P).

    An rfft over columns then a complex fft over rows: half the work and memory
    of `fft2` on a zero imaginary part (the spectrum of a real signal is
    Hermitian). keras.ops has no rfft2, hence the two 1D passes. The column
    pass runs on the R rows given only: padding rows stay zero through it.
    """
    rows, cols = shape
    real, imag = ops.rfft(x, fft_length=cols)  # (..., R, Q//2 + 1)
    pad = [[0, 0]] * (len(ops.shape(x)) - 2) + [[0, rows - ops.shape(x)[-2]], [0, 0]]
    real, imag = ops.pad(real, pad), ops.pad(imag, pad)
    return ops.fft((_swap_last_axes(real), _swap_last_axes(imag)))


def inverse_real_fft2(real, imag, fft_length, rows=None):
    """Inverse of `real_fft2`: (..., Q//2 + 1, P) spectrum -> real (..., rows, Q), the first `rows` (default P) rows.

    The column pass, the costlier one, runs on the kept rows only.
    """
    length = ops.shape(real)[-1]
    # ifft(z) = conj(fft(conj(z))) / n: keras.ops has no 1D ifft.
    real, imag = ops.fft((real, -imag))
    real, imag = _swap_last_axes(real)[..., :rows, :] / length, -_swap_last_axes(imag)[..., :rows, :] / length
    return ops.irfft((real, imag), fft_length=fft_length)


def dft_angles(columns, width):
    """(W, len(columns)): 2 pi f c / (2W - 1), the phase of column (or offset) c at frequency f of the DFT path."""
    return 2 * np.pi * np.outer(np.arange(width), columns) / (2 * width - 1)


def column_dft_matrices(width):
    """(forward (2W, W), inverse (W, 2W)) float32: the length-(2W - 1) real DFT of a length-W column and its inverse.

    `forward @ u` stacks the real parts of the W frequencies 0..W-1 over their
    imaginary parts; `inverse @ [real; imag]` gives back the first W points
    of the real signal of that half spectrum. 2W - 1 is the shortest length
    whose circular correlation never wraps a column offset around, and an
    odd length has no Nyquist term, so frequency 0 alone is counted once.
    """
    length = 2 * width - 1
    angles = dft_angles(np.arange(width), width)
    forward = np.concatenate([np.cos(angles), -np.sin(angles)])
    weights = np.full((width, 1), 2.0 / length)
    weights[0] = 1.0 / length
    inverse = np.concatenate([np.cos(angles) * weights, -np.sin(angles) * weights]).T
    return forward.astype("float32"), inverse.astype("float32")


@keras.saving.register_keras_serializable(package="performer_keras")
class ToeplitzBias2D(keras.layers.Layer):
    """Toeplitz relative position encoding in 2D (Luo et al., NeurIPS 2021, arXiv:2106.12566).

    A learned bias b[dr, dc] per head for every row and column offset of the
    H x W patch grid ((2H-1) x (2W-1) values, initialised to 0). The weight
    of the pair (i, j) is multiplied by exp(b[p_j - p_i]); prefix (CLS) tokens
    have no grid position and take bias 0, i.e. factor 1, with every token.

    `call(values)` returns S_i = sum_j exp(b[p_j - p_i]) u_j for per-token
    vectors u (for kernelized attention, u_j = phi(k_j) (x) [v_j, 1], which
    gives numerator and normaliser in one pass). Over the patch grid this is a
    2D cross-correlation of u with exp(b), computed by a 2D real FFT on a
    P x Q grid, P >= 2H-1 and Q >= 2W-1 (large enough that circular
    wrap-around never mixes offsets; `fast_fft_length` rounds each up to a
    length without large prime factors) in O(N log N) per channel.
    `path="dft"` computes the same sum with matmuls only: a DFT of each grid
    row as a (2W, W) matrix, then for each of the W column frequencies the
    H x H Toeplitz operator of the row offsets (`dft_operators`), then the
    inverse DFT; O(N (H + W)) per channel, more multiply-adds than the FFT
    but at the speed of matrix products, where the FFT's passes are bound by
    memory. `path="dense"` computes the same sum with the dense N x N
    matrix, the readable reference. `bias_matrix()` gives
    the additive (heads, N, N) logit bias that softmax attention uses, so
    softmax + this bias is exactly the limit that kernelized attention + this
    bias approximates.

    Args:
        grid_size: (H, W) of the patch grid.
        num_heads: number of attention heads (one bias table each).
        num_prefix_tokens: tokens before the grid (1 for CLS).

    Call arguments:
        values: (batch, heads, N, channels), N = num_prefix_tokens + H*W.
        path: "fft" (default), "dft" or "dense" (`PATHS`).

    Returns: (batch, heads, N, channels), float32.
    Cost: FFT O(N log N c) time, O(N c) memory; DFT O(N (H + W) c) time,
    O(N c + heads N H) memory; dense O(N^2 c).
    """

    def __init__(self, grid_size, num_heads, num_prefix_tokens=1, **kwargs):
        super().__init__(**kwargs)
        check_float_dtype(self)
        self.grid_size = check_grid_size("grid_size", grid_size)
        self.num_heads = check_positive("num_heads", num_heads)
        self.num_prefix_tokens = check_non_negative("num_prefix_tokens", num_prefix_tokens)

    def build(self, values_shape=None):
        height, width = self.grid_size
        self.bias = self.add_weight(
            name="bias", shape=(self.num_heads, 2 * height - 1, 2 * width - 1), initializer="zeros"
        )

    def _spread(self, table, prefix_value, grid_rows=None):
        """(heads, N, N): `table` (heads, 2H-1, 2W-1) at offset p_j - p_i, `prefix_value` on prefix rows and columns.

        With `grid_rows` = (first, count), only the rows of the patch queries
        in grid rows first..first+count-1: (heads, count W, N); `first` may be
        a tensor (a block index inside `ops.map`), `count` is static.
        Two gathers with (H, H) and (W, W) offset indices, then a transpose:
        one gather with an (HW, HW) index would hold N^2 integers beside the
        result (1 GiB at 16,384 patches).
        """
        height, width = self.grid_size
        first, count = grid_rows or (0, height)
        query_rows = ops.arange(count) + first
        offsets = ops.arange(height)[None, :] - query_rows[:, None] + height - 1
        values = ops.take(table, offsets, axis=1)  # (heads, r_i, r_j, 2W-1)
        cols = np.arange(width)
        values = ops.take(values, cols[None, :] - cols[:, None] + width - 1, axis=3)  # (heads, r_i, r_j, c_i, c_j)
        values = ops.transpose(values, (0, 1, 3, 2, 4))  # (heads, r_i, c_i, r_j, c_j): row-major patches
        patch_values = ops.reshape(values, (self.num_heads, count * width, height * width))
        p = self.num_prefix_tokens
        query_pad = 0 if grid_rows else p
        return ops.pad(patch_values, [[0, 0], [query_pad, 0], [p, 0]], constant_values=prefix_value)

    def bias_matrix(self):
        """(heads, N, N) additive logit bias b[p_j - p_i], 0 on prefix rows and columns."""
        return self._spread(ops.cast(self.bias, "float32"), 0.0)

    def weight_matrix(self):
        """(heads, N, N) multiplicative weights exp(b[p_j - p_i]), 1 on prefix rows and columns.

        Equal to exp(bias_matrix()), with the exp taken over the (2H-1)(2W-1)
        table instead of the N^2 entries, forward and backward.
        """
        return self._spread(self.weight_table(), 1.0)

    def weight_table(self):
        """(heads, 2H-1, 2W-1) float32 exp(b): the multiplicative weight of every offset."""
        return ops.exp(ops.cast(self.bias, "float32"))

    def weight_rows(self, table, first, count):
        """(heads, count W, N): the rows of `weight_matrix()` of the patch queries in grid rows first..first+count-1.

        Gathered from `table` (`weight_table()`, passed in so that a caller
        recomputing a block in the backward pass, under `keras.remat`, reads
        no variable inside it), so no N x N tensor is formed.
        """
        return self._spread(table, 1.0, (first, count))

    def call(self, values, path="fft"):
        check_choice("path", path, PATHS)
        check_rank("ToeplitzBias2D", values.shape, "(batch, heads, tokens, channels)")
        check_axis("ToeplitzBias2D", values.shape, 1, "the heads axis (num_heads)", self.num_heads)
        check_grid_tokens("ToeplitzBias2D", values.shape, 2, self.grid_size, self.num_prefix_tokens)
        values = ops.cast(values, "float32")
        if path == "dense":
            return ops.matmul(self.weight_matrix(), values)  # (heads, N, N) @ (batch, heads, N, channels)
        if path == "dft":
            return self.correlate_dft(values, self.dft_operators())
        return self.correlate(values, self.kernel_spectrum())

    @property
    def fft_shape(self):
        """(P, Q): the padded grid of the FFT path (`padded_fft_shape`)."""
        return padded_fft_shape(self.grid_size)

    def kernel_spectrum(self):
        """(real, imag), each (heads, Q//2 + 1, P): the 2D DFT of exp(b) on the padded grid.

        Computed once per call of the layer and shared by every `correlate`
        of it (a linear kernel correlates its features in chunks).
        """
        height, width = self.grid_size
        rows, cols = self.fft_shape
        # Kernel K[dr mod P, dc mod Q] = exp(b[dr, dc]): zeros between the largest positive and
        # negative offsets, then offset 0 rolled to index 0.
        kernel = ops.pad(self.weight_table(),
                         [[0, 0], [0, rows - 2 * height + 1], [0, cols - 2 * width + 1]])
        kernel = ops.roll(kernel, (1 - height, 1 - width), axis=(1, 2))
        return real_fft2(kernel, (rows, cols))

    def correlate(self, values, spectrum):
        """S_i = sum_j exp(b[p_j - p_i]) u_j by FFT, for float32 `values` (batch, heads, N, channels) and `kernel_spectrum()`."""
        height, width = self.grid_size
        p = self.num_prefix_tokens
        prefix, patches = values[:, :, :p], values[:, :, p:]
        channels = ops.shape(values)[-1]
        grid = ops.reshape(patches, (-1, self.num_heads, height, width, channels))
        grid = ops.transpose(grid, (0, 1, 4, 2, 3))  # (batch, heads, channels, H, W)
        rows, cols = self.fft_shape
        kernel_real, kernel_imag = (part[None, :, None] for part in spectrum)
        grid_real, grid_imag = real_fft2(grid, (rows, cols))  # (batch, heads, channels, Q/2+1, P)
        # Cross-correlation S[n] = sum_m K[m - n] U[m]  <=>  S^ = conj(K^) U^.
        correlated = inverse_real_fft2(
            kernel_real * grid_real + kernel_imag * grid_imag,
            kernel_real * grid_imag - kernel_imag * grid_real,
            cols,
            rows=height,
        )
        correlated = correlated[..., :width]  # (batch, heads, channels, H, W)
        correlated = ops.transpose(correlated, (0, 1, 3, 4, 2))
        correlated = ops.reshape(correlated, (-1, self.num_heads, height * width, channels))
        return self._with_prefix(prefix, patches, correlated)

    def dft_operators(self):
        """(heads, W, 2H, 2H) float32: for each column frequency f, the row-offset operator of the DFT path.

        After a DFT along each grid row, the correlation over column offsets
        is a product per frequency, so what is left for frequency f is the
        H x H Toeplitz matrix M_f[r, s] = conj(T_f[s - r]), T_f[dr] the DFT
        of the bias row exp(b[dr, :]): complex, held as the real block
        [[Re, -Im], [Im, Re]] that multiplies [real; imag] stacked. Computed
        once per call of the layer and shared by every `correlate_dft` of it.
        """
        height, width = self.grid_size
        angles = dft_angles(np.arange(1 - width, width), width).T  # (2W-1, W): the offsets -(W-1)..W-1
        table = self.weight_table()  # (heads, 2H-1, 2W-1)
        real = ops.transpose(ops.matmul(table, np.cos(angles).astype("float32")), (0, 2, 1))  # (heads, W, 2H-1)
        imag = ops.transpose(ops.matmul(table, np.sin(angles).astype("float32")), (0, 2, 1))  # -Im T_f: the conjugate
        rows = np.arange(height)
        offsets = rows[None, :] - rows[:, None] + height - 1  # [r, s] -> s - r
        real, imag = ops.take(real, offsets, axis=2), ops.take(imag, offsets, axis=2)  # (heads, W, H, H)
        return ops.concatenate([ops.concatenate([real, -imag], axis=3), ops.concatenate([imag, real], axis=3)], axis=2)

    def correlate_dft(self, values, operators):
        """S_i = sum_j exp(b[p_j - p_i]) u_j by matmuls, for float32 `values` (batch, heads, N, channels) and `dft_operators()`."""
        height, width = self.grid_size
        heads, p = self.num_heads, self.num_prefix_tokens
        prefix, patches = values[:, :, :p], values[:, :, p:]
        channels = ops.shape(values)[-1]
        forward, inverse = column_dft_matrices(width)
        spectra = ops.matmul(forward, ops.reshape(patches, (-1, width, channels)))  # (batch heads H, 2W, channels)
        # Rows and (real, imag) to the contracted axis, batch and channels to the columns: one matmul per (head, frequency).
        spectra = ops.transpose(ops.reshape(spectra, (-1, heads, height, 2, width, channels)), (1, 4, 3, 2, 0, 5))
        spectra = ops.matmul(operators, ops.reshape(spectra, (heads, width, 2 * height, -1)))
        spectra = ops.transpose(ops.reshape(spectra, (heads, width, 2, height, -1, channels)), (4, 0, 3, 2, 1, 5))
        correlated = ops.matmul(inverse, ops.reshape(spectra, (-1, 2 * width, channels)))  # (batch heads H, W, channels)
        return self._with_prefix(prefix, patches, ops.reshape(correlated, (-1, heads, height * width, channels)))

    def _with_prefix(self, prefix, patches, correlated):
        """The patch tokens' grid sums `correlated`, completed with the prefix tokens: (batch, heads, N, channels)."""
        # Prefix keys weigh 1 for every query; prefix queries weigh every key by 1.
        prefix_sum = ops.sum(prefix, axis=2, keepdims=True)
        prefix_out = ops.repeat(prefix_sum + ops.sum(patches, axis=2, keepdims=True), self.num_prefix_tokens, axis=2)
        return ops.concatenate([prefix_out, correlated + prefix_sum], axis=2)

    def compute_output_shape(self, values_shape):
        return values_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            grid_size=self.grid_size, num_heads=self.num_heads, num_prefix_tokens=self.num_prefix_tokens
        )
        return config
