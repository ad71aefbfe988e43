"""KernelAttention against a brute-force numpy reference, for every kernel x position.

The reference below is written to be checked by eye against the docstrings: it
recomputes q, k, v from the layer's own Dense weights, applies the position
encoding as DENSE matrices (2x2 rotations per RoPE pair, scipy's expm for
STRING, a loop over token pairs for the Toeplitz bias), builds the full N x N
attention weights and never uses FFTs or the layer's code paths. Everything is
float64, so a 1e-4 agreement is the float32 error of the layer alone.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import scipy.linalg

import performer_keras as pk
from performer_keras import KernelAttention, ToeplitzBias2D, kernel_attention
from performer_keras.grid import grid_positions
from performer_keras.toeplitz_bias_2d import fast_fft_length

from layer_test_case import run_layer_test, to_numpy

REPO = Path(__file__).resolve().parent.parent

GRID = (7, 7)
HEADS, WIDTH, BATCH = 2, 16, 2
HEAD_DIM = WIDTH // HEADS  # 8
TOKENS = 1 + GRID[0] * GRID[1]  # CLS + 7x7 patches = 50
NUM_FEATURES = 16
LINEAR_KERNELS = ("favor", "relu", "exp")
# The documented defaults, written out here rather than read from the layer.
DEFAULT_ORDER = {"softmax": "before", "linformer": "before", "favor": "before", "exp": "before", "relu": "after"}




# === Reference: position encodings as dense matrices. ===


def axial_frequencies_reference(dim, base=100.0):
    """(dim/2, 2): pair p < dim/4 turns with the row at t_p, pair dim/4 + p with the column."""
    quarter = dim // 4
    theta = [base ** (-i / quarter) for i in range(quarter)]
    return np.array([[t, 0.0] for t in theta] + [[0.0, t] for t in theta])


def rope_matrix(frequencies, position):
    """(dim, dim) block-diagonal rotation: pair (2p, 2p+1) turns by f_p . (row, col)."""
    dim = 2 * len(frequencies)
    rotation = np.zeros((dim, dim))
    for p, f in enumerate(frequencies):
        angle = f[0] * position[0] + f[1] * position[1]
        rotation[2 * p : 2 * p + 2, 2 * p : 2 * p + 2] = [
            [np.cos(angle), -np.sin(angle)],
            [np.sin(angle), np.cos(angle)],
        ]
    return rotation


def circulant(c):
    """C[i, j] = c[(i - j) mod d]: the circulant matrix with first column c."""
    d = len(c)
    return np.array([[c[(i - j) % d] for j in range(d)] for i in range(d)])


def string_matrix(row_generator, col_generator, position):
    """R(r) = expm(r_row L_row + r_col L_col) with L = C - C^T."""
    l_row = circulant(row_generator) - circulant(row_generator).T
    l_col = circulant(col_generator) - circulant(col_generator).T
    return scipy.linalg.expm(position[0] * l_row + position[1] * l_col)


def rotation_matrices(layer, position, dim, positions):
    """(heads, N, dim, dim): identity for the CLS token, R(p_i) for patch i."""
    rotations = np.tile(np.eye(dim), (HEADS, TOKENS, 1, 1))
    for h in range(HEADS):
        for i, p in enumerate(positions):
            if position == "rope":
                if layer.rope_mixed:
                    frequencies = to_numpy(layer.rotation.frequencies)[h]
                else:
                    frequencies = axial_frequencies_reference(dim)
                rotations[h, 1 + i] = rope_matrix(frequencies, p)
            else:
                rows, cols = to_numpy(layer.rotation.row_generator), to_numpy(layer.rotation.col_generator)
                rotations[h, 1 + i] = string_matrix(rows[h], cols[h], p)
    return rotations


def rotate(x, rotations):
    """x_i -> R_i x_i for (batch, heads, N, dim) x."""
    return np.einsum("hnij,bhnj->bhni", rotations, x)


def toeplitz_bias(table, grid, num_prefix=1):
    """(heads, N, N) bias b[r_j - r_i + H - 1, c_j - c_i + W - 1]; 0 in CLS rows and columns."""
    height, width = grid
    positions = grid_positions(grid).astype(int)
    tokens = num_prefix + len(positions)
    bias = np.zeros((table.shape[0], tokens, tokens))
    for i, (ri, ci) in enumerate(positions):
        for j, (rj, cj) in enumerate(positions):
            bias[:, num_prefix + i, num_prefix + j] = table[:, rj - ri + height - 1, cj - ci + width - 1]
    return bias


# === Reference: feature maps from their formulas. ===


def favor_reference(x, projection, is_query, stabilizer, epsilon=1e-6):
    """m^-1/2 (exp(W x' - |x'|^2/2 - M) + eps), x' = x d^-1/4.

    M: the max of W x' ("logits") or of the whole exponent ("exponent"), over
    features for each query; for keys ONE max over all keys and features of a
    (batch, head).
    """
    m, d = projection.shape
    x = x * d**-0.25
    logits = x @ projection.T  # (batch, heads, N, m)
    half_norm = 0.5 * np.sum(x**2, axis=-1, keepdims=True)
    axes = -1 if is_query else (-2, -1)
    stabiliser = np.max(logits if stabilizer == "logits" else logits - half_norm, axis=axes, keepdims=True)
    return m**-0.5 * (np.exp(logits - half_norm - stabiliser) + epsilon)


def relu_reference(x, projection, deterministic=False, epsilon=1e-3):
    """ReLU(W x) / sqrt(m) + eps, or ReLU(x) + eps when deterministic."""
    if deterministic:
        return np.maximum(x, 0.0) + epsilon
    m = projection.shape[0]
    return np.maximum(x @ projection.T, 0.0) / np.sqrt(m) + epsilon


def exp_reference(x, is_query, epsilon=1e-6):
    """exp(x' - M) + eps, x' = x d^-1/4, M as for FAVOR+."""
    x = x * x.shape[-1] ** -0.25
    axes = -1 if is_query else (-2, -1)
    return np.exp(x - np.max(x, axis=axes, keepdims=True)) + epsilon


# === Reference: the whole layer. ===


def split_heads(x):
    """(batch, N, width) -> (batch, heads, N, head_dim)."""
    return x.reshape(x.shape[0], x.shape[1], HEADS, -1).transpose(0, 2, 1, 3)


def dense(layer, x):
    return x @ to_numpy(layer.kernel) + to_numpy(layer.bias)


def softmax(logits):
    logits = logits - logits.max(axis=-1, keepdims=True)
    return np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)


def reference_attention(layer, x, kernel, position, rotation_order=None, deterministic=False, positions=None):
    """The layer's output, recomputed densely in float64."""
    x = np.asarray(x, dtype="float64")
    positions = grid_positions(GRID) if positions is None else positions
    d = HEAD_DIM
    q, k, v = (split_heads(dense(sub, x)) for sub in (layer.query, layer.key, layer.value))
    if layer.normalize_qk or (layer.normalize_qk is None and position == "kerple"):
        # Kerple l2-normalises q and k by default, any position on request: to norm qk_norm sqrt(d),
        # times exp(w_h) per head where the norm is learned.
        norm = layer.qk_norm * np.sqrt(d)
        if layer.learn_qk_norm:
            norm = norm * np.exp(to_numpy(layer.qk_log_scale)).reshape(1, -1, 1, 1)
        q = q / np.linalg.norm(q, axis=-1, keepdims=True) * norm
        k = k / np.linalg.norm(k, axis=-1, keepdims=True) * norm
    order = rotation_order or DEFAULT_ORDER[kernel]
    rotates = position in ("rope", "string")
    if rotates and order == "before":
        rotations = rotation_matrices(layer, position, d, positions)
        q, k = rotate(q, rotations), rotate(k, rotations)
    bias = toeplitz_bias(to_numpy(layer.toeplitz.bias), GRID) if position == "kerple" else 0.0

    if kernel == "softmax":
        weights = softmax(q @ k.swapaxes(-1, -2) / np.sqrt(d) + bias)  # (batch, heads, N, N)
        out = weights @ v
    elif kernel == "linformer":
        key_projection, value_projection = to_numpy(layer.key_projection), to_numpy(layer.value_projection)
        weights = softmax(q @ (key_projection @ k).swapaxes(-1, -2) / np.sqrt(d))  # (batch, heads, N, k)
        out = weights @ (value_projection @ v)
    else:
        if kernel == "favor":
            projection = to_numpy(layer.features.projection)
            phi_q, phi_k = (favor_reference(y, projection, is_query, layer.stabilizer) for y, is_query in ((q, True), (k, False)))
        elif kernel == "relu":
            projection = None if deterministic else to_numpy(layer.features.projection)
            phi_q, phi_k = (relu_reference(y, projection, deterministic) for y in (q, k))
        else:
            phi_q, phi_k = exp_reference(q, True), exp_reference(k, False)
        # w_ij = phi(q_i)^T phi(k_j) exp(b[p_j - p_i]), normalised by its row sum.
        weights = phi_q @ phi_k.swapaxes(-1, -2) * np.exp(bias)  # (batch, heads, N, N)
        numerator_weights = weights
        if rotates and order == "after":
            # Numerator with rotated features R_i phi(q_i), R_j phi(k_j); normaliser unrotated.
            rotations = rotation_matrices(layer, position, phi_q.shape[-1], positions)
            numerator_weights = rotate(phi_q, rotations) @ rotate(phi_k, rotations).swapaxes(-1, -2)
        out = (numerator_weights @ v) / weights.sum(axis=-1, keepdims=True)

    merged = out.transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[1], -1)  # (batch, N, width)
    return dense(layer.output_dense, merged)


