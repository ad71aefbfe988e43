"""The shared layer-test helper (STYLE rule 4).

In the spirit of keras-hub's `run_layer_test` (keras_hub/src/tests/test_case.py):
one call checks the contract every layer of the package must keep, so each
layer's own tests only add what is specific to it (a brute-force reference,
properties).

Inputs: `input_data` is one array or a tuple of arrays passed positionally,
all with the same leading batch axis (the feature maps take (queries, keys)).
Arguments that are not batched, such as the rotation layers' `positions`, go in
`call_kwargs`; they are passed unchanged to every call, symbolic ones included.
Outputs may be one tensor or a tuple (the feature maps return
(phi(queries), phi(keys))); `expected_output_shape` is then a tuple of shapes.
"""

import os
import tempfile

import numpy as np
import keras
from keras import ops

MIXED_POLICIES = ("mixed_float16", "mixed_bfloat16")


def to_numpy(tensor):
    """float64 numpy copy of a tensor or a variable (read through `.value`)."""
    if isinstance(tensor, keras.Variable):
        tensor = tensor.value
    return np.asarray(ops.convert_to_numpy(tensor), dtype="float64")


def _as_tuple(x):
    return tuple(x) if isinstance(x, (list, tuple)) else (x,)


def _is_shape(x):
    return all(d is None or isinstance(d, int) for d in x)


def _expected_shapes(expected_output_shape):
    """A tuple of shapes, whether one shape or several were given."""
    if _is_shape(expected_output_shape):
        return (tuple(expected_output_shape),)
    return tuple(tuple(shape) for shape in expected_output_shape)


def _assert_shapes(outputs, expected, what):
    outputs = _as_tuple(outputs)
    assert len(outputs) == len(expected), f"{what}: {len(outputs)} outputs, expected {len(expected)}"
    for output, shape in zip(outputs, expected):
        actual = tuple(output.shape)
        # A symbolic batch axis is None; every other axis must match exactly.
        matches = len(actual) == len(shape) and all(a is None or a == e for a, e in zip(actual, shape))
        assert matches, f"{what}: output shape {actual}, expected {shape}"


def _head(outputs):
    """Pool every output over all but its last axis, concatenate, Dense(2).

    For a (batch, tokens, width) attention output this is exactly
    GlobalAveragePooling1D -> Dense(2).
    """
    pooled = []
    for output in _as_tuple(outputs):
        sequence = keras.layers.Reshape((-1, output.shape[-1]))(output)  # (batch, positions, channels)
        pooled.append(keras.layers.GlobalAveragePooling1D()(sequence))
    features = pooled[0] if len(pooled) == 1 else keras.layers.Concatenate()(pooled)
    return keras.layers.Dense(2, name="head")(features)


