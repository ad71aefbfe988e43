"""Position encodings: layer contract, relative properties, bad arguments, save/load."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import scipy.linalg
import keras

import performer_keras
from performer_keras import (
    CirculantString,
    ClassToken,
    ExpFeatures,
    FavorFeatures,
    KernelAttention,
    PositionEmbedding,
    ReluFeatures,
    RotaryEmbedding2D,
    ToeplitzBias2D,
)
from performer_keras.grid import grid_positions
from performer_keras.random_features import draw_projection

from layer_test_case import run_layer_test, to_numpy

GRID = (7, 7)
PATCHES = GRID[0] * GRID[1]
HEADS, HEAD_DIM = 2, 8
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))




def randomize(variable, scale, rng):
    variable.assign(rng.normal(size=variable.shape).astype("float32") * scale)


def rotation_layer(kind, dim=HEAD_DIM, seed=0):
    """A built rotation layer with non-trivial parameters: rope, rope_mixed or string."""
    rng = np.random.default_rng(seed)
    layer = CirculantString() if kind == "string" else RotaryEmbedding2D(mixed=kind == "rope_mixed")
    layer.build((None, HEADS, PATCHES, dim), (PATCHES, 2))
    if kind == "rope_mixed":
        randomize(layer.frequencies, 0.5, rng)
    if kind == "string":
        randomize(layer.row_generator, 0.3, rng)
        randomize(layer.col_generator, 0.3, rng)
    return layer


def rotate(layer, x, positions):
    return to_numpy(layer(x.astype("float32"), positions=np.asarray(positions, "float32")))


# === The shared layer contract. ===

PATCH_VECTORS = np.random.default_rng(0).normal(size=(2, HEADS, PATCHES, HEAD_DIM)).astype("float32")


@pytest.mark.parametrize(
    "layer_cls, kwargs, num_trainable",
    [
        pytest.param(RotaryEmbedding2D, dict(mixed=False, base=50.0), 0, id="rope"),
        pytest.param(RotaryEmbedding2D, dict(mixed=True), 1, id="rope_mixed"),  # frequencies
        pytest.param(CirculantString, dict(initializer_stddev=0.3), 2, id="string"),  # row, col generators
    ],
)
def test_rotation_layer_contract(layer_cls, kwargs, num_trainable, tmp_path):
    run_layer_test(
        layer_cls,
        kwargs,
        PATCH_VECTORS,
        expected_output_shape=PATCH_VECTORS.shape,
        expected_num_trainable_weights=num_trainable,
        expected_num_non_trainable_weights=0,
        call_kwargs=dict(positions=grid_positions(GRID)),
        tmp_path=tmp_path,
    )


def test_toeplitz_layer_contract(tmp_path):
    values = np.random.default_rng(1).normal(size=(2, HEADS, 1 + PATCHES, 5)).astype("float32")
    run_layer_test(
        ToeplitzBias2D,
        dict(grid_size=GRID, num_heads=HEADS, num_prefix_tokens=1),
        values,
        expected_output_shape=values.shape,
        expected_num_trainable_weights=1,  # the bias table
        expected_num_non_trainable_weights=0,
        tmp_path=tmp_path,
        expected_output_dtype="float32",  # documented: the sums are float32
    )


# === Relative positions. ===

ROTATIONS = ["rope", "rope_mixed", "string"]


def patch_logits(layer, q, k, positions):
    """(batch, heads, P, P) q_i^T k_j after rotating both by their positions."""
    return np.einsum("bhid,bhjd->bhij", rotate(layer, q, positions), rotate(layer, k, positions))


@pytest.mark.parametrize("kind", ROTATIONS)
def test_logits_depend_only_on_relative_position(kind):
    rng = np.random.default_rng(1)
    layer = rotation_layer(kind)
    q, k = rng.normal(size=(2, 2, HEADS, PATCHES, HEAD_DIM))  # each (batch, heads, P, d)
    grid = grid_positions(GRID)
    logits = patch_logits(layer, q, k, grid)
    # A common shift, fractional so nothing lines up with a period by accident.
    shifted = patch_logits(layer, q, k, grid + np.array([2.5, -1.25]))
    np.testing.assert_allclose(shifted, logits, rtol=1e-4, atol=1e-4)
    # The check has teeth: the rotation changes the logits, and so does a
    # change of the relative positions (the grid stretched twofold).
    unrotated = np.einsum("bhid,bhjd->bhij", q, k)
    assert np.max(np.abs(logits - unrotated)) > 0.1
    assert np.max(np.abs(patch_logits(layer, q, k, 2 * grid) - logits)) > 0.1


@pytest.mark.parametrize("kind", ROTATIONS)
def test_rotations_preserve_norms(kind):
    layer = rotation_layer(kind)
    x = np.random.default_rng(2).normal(size=(2, HEADS, PATCHES, HEAD_DIM))
    for positions in (grid_positions(GRID), 37.5 * grid_positions(GRID)):  # far positions too
        rotated = rotate(layer, x, positions)
        assert np.max(np.abs(rotated - x)) > 0.1  # a real rotation
        np.testing.assert_allclose(np.linalg.norm(rotated, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)


def rotation_matrices(layer, positions, dim=HEAD_DIM):
    """(heads, tokens, dim, dim) R(p): the layer applied to the basis vectors e_b gives R's columns."""
    basis = np.broadcast_to(np.eye(dim)[:, None, None, :], (dim, HEADS, len(positions), dim))
    columns = rotate(layer, basis, positions)  # (b, heads, tokens, dim): R e_b
    return np.transpose(columns, (1, 2, 3, 0))