# === Test set-up. ===


def inputs(seed=0):
    return np.random.default_rng(seed).normal(size=(BATCH, TOKENS, WIDTH)).astype("float32")


def build_with_random_parameters(seed=0, **kwargs):
    """A built layer whose every learned parameter is non-trivial."""
    layer = KernelAttention(num_heads=HEADS, grid_size=GRID, num_features=NUM_FEATURES, seed=seed, **kwargs)
    layer(inputs())
    rng = np.random.default_rng(seed + 100)

    def randomize(variable, scale):
        variable.assign(rng.normal(size=variable.shape).astype("float32") * scale)

    # Dense biases start at 0; random ones check that the layer adds them.
    for sub in (layer.query, layer.key, layer.value, layer.output_dense):
        randomize(sub.bias, 0.3)
    if layer.position == "rope" and layer.rope_mixed:
        randomize(layer.rotation.frequencies, 0.5)
    if hasattr(layer, "qk_log_scale"):
        randomize(layer.qk_log_scale, 0.7)
    if layer.position == "string":
        # About a radian per patch, so rotations over the 7x7 grid wrap around.
        randomize(layer.rotation.row_generator, 0.3)
        randomize(layer.rotation.col_generator, 0.3)
    if layer.position == "kerple":
        randomize(layer.toeplitz.bias, 0.5)
    return layer