def run_layer_test(
    layer_cls,
    init_kwargs,
    input_data,
    expected_output_shape,
    expected_num_trainable_weights=None,
    expected_num_non_trainable_weights=None,
    call_kwargs=None,
    run_mixed_precision=True,
    run_training=True,
    tmp_path=None,
    expected_output_dtype=None,
):
    """Check the layer contract of `layer_cls(**init_kwargs)`.

    Args:
        layer_cls: the layer class.
        init_kwargs: constructor arguments.
        input_data: array or tuple of arrays, passed positionally.
        expected_output_shape: shape, or tuple of shapes for tuple outputs.
        expected_num_trainable_weights, expected_num_non_trainable_weights:
            weight counts after the first call (None: not checked).
        call_kwargs: extra call arguments (positions, flags).
        run_mixed_precision: check mixed_float16 and mixed_bfloat16.
        run_training: one compiled `fit` step and a `.keras` round trip.
        tmp_path: folder for the saved model (a temporary one if None).
        expected_output_dtype: dtype of outputs under a mixed policy; None
            means the policy's compute dtype. Layers documented to return
            float32 whatever the policy (feature maps, Toeplitz sums) pass
            "float32".
    """
    inputs = tuple(np.asarray(x) for x in _as_tuple(input_data))
    call_kwargs = dict(call_kwargs or {})
    expected = _expected_shapes(expected_output_shape)

    # === Config round trip: every constructor argument survives it. ===
    layer = layer_cls(**init_kwargs)
    config = layer.get_config()
    for name, value in init_kwargs.items():
        assert name in config, f"get_config() misses the argument {name!r}"
        assert config[name] == value, f"get_config()[{name!r}] = {config[name]!r}, given {value!r}"
    revived = layer_cls.from_config(config)
    assert revived.get_config() == config, "from_config(get_config()) changed the config"

    # === Eager call: shapes, finite values, weight counts. ===
    outputs = layer(*inputs, **call_kwargs)
    _assert_shapes(outputs, expected, "eager call")
    for output in _as_tuple(outputs):
        assert np.all(np.isfinite(ops.convert_to_numpy(output))), "eager call gave non-finite values"
    if expected_num_trainable_weights is not None:
        assert len(layer.trainable_weights) == expected_num_trainable_weights, (
            f"{len(layer.trainable_weights)} trainable weights "
            f"{[w.path for w in layer.trainable_weights]}, expected {expected_num_trainable_weights}"
        )
    if expected_num_non_trainable_weights is not None:
        assert len(layer.non_trainable_weights) == expected_num_non_trainable_weights, (
            f"{len(layer.non_trainable_weights)} non-trainable weights "
            f"{[w.path for w in layer.non_trainable_weights]}, expected {expected_num_non_trainable_weights}"
        )

    # === Symbolic call: unknown batch size, as in a functional model. ===
    symbolic_inputs = [keras.Input(shape=x.shape[1:], dtype=str(x.dtype)) for x in inputs]
    symbolic_layer = layer_cls.from_config(config)
    symbolic_outputs = symbolic_layer(*symbolic_inputs, **call_kwargs)
    _assert_shapes(symbolic_outputs, expected, "symbolic call")
    # Same dtypes as the eager call (feature maps return float32 by design, so
    # this is checked, not assumed), and compute_output_shape agrees with both.
    for eager, symbolic in zip(_as_tuple(outputs), _as_tuple(symbolic_outputs)):
        assert keras.backend.standardize_dtype(symbolic.dtype) == keras.backend.standardize_dtype(eager.dtype), (
            f"symbolic output dtype {symbolic.dtype}, eager {eager.dtype}")
    if type(layer).compute_output_shape is not keras.layers.Layer.compute_output_shape:
        computed = layer.compute_output_shape(*(x.shape for x in inputs))
        shapes = (computed,) if _is_shape(computed) else tuple(computed)
        for shape, eager in zip(shapes, _as_tuple(outputs)):
            assert tuple(shape) == tuple(eager.shape), f"compute_output_shape {tuple(shape)}, eager {tuple(eager.shape)}"
    # With the eager layer's weights, the symbolic graph computes the same values.
    symbolic_layer.set_weights(layer.get_weights())
    graph = keras.Model(symbolic_inputs, list(_as_tuple(symbolic_outputs)))
    for from_graph, eager in zip(_as_tuple(graph(list(inputs))), _as_tuple(outputs)):
        np.testing.assert_allclose(to_numpy(from_graph), to_numpy(eager), rtol=1e-5, atol=1e-5,
                                   err_msg="symbolic graph and eager call differ")

    if run_training:
        # === One compiled fit step of a tiny model around the layer. ===
        model = keras.Model(symbolic_inputs, _head(symbolic_outputs))
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        batch = inputs[0].shape[0]
        targets = np.random.default_rng(0).normal(size=(batch, 2)).astype("float32")
        history = model.fit(list(inputs), targets, batch_size=batch, epochs=1, verbose=0)
        loss = history.history["loss"][0]
        assert np.isfinite(loss), f"fit step gave loss {loss}"
        for weight in model.weights:
            assert np.all(np.isfinite(ops.convert_to_numpy(weight.value))), f"{weight.path} is not finite after fit"

        # === .keras round trip: the reloaded model predicts the same. ===
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(str(tmp_path or folder), "layer_test.keras")
            model.save(path)
            reloaded = keras.saving.load_model(path)
        before = model.predict(list(inputs), verbose=0)
        after = reloaded.predict(list(inputs), verbose=0)
        # Same backend, same weights, same ops: equal up to float32 round-off.
        np.testing.assert_allclose(after, before, rtol=1e-6, atol=1e-6, err_msg="reloaded .keras model differs")

    # === Mixed precision: compute dtype outputs, float32 variables. ===
    if run_mixed_precision:
        for policy in MIXED_POLICIES:
            mixed = layer_cls(**init_kwargs, dtype=policy)
            outputs = mixed(*inputs, **call_kwargs)
            want = expected_output_dtype or keras.DTypePolicy(policy).compute_dtype
            for output in _as_tuple(outputs):
                dtype = keras.backend.standardize_dtype(output.dtype)
                assert dtype == want, f"{policy}: output dtype {dtype}, expected {want}"
                values = ops.convert_to_numpy(ops.cast(output, "float32"))
                assert np.all(np.isfinite(values)), f"{policy}: non-finite outputs"
            for weight in mixed.weights:
                if keras.backend.is_float_dtype(weight.dtype):
                    assert keras.backend.standardize_dtype(weight.dtype) == "float32", (
                        f"{policy}: variable {weight.path} is {weight.dtype}, expected float32"
                    )