@pytest.mark.parametrize("kind", ROTATIONS)
def test_rotations_compose_relatively(kind):
    layer = rotation_layer(kind)
    rng = np.random.default_rng(3)
    p_i, p_j = rng.uniform(-6, 6, size=(2, 10, 2))  # 10 pairs of (row, col) positions
    r_i, r_j = rotation_matrices(layer, p_i), rotation_matrices(layer, p_j)
    r_diff = rotation_matrices(layer, p_j - p_i)
    # R(p_i)^T R(p_j) = R(p_j - p_i)
    np.testing.assert_allclose(np.swapaxes(r_i, -1, -2) @ r_j, r_diff, atol=1e-5)
    np.testing.assert_allclose(np.swapaxes(r_i, -1, -2) @ r_i, np.broadcast_to(np.eye(HEAD_DIM), r_i.shape), atol=1e-5)


def test_string_is_the_matrix_exponential_of_circulant_generators():
    layer = rotation_layer("string")
    positions = np.random.default_rng(4).uniform(-6, 6, size=(5, 2))
    rotations = rotation_matrices(layer, positions)
    d = HEAD_DIM
    for h in range(HEADS):
        generators = []
        for c in (to_numpy(layer.row_generator)[h], to_numpy(layer.col_generator)[h]):
            circulant = np.array([[c[(i - j) % d] for j in range(d)] for i in range(d)])  # C[i, j] = c[i - j]
            generators.append(circulant - circulant.T)  # L = C - C^T
        for t, (row, col) in enumerate(positions):
            expected = scipy.linalg.expm(row * generators[0] + col * generators[1])
            np.testing.assert_allclose(rotations[h, t], expected, atol=1e-5)