def check_against_reference(kernel, position, rope_mixed=False, positions=None, **kwargs):
    layer = build_with_random_parameters(kernel_name=kernel, position=position, rope_mixed=rope_mixed, **kwargs)
    x = inputs(1)
    actual = to_numpy(layer(x) if positions is None else layer(x, positions=positions))
    expected = reference_attention(
        layer, x, kernel, position, kwargs.get("rotation_order"), kwargs.get("deterministic", False), positions
    )
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)


# "rope" is the axial RoPE, checked against the frequency formula; "rope_mixed"
# learns the frequencies, set to random values.
POSITION_CASES = ("absolute", "rope", "rope_mixed", "string", "kerple")
COMBINATIONS = [
    pytest.param(kernel, position, id=f"{kernel}-{position}")
    for kernel in ("softmax", "favor", "relu", "exp", "linformer")
    for position in POSITION_CASES
    if not (kernel == "linformer" and position == "kerple")
]


@pytest.mark.parametrize("kernel, position", COMBINATIONS)
def test_matches_brute_force_reference(kernel, position):
    mixed = position == "rope_mixed"
    check_against_reference(kernel, "rope" if mixed else position, rope_mixed=mixed)


@pytest.mark.parametrize("position", ["absolute", "rope", "string", "kerple"])
def test_favor_with_the_performer_s_stabilizer_matches_brute_force_reference(position):
    check_against_reference("favor", position, stabilizer="logits")


@pytest.mark.parametrize(
    "kernel, position, order",
    [
        ("favor", "rope", "after"),
        ("favor", "string", "after"),
        ("exp", "string", "after"),
        ("relu", "rope", "before"),
        ("relu", "string", "before"),
    ],
)
def test_non_default_rotation_order_matches_reference(kernel, position, order):
    check_against_reference(kernel, position, rope_mixed=True, rotation_order=order)


@pytest.mark.parametrize("kernel, position, normalize, norm", [
    ("softmax", "absolute", True, 0.5), ("favor", "rope", True, 0.5), ("relu", "string", True, 2.0),
    ("favor", "kerple", None, 0.25), ("softmax", "kerple", False, 1.0),
])
def test_q_and_k_normalisation_is_an_option_of_every_position(kernel, position, normalize, norm):
    check_against_reference(kernel, position, normalize_qk=normalize, qk_norm=norm)


@pytest.mark.parametrize("kernel, position, normalize", [
    ("softmax", "kerple", None), ("favor", "kerple", None), ("relu", "absolute", True), ("favor", "rope", True),
])
def test_learned_qk_norm_matches_reference_and_round_trips(kernel, position, normalize):
    layer = build_with_random_parameters(kernel_name=kernel, position=position, normalize_qk=normalize,
                                         learn_qk_norm=True)
    assert layer.qk_log_scale.trainable and tuple(layer.qk_log_scale.shape) == (HEADS,)
    check_against_reference(kernel, position, normalize_qk=normalize, learn_qk_norm=True)
    x = inputs(1)
    clone = KernelAttention.from_config(layer.get_config())
    clone(x)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(to_numpy(clone(x)), to_numpy(layer(x)), rtol=1e-6, atol=1e-6)


def test_learned_qk_norm_starts_at_qk_norm_and_needs_normalisation():
    fixed = build_with_random_parameters(kernel_name="softmax", position="kerple", qk_norm=0.5, learn_qk_norm=False)
    learned = KernelAttention(num_heads=HEADS, kernel_name="softmax", position="kerple", grid_size=GRID, qk_norm=0.5)
    x = inputs(1)
    learned(x)
    for name in ("query", "key", "value", "output_dense"):
        for target, source in zip(getattr(learned, name).weights, getattr(fixed, name).weights):
            target.assign(source)
    learned.toeplitz.bias.assign(fixed.toeplitz.bias)
    # w = 0 at first: the same output as the fixed norm.
    np.testing.assert_allclose(to_numpy(learned(x)), to_numpy(fixed(x)), rtol=1e-6, atol=1e-6)
    # Without normalisation there is no norm to learn: no weight.
    plain = KernelAttention(num_heads=HEADS, kernel_name="softmax", position="absolute", learn_qk_norm=True)
    plain(x)
    assert not hasattr(plain, "qk_log_scale") and len(plain.weights) == 8


def test_a_config_saved_before_the_norm_and_stabilizer_options_keeps_their_old_meaning():
    saved = build_with_random_parameters(kernel_name="favor", position="kerple", qk_norm=1.0, learn_qk_norm=False,
                                         stabilizer="logits")
    config = saved.get_config()
    del config["qk_norm"], config["learn_qk_norm"], config["stabilizer"]
    loaded = KernelAttention.from_config(config)
    assert (loaded.qk_norm, loaded.learn_qk_norm, loaded.stabilizer) == (1.0, False, "logits")
    x = inputs(1)
    loaded(x)
    loaded.set_weights(saved.get_weights())
    np.testing.assert_allclose(to_numpy(loaded(x)), to_numpy(saved(x)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("position", ["absolute", "rope", "kerple"])
def test_deterministic_relu_matches_reference(position):
    # With rope the deterministic features (m = d = 8) are rotated in the numerator.
    check_against_reference("relu", position, rope_mixed=True, deterministic=True)


@pytest.mark.parametrize("kernel, position", [("softmax", "rope"), ("favor", "string"), ("relu", "rope")])
def test_explicit_positions_argument_matches_reference(kernel, position):
    # call(..., positions=...) replaces the grid: stretched and shifted coordinates.
    positions = (grid_positions(GRID) * 1.5 + np.array([0.5, -2.0])).astype("float32")
    check_against_reference(kernel, position, rope_mixed=True, positions=positions)


def test_positions_may_be_a_nested_list():
    # A list of [row, column] pairs ended in "'list' object has no attribute 'shape'".
    layer = build_with_random_parameters(kernel_name="favor", position="rope")
    positions = grid_positions(GRID)[::-1].astype("float32")
    np.testing.assert_array_equal(to_numpy(layer(inputs(), positions=positions.tolist())),
                                  to_numpy(layer(inputs(), positions=positions)))


@pytest.mark.parametrize("kernel, position", [("softmax", "kerple"), ("favor", "kerple"), ("relu", "absolute")])
def test_positions_argument_is_refused_where_it_cannot_be_used(kernel, position):
    layer = build_with_random_parameters(kernel_name=kernel, position=position)
    with pytest.raises(ValueError, match="positions are used by the rotations"):
        layer(inputs(), positions=grid_positions(GRID)[::-1].astype("float32"))


@pytest.mark.parametrize("shape", [(GRID[0] * GRID[1] - 1, 2), (GRID[0] * GRID[1], 3), (GRID[0] * GRID[1] * 2,)])
def test_positions_of_another_shape_are_refused_by_name(shape):
    # They failed in the backend's multiply inside the rotation ("Incompatible shapes").
    layer = build_with_random_parameters(kernel_name="softmax", position="rope")
    with pytest.raises(ValueError, match=re.escape(f"positions must be ({GRID[0] * GRID[1]}, 2)") + ".*"
                       + re.escape(f"got shape {shape}")):
        layer(inputs(), positions=np.zeros(shape, "float32"))


def test_feature_maps_refuse_queries_and_keys_of_two_widths():
    for features in (pk.FavorFeatures(num_features=8), pk.ReluFeatures(num_features=8), pk.ExpFeatures()):
        with pytest.raises(ValueError, match="takes queries and keys of one width d, got 8 and 4"):
            features(np.ones((1, 2, 5, 8), "float32"), np.ones((1, 2, 5, 4), "float32"))


@pytest.mark.parametrize("position", ["absolute", "kerple", "rope"])
def test_fused_softmax_matches_explicit(position):
    explicit = build_with_random_parameters(kernel_name="softmax", position=position, rope_mixed=True)
    fused = KernelAttention(
        num_heads=HEADS, kernel_name="softmax", position=position, grid_size=GRID, rope_mixed=True, fused=True
    )
    x = inputs(2)
    fused(x)
    fused.set_weights(explicit.get_weights())
    np.testing.assert_allclose(to_numpy(fused(x)), to_numpy(explicit(x)), rtol=1e-5, atol=1e-5)


def test_fast_fft_length_is_the_smallest_5_smooth_length_at_least_n():
    def smooth(n):
        return all(p in (2, 3, 5) for p in range(2, n + 1) if n % p == 0 and all(p % q for q in range(2, p)))
    for n in range(1, 300):
        expected = next(m for m in range(n, 2 * n + 2) if smooth(m))
        assert fast_fft_length(n) == expected, n
    assert fast_fft_length(127) == 128 and fast_fft_length(13) == 15


@pytest.mark.parametrize("path", ["fft", "dft"])
@pytest.mark.parametrize("grid, num_prefix", [((7, 7), 1), ((3, 5), 2), ((4, 3), 0), ((7, 11), 1), ((1, 6), 1), ((5, 1), 1)])
def test_toeplitz_fft_and_dft_match_dense(grid, num_prefix, path):
    # Non-square grids catch a swapped row/column; several prefixes the CLS handling; one row or
    # one column the degenerate transforms. 7 and 11 pad 13 and 21 up to 15 and 25 on the FFT path,
    # so the zeros between positive and negative offsets are checked.
    rng = np.random.default_rng(3)
    layer = ToeplitzBias2D(grid, num_heads=HEADS, num_prefix_tokens=num_prefix)
    tokens = num_prefix + grid[0] * grid[1]
    values = rng.normal(size=(BATCH, HEADS, tokens, 5)).astype("float32")
    layer(values)
    layer.bias.assign(rng.normal(size=layer.bias.shape).astype("float32") * 0.5)
    dense_path = to_numpy(layer(values, path="dense"))
    np.testing.assert_allclose(to_numpy(layer(values, path=path)), dense_path, rtol=1e-4, atol=1e-4)
    # And the dense path itself is S_i = sum_j exp(b[p_j - p_i]) u_j.
    bias = toeplitz_bias(to_numpy(layer.bias), grid, num_prefix)
    np.testing.assert_allclose(dense_path, np.exp(bias) @ values, rtol=1e-5, atol=1e-5)


# === The shared layer contract, covering every kernel and position once. ===


@pytest.mark.parametrize(
    "kwargs, num_trainable, num_non_trainable",
    [
        # 4 Dense x (kernel, bias) = 8 trainable, plus what the position and kernel add.
        # The bias table and the learned q/k norm of each head.
        pytest.param(dict(kernel_name="softmax", position="kerple"), 10, 0, id="softmax-kerple"),
        pytest.param(dict(kernel_name="softmax", position="kerple", learn_qk_norm=False), 9, 0, id="softmax-kerple-fixed"),
        pytest.param(dict(kernel_name="favor", position="rope", rope_mixed=True), 9, 1, id="favor-rope_mixed"),
        pytest.param(dict(kernel_name="relu", position="string"), 10, 1, id="relu-string"),  # 2 generators
        pytest.param(dict(kernel_name="exp", position="absolute"), 8, 0, id="exp-absolute"),
        pytest.param(dict(kernel_name="linformer", position="rope"), 10, 0, id="linformer-rope"),  # E and F
        # Redraws add the step counter to the projection.
        pytest.param(dict(kernel_name="favor", position="kerple", redraw_interval=3), 10, 2, id="favor-kerple-redraw"),
    ],
)
def test_layer_contract(kwargs, num_trainable, num_non_trainable, tmp_path):
    run_layer_test(
        KernelAttention,
        dict(num_heads=HEADS, grid_size=GRID, num_features=NUM_FEATURES, seed=0, **kwargs),
        inputs(),
        expected_output_shape=(BATCH, TOKENS, WIDTH),
        expected_num_trainable_weights=num_trainable,
        expected_num_non_trainable_weights=num_non_trainable,
        tmp_path=tmp_path,
    )


# === Kerple with a linear kernel: the dense and the FFT path. ===

ODD_GRID = (5, 7)  # odd, not square: the FFT's padded grid and the offsets' signs are both exercised


def fft_elements_per_feature(path="fft"):
    """The float32 elements one feature's channels take per example on the FFT path's padded grid, or the DFT path's half spectra."""
    probe = KernelAttention(HEADS, "favor", "kerple", grid_size=ODD_GRID, num_features=NUM_FEATURES, toeplitz_path=path)
    probe.build((None, 1 + ODD_GRID[0] * ODD_GRID[1], WIDTH))
    rows, cols = probe.toeplitz.fft_shape if path == "fft" else (2, ODD_GRID[0] * ODD_GRID[1])
    return HEADS * (HEAD_DIM + 1) * rows * cols


@pytest.mark.parametrize("kernel", ["favor", "relu", "exp"])
@pytest.mark.parametrize("path", ["dense", "dense-blocked", "fft", "fft-chunked", "dft", "dft-chunked"])
def test_every_kerple_path_matches_brute_force_on_an_odd_grid(kernel, path, monkeypatch):
    if path.endswith("-chunked"):
        # Three features per chunk (the last holds one of the 16): every chunk goes through keras.remat.
        path = path.removesuffix("-chunked")
        monkeypatch.setattr(kernel_attention, "FFT_CHUNK_ELEMENTS", 3 * fft_elements_per_feature(path))
        monkeypatch.setattr(kernel_attention, "DFT_ONE_PIECE_ELEMENTS", 1)
    if path == "dense-blocked":
        # Two grid rows per block (the last holds one): every block goes through keras.remat.
        monkeypatch.setattr(kernel_attention, "DENSE_ONE_PIECE_ELEMENTS", 1)
        monkeypatch.setattr(kernel_attention, "DENSE_BLOCK_ELEMENTS", HEADS * ODD_GRID[1] * (1 + ODD_GRID[0] * ODD_GRID[1]) * 2)
        path = "dense"
    tokens = 1 + ODD_GRID[0] * ODD_GRID[1]
    layer = KernelAttention(num_heads=HEADS, kernel_name=kernel, position="kerple", grid_size=ODD_GRID,
                            num_features=NUM_FEATURES, seed=0, toeplitz_path=path)
    x = np.random.default_rng(3).normal(size=(BATCH, tokens, WIDTH)).astype("float32")
    layer(x)
    rng = np.random.default_rng(4)
    layer.toeplitz.bias.assign(rng.normal(size=layer.toeplitz.bias.shape).astype("float32") * 0.5)
    for sub in (layer.query, layer.key, layer.value, layer.output_dense):
        sub.bias.assign(rng.normal(size=sub.bias.shape).astype("float32") * 0.3)
    layer.qk_log_scale.assign(rng.normal(size=HEADS).astype("float32") * 0.5)
    assert layer.toeplitz_path_used == path
    actual = to_numpy(layer(x))

    x64 = x.astype("float64")
    q, k, v = (split_heads(dense(sub, x64)) for sub in (layer.query, layer.key, layer.value))
    norm = layer.qk_norm * np.sqrt(HEAD_DIM) * np.exp(to_numpy(layer.qk_log_scale)).reshape(1, -1, 1, 1)
    q, k = (y / np.linalg.norm(y, axis=-1, keepdims=True) * norm for y in (q, k))
    if kernel == "favor":
        projection = to_numpy(layer.features.projection)
        phi_q, phi_k = (favor_reference(y, projection, is_query, layer.stabilizer) for y, is_query in ((q, True), (k, False)))
    elif kernel == "relu":
        projection = to_numpy(layer.features.projection)
        phi_q, phi_k = relu_reference(q, projection), relu_reference(k, projection)
    else:
        phi_q, phi_k = exp_reference(q, True), exp_reference(k, False)
    weights = phi_q @ phi_k.swapaxes(-1, -2) * np.exp(toeplitz_bias(to_numpy(layer.toeplitz.bias), ODD_GRID))
    out = (weights @ v) / weights.sum(axis=-1, keepdims=True)  # (batch, heads, N, d)
    expected = dense(layer.output_dense, out.transpose(0, 2, 1, 3).reshape(BATCH, tokens, WIDTH))
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)


def test_loop_chunks_are_the_largest_within_the_budget_and_cover_every_item_once():
    for count in range(1, 13):
        for per_item in range(1, 6):
            for budget in range(1, 70):
                size, whole, rest = kernel_attention.loop_chunks(count, per_item, budget)
                assert whole * size + rest == count and whole >= 1 and 0 <= rest < size
                # Within the budget, unless one item alone passes it; one item more would not be.
                assert size * per_item <= budget or size == 1
                assert size == count or (size + 1) * per_item > budget, (count, per_item, budget)


def record_remat_calls(monkeypatch):
    """A list that gets the first argument's shape at every call of a function keras.remat wrapped (a piece of a looped path)."""
    remat_calls = []
    remat = keras.remat

    def recording_remat(f):
        recomputed = remat(f)
        return lambda *args: remat_calls.append(tuple(args[0].shape)) or recomputed(*args)

    monkeypatch.setattr(keras, "remat", recording_remat)
    return remat_calls


@pytest.mark.parametrize("chunked", ["fft", "dft", "dense"])
def test_the_chunked_paths_train_like_the_one_piece_dense_path(chunked, monkeypatch):
    """Gradients through keras.remat's recomputation equal the one-piece dense path's: one SGD step (lr 1) changes every weight alike."""
    remat_calls = record_remat_calls(monkeypatch)
    tokens = 1 + ODD_GRID[0] * ODD_GRID[1]
    rng = np.random.default_rng(5)
    x = rng.normal(size=(BATCH, tokens, WIDTH)).astype("float32")
    y = rng.normal(size=(BATCH, tokens, WIDTH)).astype("float32")
    models, before = [], None
    for path in ("dense", chunked):
        if models:  # the reference is the dense path in one piece; then every chunk goes through keras.remat
            monkeypatch.setattr(kernel_attention, "FFT_CHUNK_ELEMENTS", 3 * fft_elements_per_feature(chunked))
            monkeypatch.setattr(kernel_attention, "DFT_ONE_PIECE_ELEMENTS", 1)
            monkeypatch.setattr(kernel_attention, "DENSE_ONE_PIECE_ELEMENTS", 1)
            monkeypatch.setattr(kernel_attention, "DENSE_BLOCK_ELEMENTS", 1)
        inputs = keras.Input((tokens, WIDTH))
        layer = KernelAttention(num_heads=HEADS, kernel_name="favor", position="kerple", grid_size=ODD_GRID,
                                num_features=NUM_FEATURES, seed=0, toeplitz_path=path)
        model = keras.Model(inputs, layer(inputs))
        if before is None:
            layer.toeplitz.bias.assign(rng.normal(size=layer.toeplitz.bias.shape).astype("float32") * 0.5)
            before = [to_numpy(w) for w in model.weights]
        else:
            model.set_weights(before)
        # XLA, as train.py compiles on both backends: TensorFlow's XLA differentiates only a loop of known length.
        model.compile(optimizer=keras.optimizers.SGD(1.0), loss="mse", jit_compile=True)
        model.train_on_batch(x, y)
        assert layer.toeplitz_path_used == path
        models.append(model)
    assert remat_calls, f"the {chunked} path did not chunk"
    if chunked == "dense":  # blocks of one grid row's queries
        assert {shape[2] for shape in remat_calls} == {ODD_GRID[1]}
    else:  # five chunks of three features in one loop, then the sixteenth feature
        assert {shape[-1] for shape in remat_calls} == {3, 1}
    for one_piece, chunks, start in zip(models[0].weights, models[1].weights, before):
        np.testing.assert_allclose(to_numpy(chunks) - start, to_numpy(one_piece) - start, rtol=1e-4, atol=1e-6)
    assert any(np.abs(to_numpy(w) - start).max() > 1e-3 for w, start in zip(models[1].weights, before))


@pytest.mark.parametrize("path", ["fft", "dft"])
def test_the_transform_paths_chunk_only_above_their_one_piece_threshold(path, monkeypatch):
    """The FFT path chunks above FFT_CHUNK_ELEMENTS per example, the DFT path above DFT_ONE_PIECE_ELEMENTS, in chunks of FFT_CHUNK_ELEMENTS."""
    remat_calls = record_remat_calls(monkeypatch)
    per_feature = fft_elements_per_feature(path)
    tokens = 1 + ODD_GRID[0] * ODD_GRID[1]
    x = np.random.default_rng(6).normal(size=(BATCH, tokens, WIDTH)).astype("float32")
    layer = KernelAttention(HEADS, "favor", "kerple", grid_size=ODD_GRID, num_features=NUM_FEATURES, seed=0,
                            toeplitz_path=path)
    outputs = []
    # The whole features at the threshold (one piece), then one element fewer (chunks).
    for threshold in (NUM_FEATURES * per_feature, NUM_FEATURES * per_feature - 1):
        remat_calls.clear()
        monkeypatch.setattr(kernel_attention, "FFT_CHUNK_ELEMENTS", threshold if path == "fft" else 3 * per_feature)
        monkeypatch.setattr(kernel_attention, "DFT_ONE_PIECE_ELEMENTS", threshold if path == "dft" else 2**40)
        outputs.append(to_numpy(layer(x)))
        # FFT: chunks of the most features within the threshold (15, then 1); DFT: of three (then 1).
        assert {shape[-1] for shape in remat_calls} == (set() if len(outputs) == 1 else {15, 1} if path == "fft" else {3, 1})
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=1e-5, atol=1e-6)