def test_kerple_bias_is_toeplitz():
    # A non-square grid, so that a swapped row and column offset cannot pass.
    grid, prefix = (3, 5), 1
    layer = ToeplitzBias2D(grid, num_heads=HEADS, num_prefix_tokens=prefix)
    layer.build()
    table = np.random.default_rng(5).normal(size=layer.bias.shape)
    layer.bias.assign(table.astype("float32"))
    bias = to_numpy(layer.bias_matrix())  # (heads, N, N)
    positions = grid_positions(grid).astype(int)
    by_offset = {}
    for i, p_i in enumerate(positions):
        for j, p_j in enumerate(positions):
            dr, dc = p_j - p_i
            value = bias[:, prefix + i, prefix + j]
            np.testing.assert_allclose(value, table[:, dr + grid[0] - 1, dc + grid[1] - 1], rtol=1e-6)
            by_offset.setdefault((dr, dc), []).append(value)
    # Every pair with the same offset p_j - p_i has the same bias, and the
    # (2H-1) x (2W-1) offsets all occur.
    assert len(by_offset) == (2 * grid[0] - 1) * (2 * grid[1] - 1)
    for values in by_offset.values():
        np.testing.assert_allclose(values, np.broadcast_to(values[0], np.shape(values)))
    # CLS: bias 0 with every token, both ways.
    assert np.all(bias[:, :prefix, :] == 0) and np.all(bias[:, :, :prefix] == 0)
    # The linear kernels' multiplicative weights: exp of the same matrix, so factor 1 for CLS.
    np.testing.assert_allclose(to_numpy(layer.weight_matrix()), np.exp(bias), rtol=1e-6)


# === Bad arguments. ===


@pytest.mark.parametrize(
    "kwargs, match",
    [
        pytest.param(dict(kernel_name="gaussian"), r"Unknown kernel 'gaussian'.*'softmax'.*'linformer'", id="kernel"),
        pytest.param(dict(position="sinusoidal"), r"Unknown position 'sinusoidal'.*'absolute'.*'kerple'", id="position"),
        pytest.param(dict(kernel_name="favor", num_features=0), r"num_features must be an integer >= 1, got 0", id="features-0"),
        pytest.param(dict(kernel_name="favor", num_features=-3), r"num_features must be an integer >= 1, got -3", id="features-neg"),
        pytest.param(dict(kernel_name="softmax", rotation_order="after"), r"rotation_order='after'.*'softmax'.*'before'", id="after-softmax"),
        pytest.param(dict(kernel_name="favor", rotation_order="sideways"), r"Unknown rotation_order 'sideways'.*'before', 'after'", id="order"),
        pytest.param(dict(position="rope"), r"position 'rope' needs grid_size", id="rope-no-grid"),
        pytest.param(dict(normalize_qk=True, qk_norm=0.0), r"qk_norm must be > 0.0, got 0.0", id="qk-norm-0"),
        pytest.param(dict(position="kerple"), r"position 'kerple' needs grid_size", id="kerple-no-grid"),
        # bool() took these: the string "false" is truthy and would switch the option on.
        pytest.param(dict(normalize_qk="false"), r"normalize_qk must be True or False or None, got 'false'", id="normalize-str"),
        pytest.param(dict(kernel_name="favor", orthogonal="no"), r"orthogonal must be True or False, got 'no'", id="orthogonal-str"),
        pytest.param(dict(kernel_name="relu", deterministic=0), r"deterministic must be True or False, got 0", id="deterministic-int"),
        pytest.param(dict(rope_mixed="yes"), r"rope_mixed must be True or False, got 'yes'", id="rope-mixed-str"),
        pytest.param(dict(learn_qk_norm=None), r"learn_qk_norm must be True or False, got None", id="learn-norm-none"),
        pytest.param(dict(fused=1), r"fused must be True or False, got 1", id="fused-int"),
        # "unhashable type: 'list'" from the registry's dict.
        pytest.param(dict(kernel_name=["favor"]), r"Unknown kernel \['favor'\]; expected one of", id="kernel-list"),
        # Accepted, then refused by Keras only when built; -1 and 2**32 built on TensorFlow, and a model saved
        # with them failed to load on JAX ("Python integer -1 out of bounds for uint32").
        pytest.param(dict(kernel_name="favor", seed=2.5), r"seed must be None or an integer from 0 to 4294967295, got 2.5",
                     id="seed-float"),
        pytest.param(dict(kernel_name="favor", seed=-1), r"seed must be None or an integer from 0 to 4294967295, got -1",
                     id="seed-negative"),
        pytest.param(dict(kernel_name="favor", seed=2**32), r"seed must be None .* got 4294967296", id="seed-too-large"),
        pytest.param(
            dict(kernel_name="linformer", position="kerple", grid_size=GRID),
            r"kernel 'linformer'.*position one of \('absolute', 'rope', 'string'\)",
            id="linformer-kerple",
        ),
    ],
)
def test_bad_arguments_raise_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        KernelAttention(num_heads=2, **kwargs)


# The fewest arguments that make each layer; a layer added to the package without a row here fails below.
LAYER_ARGUMENTS = {
    "CirculantString": {}, "ClassToken": {}, "ExpFeatures": {}, "FavorFeatures": {},
    "KernelAttention": dict(num_heads=2), "PositionEmbedding": {}, "RandomFeatures": {}, "ReluFeatures": {}, "RotaryEmbedding2D": {},
    "Standardize": dict(mean=[0.0], std=[255.0]), "StepDropout": dict(rate=0.1),
    "ToeplitzBias2D": dict(grid_size=GRID, num_heads=HEADS),
}


@pytest.mark.parametrize("name", sorted(name for name, cls in performer_keras.custom_objects().items()
                                        if issubclass(cls, keras.layers.Layer)))
def test_every_layer_refuses_a_dtype_policy_that_is_not_floating_point(name):
    # Before, "int32" failed in the backend (FAVOR+'s random projections: "Need minval < maxval") or ran:
    # Standardize cut its output to integers, ToeplitzBias2D kept integer weights.
    layer_cls = performer_keras.custom_objects()[name]
    for policy in ("int32", "bool", "uint8"):
        with pytest.raises(ValueError, match=rf"{name} computes in floating point; its dtype policy '{policy}'"):
            layer_cls(**LAYER_ARGUMENTS[name], dtype=policy)
    for policy in ("float32", "mixed_bfloat16", "float64"):
        assert layer_cls(**LAYER_ARGUMENTS[name], dtype=policy).dtype_policy.name == policy


@pytest.mark.parametrize(
    "build, match",
    [
        pytest.param(lambda: RotaryEmbedding2D(base=0.0), r"base must be > 0.0", id="rope-base-0"),
        pytest.param(lambda: RotaryEmbedding2D(base=float("nan")), r"base must be a finite number", id="rope-base-nan"),
        pytest.param(lambda: RotaryEmbedding2D(mixed="false"), r"mixed must be True or False, got 'false'", id="rope-mixed-str"),
        pytest.param(lambda: CirculantString(initializer_stddev=-0.5), r"initializer_stddev must be >= 0.0", id="string-stddev"),
        pytest.param(lambda: PositionEmbedding(initializer_stddev="0.02"), r"initializer_stddev must be a finite number",
                     id="embedding-stddev-str"),
        pytest.param(lambda: ToeplitzBias2D(grid_size=(0, 4), num_heads=2), r"grid_size must be", id="grid-0"),
        pytest.param(lambda: ToeplitzBias2D(grid_size=GRID, num_heads=0), r"num_heads must be", id="heads-0"),
        pytest.param(lambda: ToeplitzBias2D(grid_size=GRID, num_heads=2, num_prefix_tokens=-1), r"num_prefix_tokens",
                     id="toeplitz-prefix-negative"),
        pytest.param(lambda: KernelAttention(num_heads=2, num_prefix_tokens=-1), r"num_prefix_tokens",
                     id="attention-prefix-negative"),
        pytest.param(lambda: KernelAttention(num_heads=2, position="rope", grid_size=(0, 4)), r"grid_size must be",
                     id="attention-grid-0"),
        # int() took these: 4.5 rows became 4, 2.5 heads 2.
        pytest.param(lambda: KernelAttention(num_heads=2, position="rope", grid_size=(4.5, 4)),
                     r"grid_size must be \(rows, cols\), two integers >= 1, got \(4.5, 4\)", id="attention-grid-float"),
        pytest.param(lambda: ToeplitzBias2D(grid_size=GRID, num_heads=2.5), r"num_heads must be an integer >= 1, got 2.5",
                     id="toeplitz-heads-float"),
        pytest.param(lambda: KernelAttention(num_heads=2, num_prefix_tokens=1.5), r"num_prefix_tokens", id="prefix-float"),
        # Not a pair: a bare int ("'int' object is not iterable") or three sides.
        pytest.param(lambda: KernelAttention(num_heads=2, position="rope", grid_size=4), r"grid_size must be \(rows, cols\)",
                     id="attention-grid-int"),
        pytest.param(lambda: ToeplitzBias2D(grid_size=(2, 3, 4), num_heads=2), r"grid_size must be \(rows, cols\)",
                     id="toeplitz-grid-3d"),
    ],
)
def test_position_layers_refuse_arguments_that_would_give_nan_or_empty_tables(build, match):
    with pytest.raises(ValueError, match=match):
        build()