# Compiles one training step of a favor-kerple layer on a 32 x 32 grid with JAX, on the path named
# by its argument, in one piece and looped (dense: blocks of one grid row; fft: chunks of one
# feature), and prints XLA's temporary memory of each.
LOOP_MEMORY_PROGRAM = """
import json, os, sys
os.environ["KERAS_BACKEND"] = "jax"
import jax
import numpy as np
from keras import ops
from performer_keras import KernelAttention, kernel_attention

path = sys.argv[1]

def training_temp_bytes(looped):
    kernel_attention.DENSE_ONE_PIECE_ELEMENTS = 1 if looped else 2**40
    kernel_attention.DENSE_BLOCK_ELEMENTS = 1
    kernel_attention.FFT_CHUNK_ELEMENTS = 1 if looped else 2**40
    layer = KernelAttention(2, "favor", "kerple", grid_size=(32, 32), num_features=16, seed=0, toeplitz_path=path)
    x = np.random.default_rng(0).normal(size=(1, 1 + 32 * 32, 32)).astype("float32")
    layer(x)
    trainable = [v.value for v in layer.trainable_variables]
    non_trainable = [v.value for v in layer.non_trainable_variables]
    loss = lambda trainable, x: ops.sum(ops.square(layer.stateless_call(trainable, non_trainable, x)[0]))
    return jax.jit(jax.grad(loss)).lower(trainable, x).compile().memory_analysis().temp_size_in_bytes

print(json.dumps({"one_piece": training_temp_bytes(False), "looped": training_temp_bytes(True)}))
"""