@pytest.mark.parametrize(
    "layer, values_shape, positions_shape, match",
    [
        # Each of these failed in a backend's reshape or matmul (InvalidArgumentError, deep in the traceback), or,
        # for rope on a rank-3 input, took the batch axis for the heads.
        pytest.param("rope", (2, HEADS, PATCHES - 1, HEAD_DIM), (PATCHES, 2),
                     rf"RotaryEmbedding2D positions: the number of positions, one per input token, must be {PATCHES - 1}, "
                     rf"got {PATCHES}", id="rope-positions-tokens"),
        pytest.param("rope", (2, HEADS, PATCHES, HEAD_DIM), (PATCHES, 3),
                     r"RotaryEmbedding2D positions: the last axis, \(row, column\), must be 2, got 3", id="rope-positions-3"),
        pytest.param("rope", (2, HEADS, PATCHES, HEAD_DIM), (PATCHES,),
                     r"RotaryEmbedding2D positions takes \(tokens, 2\) inputs", id="rope-positions-rank"),
        pytest.param("rope", (HEADS, PATCHES, HEAD_DIM), (PATCHES, 2),
                     r"RotaryEmbedding2D takes \(batch, heads, tokens, dim\) inputs", id="rope-rank-3"),
        pytest.param("string", (2, HEADS, PATCHES + 1, HEAD_DIM), (PATCHES, 2),
                     rf"CirculantString positions: the number of positions, one per input token, must be {PATCHES + 1}",
                     id="string-positions-tokens"),
        # Accepted before: the third column was never read.
        pytest.param("string", (2, HEADS, PATCHES, HEAD_DIM), (PATCHES, 3),
                     r"CirculantString positions: the last axis, \(row, column\), must be 2, got 3", id="string-positions-3"),
        pytest.param("kerple", (2, HEADS + 1, PATCHES + 1, 3), None,
                     rf"ToeplitzBias2D: the heads axis \(num_heads\) must be {HEADS}, got {HEADS + 1}", id="kerple-heads"),
        pytest.param("kerple", (2, HEADS, PATCHES, 3), None,
                     rf"ToeplitzBias2D: the tokens axis \(1 prefix \+ the 7 x 7 grid\) must be {PATCHES + 1}, got {PATCHES}",
                     id="kerple-tokens"),
        pytest.param("kerple", (HEADS, PATCHES + 1, 3), None,
                     r"ToeplitzBias2D takes \(batch, heads, tokens, channels\) inputs", id="kerple-rank-3"),
    ],
)
def test_position_layers_name_the_axis_when_inputs_and_positions_disagree(layer, values_shape, positions_shape, match):
    values = np.zeros(values_shape, "float32")
    with pytest.raises(ValueError, match=match):
        if layer == "kerple":
            ToeplitzBias2D(GRID, HEADS)(values)
        else:
            (RotaryEmbedding2D() if layer == "rope" else CirculantString())(values, np.zeros(positions_shape, "float32"))
    if layer == "kerple":  # the DFT and dense reference paths are checked the same way
        for path in ("dft", "dense"):
            with pytest.raises(ValueError, match=match):
                ToeplitzBias2D(GRID, HEADS)(values, path=path)


@pytest.mark.parametrize("position", ["absolute", "rope", "kerple"])
def test_attention_names_the_tokens_axis_when_it_is_not_the_grid_plus_prefix(position):
    # The same words as ToeplitzBias2D's, from one helper, whichever position the layer has.
    layer = KernelAttention(num_heads=HEADS, position=position, grid_size=GRID, num_prefix_tokens=1)
    match = rf"KernelAttention: the tokens axis \(1 prefix \+ the 7 x 7 grid\) must be {PATCHES + 1}, got {PATCHES}"
    with pytest.raises(ValueError, match=match):
        layer.build((2, PATCHES, 8 * HEADS))
    KernelAttention(num_heads=HEADS, position=position, grid_size=GRID, num_prefix_tokens=1).build((2, None, 8 * HEADS))


@pytest.mark.parametrize("make, first, later, axis", [
    (lambda: KernelAttention(HEADS, position="rope", grid_size=(2, 2)), (1, 5, 8), (1, 6, 8), -2),
    (lambda: KernelAttention(HEADS, kernel_name="favor", position="kerple", grid_size=(2, 2)), (1, 5, 8), (1, 6, 8), -2),
    (lambda: KernelAttention(HEADS, kernel_name="linformer"), (1, 5, 8), (1, 6, 8), -2),
    (lambda: KernelAttention(HEADS), (1, 5, 8), (1, 5, 16), -1),
    (lambda: PositionEmbedding(), (1, 5, 8), (1, 6, 8), 1),
    (lambda: ClassToken(), (1, 5, 8), (1, 5, 16), -1),
])
def test_a_built_layer_names_the_axis_of_a_later_input_that_its_weights_do_not_fit(make, first, later, axis):
    # Each failed in a backend's matmul, add or broadcast ("Incompatible shapes"), or for rope in the rotation's
    # positions check, which named the positions instead of the input.
    layer = make()
    layer(np.zeros(first, "float32"))
    with pytest.raises(ValueError, match=re.escape(f"expected axis {axis} of input shape to have value {first[axis]}, "
                                                   f"but received input with shape {tuple(later)}")):
        layer(np.zeros(later, "float32"))


def test_attention_without_a_grid_takes_any_number_of_tokens_once_built():
    layer = KernelAttention(HEADS, kernel_name="favor")
    layer(np.zeros((1, 5, 8), "float32"))
    assert layer(np.zeros((1, 9, 8), "float32")).shape == (1, 9, 8)


def test_numpy_integers_pass_where_python_integers_do():
    # Sizes computed from array shapes are NumPy integers; the layers take them and store Python ints.
    layer = KernelAttention(num_heads=np.int64(2), position="kerple", grid_size=np.array([2, 3]), num_prefix_tokens=np.int32(1))
    assert (layer.num_heads, layer.grid_size, layer.num_prefix_tokens) == (2, (2, 3), 1)
    assert all(type(value) is int for value in (layer.num_heads, *layer.grid_size, layer.num_prefix_tokens))
    assert ToeplitzBias2D(grid_size=(np.int64(2), 3), num_heads=np.int64(2)).grid_size == (2, 3)
    # and NumPy's booleans (a comparison of arrays gives them), stored as Python's
    layer = KernelAttention(num_heads=2, kernel_name="favor", orthogonal=np.bool_(False), normalize_qk=np.bool_(True))
    assert layer.orthogonal is False and layer.normalize_qk is True and layer.normalizes


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param(dict(kernel_name="softmax"), id="head-dim-6"),  # width 12, 2 heads: head_dim 6
        pytest.param(dict(kernel_name="relu", num_features=6, rotation_order="after"), id="features-6"),
    ],
)
def test_rope_dimension_not_divisible_by_4_raises(kwargs):
    # Only known once the input width is: raised when the layer is built.
    layer = KernelAttention(num_heads=2, position="rope", grid_size=GRID, **kwargs)
    with pytest.raises(ValueError, match=r"divisible by 4; got 6"):
        layer(np.zeros((1, 1 + PATCHES, 12), "float32"))