@pytest.mark.parametrize("path", ["dense", "fft"])
def test_the_looped_paths_hold_one_chunk_at_a_time_under_xla_on_jax(path):
    """XLA may run independent pieces together: as separate calls from a Python loop, the dense
    path's blocks of a training step on JAX took as much memory as its one piece (36.0 against 35.7
    MB here; out of memory at 16,385 tokens), the FFT path's 16 feature chunks most of it (37.4
    against 47.5 MB). As the iterations of one loop they take a fraction (dense: 3.4 MB, a tenth).
    In a JAX process whatever the suite's backend: the compiler's memory plan is the point."""
    done = subprocess.run([sys.executable, "-c", LOOP_MEMORY_PROGRAM, path], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr[-2000:]
    temp = json.loads(done.stdout.strip().splitlines()[-1])
    # Dense: one block is 2 heads x 32 queries x 1,025 keys, the one piece 2 x 1,025^2, 32 times more.
    # FFT: one chunk correlates 1 feature's channels, the one piece all 16.
    assert temp["looped"] * 5 < temp["one_piece"], temp


def test_auto_takes_the_path_the_cost_model_predicts_faster():
    from performer_keras.kernel_attention import (DENSE_ELEMENTWISE_COST, DFT_COST_FACTORS, DFT_ELEMENTWISE_COST,
                                                  FFT_COST_FACTORS, auto_toeplitz_path, dft_cost_factor,
                                                  fft_cost_factor, toeplitz_costs)
    from profiles import kerple_paths

    def auto_path(grid, num_features, head_dim):
        layer = KernelAttention(2, "favor", "kerple", grid_size=grid, num_features=num_features)
        layer.build((None, 1 + grid[0] * grid[1], 2 * head_dim))
        return layer.toeplitz_path_used

    # The model's counts, by hand for a 64 x 128 grid (8,193 tokens; padded 128 x 256) at m = 16, d = 16.
    costs = toeplitz_costs(8193, (64, 128), 16, 16)
    assert costs == {"dense": 8193**2 * (32 + DENSE_ELEMENTWISE_COST), "fft": 16 * 17 * 128 * 256 * 15,
                     "dft": 16 * 17 * (2 * 128 * 128 * 64 + 128 * (2 * 64) ** 2 + 2 * 128 * 128 * 64
                                       + 64 * 128 * DFT_ELEMENTWISE_COST)}
    # Each backend its own factors; one without measured factors takes TensorFlow's.
    assert (fft_cost_factor(), dft_cost_factor()) == (FFT_COST_FACTORS[keras.backend.backend()],
                                                      DFT_COST_FACTORS[keras.backend.backend()])
    assert (fft_cost_factor("torch"), dft_cost_factor("torch")) == (FFT_COST_FACTORS["tensorflow"], DFT_COST_FACTORS["tensorflow"])
    # The smallest weighted count wins, the dense path on a tie.
    assert auto_toeplitz_path({"dense": 10.0, "fft": 10.0 / fft_cost_factor(), "dft": 1.0}) == "dft"
    tie = {"dense": 10.0, "fft": 10.0 / fft_cost_factor(), "dft": 10.0 / dft_cost_factor()}
    assert auto_toeplitz_path(tie) == "dense"
    assert auto_toeplitz_path({"dense": 2.0 * fft_cost_factor(), "fft": 1.0}) == "fft"  # a subset of the paths
    # Square grids of growing side: the dense path up to some side, and only the transform
    # paths beyond it; it holds longer for m = 64, d = 32 than for m = 16, d = 16.
    switch = {}
    for num_features, head_dim in ((16, 16), (64, 32)):
        for side in range(8, 161, 8):
            path = auto_path((side, side), num_features, head_dim)
            assert path == auto_toeplitz_path(toeplitz_costs(1 + side * side, (side, side), num_features, head_dim))
            if path != "dense":
                switch.setdefault((num_features, head_dim), side)
            else:
                assert (num_features, head_dim) not in switch, "dense again after a transform path"
    assert switch[(16, 16)] < switch.get((64, 32), 10**9)
    # Every point of the profiles this backend's factors were fitted to (README, "KERPLE's three
    # paths"): the fastest path it timed.
    for record in kerple_paths.fitted(kerple_paths.committed_records(), keras.backend.backend()):
        assert not kerple_paths.auto_mistakes(record), record["command"]
    softmax = KernelAttention(2, "softmax", "kerple", grid_size=(2, 2))
    softmax.build((None, 5, 8))
    assert softmax.toeplitz_path_used is None
    with pytest.raises(ValueError, match="Unknown toeplitz_path 'sparse'"):
        KernelAttention(2, "favor", "kerple", grid_size=(2, 2), toeplitz_path="sparse")
    with pytest.raises(ValueError, match=r"Unknown path 'sparse'; expected one of \('fft', 'dft', 'dense'\)"):
        ToeplitzBias2D((2, 2), 2)(np.zeros((1, 2, 5, 3), "float32"), path="sparse")


def test_fused_is_refused_for_kernels_without_a_fused_form():
    # It was accepted and ignored: a caller asking for flash attention on favor got the explicit path silently.
    for kernel in ("favor", "relu", "exp", "linformer"):
        with pytest.raises(ValueError, match=f"kernel '{kernel}' has no fused form"):
            KernelAttention(2, kernel, fused=True)
    assert KernelAttention(2, "softmax", "kerple", grid_size=(2, 2), fused=True).fused


@pytest.mark.parametrize("layer, shape, layout", [
    (lambda: KernelAttention(2), (3, 5, 8, 2), "(batch, tokens, width)"),
    (lambda: KernelAttention(2), (5, 8), "(batch, tokens, width)"),
    (lambda: pk.ClassToken(), (5, 8), "(batch, tokens, width)"),
    (lambda: pk.PositionEmbedding(), (2, 5, 8, 1), "(batch, tokens, width)"),
    (lambda: pk.CirculantString(), (2, 5, 8), "(batch, heads, tokens, dim)"),
])
def test_layers_name_the_inputs_they_take_when_given_another_rank(layer, shape, layout):
    # Unchecked, these failed inside the layer: "not enough values to unpack", a backend's concat error.
    with pytest.raises(ValueError, match=re.escape(f"takes {layout} inputs, got shape {shape}")):
        layer().build(shape)
    if len(shape) == 2:  # what a caller sees: the call builds the layer
        with pytest.raises(ValueError, match=re.escape(f"takes {layout} inputs")):
            layer()(np.zeros(shape, "float32"))


@pytest.mark.parametrize("layer, shape, message", [
    # Each failed as "int() argument must be a string, a bytes-like object or a real number, not 'NoneType'".
    (lambda: KernelAttention(2), (None, 5, None), "KernelAttention needs a known width"),
    (lambda: pk.ClassToken(), (None, 5, None), "ClassToken needs a known width"),
    (lambda: pk.PositionEmbedding(), (None, None, 8), "PositionEmbedding needs a known tokens"),
    (lambda: pk.RotaryEmbedding2D(), (None, 2, 5, None), "RotaryEmbedding2D needs a known dim"),
    (lambda: pk.RotaryEmbedding2D(mixed=True), (None, None, 5, 8), "RotaryEmbedding2D needs a known heads"),
    (lambda: pk.CirculantString(), (None, None, 5, 8), "CirculantString needs a known heads"),
    (lambda: pk.FavorFeatures(num_features=4), (None, 2, 5, None), "FavorFeatures needs a known width d"),
])
def test_layers_name_the_axis_whose_size_their_weights_need(layer, shape, message):
    with pytest.raises(ValueError, match=re.escape(message) + ".*" + re.escape(f"got shape {shape}")):
        layer().build(shape)
    # What a caller of the functional API sees, where the axis is left free in keras.Input.
    if isinstance(layer(), (KernelAttention, pk.ClassToken, pk.PositionEmbedding)):
        with pytest.raises(ValueError, match=re.escape(message)):
            layer()(keras.Input(shape[1:]))


def test_a_free_token_count_stays_allowed_where_no_weight_depends_on_it():
    inputs = keras.Input((None, 8))
    assert tuple(KernelAttention(2, "favor")(inputs).shape) == (None, None, 8)


def _value_and_gradients(function, *arrays):
    """function(*arrays) (a scalar) and its gradient with respect to each array, on the current backend."""
    tensors = [keras.ops.convert_to_tensor(a) for a in arrays]
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            tape.watch(tensors)
            value = function(*tensors)
        return value, tape.gradient(value, tensors)
    import jax

    value, gradients = jax.value_and_grad(function, argnums=tuple(range(len(tensors))))(*tensors)
    return value, list(gradients)


def test_softmax_attend_matches_softmax_then_weights_in_value_and_gradient():
    # Scaling q, normalising the output instead of the weights, and leaving the max shift out of the gradient
    # give the same function.
    rng = np.random.default_rng(0)
    q = (rng.standard_normal((2, 3, 5, 4)) * 4 + 20).astype("float32")  # large logits, where the shift matters
    keys = rng.standard_normal((2, 3, 4, 7)).astype("float32")
    v = rng.standard_normal((2, 3, 7, 4)).astype("float32")
    r = rng.standard_normal((2, 3, 5, 4)).astype("float32")
    ops = keras.ops
    ours = lambda a, b, c: ops.sum(kernel_attention.softmax_attend(a, b, c) * r)  # noqa: E731
    plain = lambda a, b, c: ops.sum(ops.matmul(ops.softmax(ops.matmul(a, b) / 2.0, axis=-1), c) * r)  # noqa: E731
    value, gradients = _value_and_gradients(ours, q, keys, v)
    expected, expected_gradients = _value_and_gradients(plain, q, keys, v)
    np.testing.assert_allclose(float(value), float(expected), rtol=1e-5)
    for got, want in zip(gradients, expected_gradients):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(want), rtol=1e-4, atol=1e-5)