# === Save and reload in a fresh process. ===

COMBINATIONS = [
    (kernel, position)
    for kernel in ("softmax", "favor", "relu", "exp", "linformer")
    for position in ("absolute", "rope", "string", "kerple")
    if not (kernel == "linformer" and position == "kerple")
]

RELOAD_SCRIPT = """
import sys
import numpy as np
import keras
import performer_keras

model = keras.saving.load_model(sys.argv[1], custom_objects=performer_keras.custom_objects())
x = np.load(sys.argv[2])
outputs = model.predict(x, verbose=0)
np.savez(sys.argv[3], *outputs)
"""


def randomize_all(layer, rng):
    """Give every weight, trainable or not, a value a fresh build would not reproduce."""
    for weight in layer.weights:
        if weight.path.endswith("projection") and "features" in weight.path:
            # Another valid projection (a fresh build with the same seed would redraw the old one).
            weight.assign(draw_projection(*weight.shape, True, int(rng.integers(1 << 30))))
        elif keras.backend.is_float_dtype(weight.dtype):
            randomize(weight, 0.3, rng)


def test_saved_model_predicts_identically_in_a_fresh_process(tmp_path):
    rng = np.random.default_rng(6)
    width = HEADS * HEAD_DIM
    inputs = keras.Input((1 + PATCHES, width))
    outputs = []
    for kernel, position in COMBINATIONS:
        layer = KernelAttention(
            HEADS, kernel, position, grid_size=GRID, num_features=16, rope_mixed=True, seed=0,
            name=f"{kernel}_{position}",
        )
        outputs.append(layer(inputs))
    # The building blocks on their own, on a (batch, heads, N, head_dim) view of the input.
    heads = keras.layers.Permute((2, 1, 3))(keras.layers.Reshape((1 + PATCHES, HEADS, HEAD_DIM))(inputs))
    patches = heads[:, :, 1:]
    positions = grid_positions(GRID)
    outputs += list(FavorFeatures(16, name="favor_features")(heads, heads))
    outputs += list(ReluFeatures(16, name="relu_features")(heads, heads))
    outputs += list(ExpFeatures(name="exp_features")(heads, heads))
    outputs.append(RotaryEmbedding2D(mixed=True, name="rope_mixed")(patches, positions=positions))
    outputs.append(CirculantString(name="string")(patches, positions=positions))
    outputs.append(ToeplitzBias2D(GRID, HEADS, name="kerple")(heads))
    model = keras.Model(inputs, outputs)
    for layer in model.layers:
        randomize_all(layer, rng)

    x = rng.normal(size=(2, 1 + PATCHES, width)).astype("float32")
    expected = model.predict(x, verbose=0)
    model_path, x_path, out_path = tmp_path / "all_layers.keras", tmp_path / "x.npy", tmp_path / "out.npz"
    model.save(model_path)
    np.save(x_path, x)

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO_ROOT, os.environ.get("PYTHONPATH", "")]))
    # The same backend as this process, whichever was chosen.
    env["KERAS_BACKEND"] = keras.backend.backend()
    result = subprocess.run(
        [sys.executable, "-c", RELOAD_SCRIPT, str(model_path), str(x_path), str(out_path)],
        env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    with np.load(out_path) as reloaded:
        actual = [reloaded[f"arr_{i}"] for i in range(len(reloaded.files))]
    assert len(actual) == len(expected)
    for (name, want), got in zip(zip(model.output_names, expected), actual):
        # Same backend, same weights, same ops: equal up to float32 round-off.
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=name)
