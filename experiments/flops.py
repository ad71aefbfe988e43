"""Floating-point operations counted from the compiled graph, not guessed.

A FLOP here is one floating-point multiply or add, so a matmul of an (a, b) by
a (b, c) matrix costs 2abc; both counters below use that convention.

* TensorFlow backend: the model call is traced into a `tf.function` with a
  concrete input signature, its variables are frozen into constants (so every
  tensor shape is static and function calls are inlined), and the graph is
  counted by `tf.compat.v1.profiler` with the `float_operation` option. The
  profiler counts MatMul and BatchMatMul but not Einsum; our layers use
  `ops.matmul`, so nothing escapes it.
* JAX backend: the stateless model call is lowered and compiled by XLA, whose
  `cost_analysis()` reports the FLOPs of the optimised program.

The two counters agree on matmuls and differ by a few percent on elementwise
work (XLA counts transcendentals and fused ops its own way). Both are checked
against `analytic_attention_flops` in `tests/test_evaluation.py`. TensorFlow is
used here on purpose: this is profiling code, not a layer.
"""

import keras

from experiments.compiled import BACKENDS, compiled_forward
from performer_keras.options import check_choice
from performer_keras.registry import KERNEL_TABLE, KERNELS

# A SavedModel exported from the JAX backend is one XlaCallModule op holding
# StableHLO; the profiler cannot look inside and would report 0 FLOPs.
_OPAQUE_OPS = ("XlaCallModule",)


def count_flops(model, batch_size=1, training=False):
    """FLOPs of one batch through `model`, counted from the compiled graph.

    Args:
        model: a Keras model with a fixed input shape (`model.inputs`).
        batch_size: the batch the graph is traced for.
        training: False counts the forward pass at inference; True counts one
            training step's forward and backward pass under sparse categorical
            cross-entropy (see `count_training_flops`).

    Returns: int, FLOPs per batch (divide by `batch_size` for per example).
    """
    if training:
        return count_training_flops(model, "sparse_categorical_crossentropy", batch_size)
    backend = check_choice("backend", keras.backend.backend(), BACKENDS)
    spec = _input_spec(model, batch_size)
    function, variables = compiled_forward(model)
    if backend == "tensorflow":
        import tensorflow as tf

        return _profile_tf(function.get_concrete_function(tf.TensorSpec(*spec)))

    import jax

    return _cost_jax(function, model, jax.ShapeDtypeStruct(*spec))


def count_training_flops(model, loss="sparse_categorical_crossentropy", batch_size=1):
    """FLOPs of one training step's forward and backward pass, from the graph.

    The loss (a `keras.losses.get` identifier or callable, averaged over the
    batch) is differentiated with respect to every trainable variable: a
    `tf.GradientTape` inside a `tf.function` on TensorFlow, `jax.grad` on JAX.
    Labels are integer class indices of shape (batch,). The optimizer update
    is not counted: it is O(parameters) elementwise work, negligible next to
    the O(parameters x tokens) of the passes.

    Returns: int, FLOPs per batch.
    """
    backend = check_choice("backend", keras.backend.backend(), BACKENDS)
    loss_fn = keras.losses.get(loss)
    shape, dtype = _input_spec(model, batch_size)
    if backend == "tensorflow":
        import tensorflow as tf

        @tf.function(autograph=False)
        def step(images, labels):
            with tf.GradientTape() as tape:
                value = tf.reduce_mean(loss_fn(labels, model(images, training=True)))
            return value, tape.gradient(value, model.trainable_variables)

        return _profile_tf(
            step.get_concrete_function(tf.TensorSpec(shape, dtype), tf.TensorSpec(shape[:1], tf.int32))
        )

    import jax

    def loss_value(trainable, non_trainable, images, labels):
        outputs, _ = model.stateless_call(trainable, non_trainable, images, training=True)
        return keras.ops.mean(loss_fn(labels, outputs))

    return _cost_jax(
        jax.jit(jax.grad(loss_value)),
        model,
        jax.ShapeDtypeStruct(shape, dtype),
        jax.ShapeDtypeStruct(shape[:1], "int32"),
    )


def count_saved_model_flops(path, image_shape, batch_size=1, endpoint="serve"):
    """FLOPs of one batch through a SavedModel's `endpoint`, from its TF graph.

    The endpoint is called inside a fresh `tf.function` traced for a concrete
    (batch_size, *image_shape) input of the endpoint's own dtype; freezing
    inlines the restored function, whose ops the profiler would otherwise not
    see (it counts 0 through a function call). Works on any Keras backend.

    Returns: int, FLOPs per batch; None for a SavedModel exported from the
    JAX backend, whose graph is opaque StableHLO (see `_OPAQUE_OPS`).
    """
    import tensorflow as tf

    loaded = tf.saved_model.load(str(path))
    dtype = getattr(loaded, endpoint).concrete_functions[0].structured_input_signature[0][0].dtype
    # Call through `loaded`, which keeps the restored variables alive while tracing.
    function = tf.function(lambda images: getattr(loaded, endpoint)(images), autograph=False)
    return _profile_tf(function.get_concrete_function(tf.TensorSpec((batch_size, *image_shape), dtype)))


def analytic_attention_flops(tokens, width, heads, kernel, num_features=64):
    """FLOPs of the matmuls of one `KernelAttention` layer on one example.

    With N tokens, width D, H heads of size d = D / H and m features, and 2
    FLOPs per multiply-add:

        projections (q, k, v, output Dense)        8 N D^2
        softmax    q k^T and weights v             4 N^2 D
        random features (favor, relu; `Kernel.random`):
                   phi(q), phi(k): x W^T           4 N m D
                   phi(k)^T v and phi(q) (kv)      4 N m D
                   normaliser phi(q) sum_j phi(k_j) 2 N m H
        other feature maps (exp): m = d, no projection: 4 N d D + 2 N d H
        linformer  E k and F v (k = num_features rows)  4 k N D
                   q (Ek)^T and weights (Fv)        4 N k D

    Biases, scaling, softmax and the feature maps' elementwise work are left
    out: they are O(N D) and O(N^2 H) (O(N m H) for linear kernels), so the
    graph counts come out 4-20% above this (the most for softmax at large N
    and head size 8, where the N^2 H softmax work weighs against N^2 H d
    matmul work). Positions beyond `absolute` add rotations
    (elementwise) or, for kerple, FFTs, which this count does not cover.

    Args:
        tokens: N. width: D. heads: H (D must divide by it).
        kernel: a name of `registry.KERNEL_TABLE`.
        num_features: m for favor and relu; linformer_dim for linformer.

    Returns: int.
    """
    spec = KERNEL_TABLE[check_choice("kernel", kernel, KERNELS)]
    if width % heads:
        raise ValueError(f"width {width} must be divisible by heads={heads}")
    n, d_model = tokens, width
    projections = 8 * n * d_model**2
    if spec.linear:
        # Per head: phi(k)^T v and phi(q) (.) are 2 N m d each, the normaliser 2 N m;
        # a random map also projects q and k onto m directions (2 x 2 N d m).
        m = num_features if spec.random else d_model // heads
        return projections + (8 if spec.random else 4) * n * m * d_model + 2 * n * m * heads
    if kernel == "linformer":
        return projections + 8 * n * num_features * d_model
    return projections + 4 * n * n * d_model


def analytic_model_flops(image_shape, num_classes, attention, patch_size, width, depth, heads, mlp_dim,
                         num_features=64, **_):
    """Forward FLOPs of the ViT's matmuls on one image (2 per multiply-add).

        patch embedding   2 P (p^2 C) D        P patches of p x p x C pixels
        per block         `analytic_attention_flops`(N, D, H, kernel, m) + 4 N D mlp
        head              2 D classes

    with N = P + 1 tokens. Like `analytic_attention_flops` it leaves out
    normalisation, biases, softmax and the rotations and FFTs of positions,
    so the graph count comes out somewhat above it (far above for kerple's
    FFTs on JAX; TensorFlow's profiler counts no FLOPs for FFT ops at all).
    """
    rows, cols, channels = image_shape
    patches = (rows // patch_size) * (cols // patch_size)
    tokens = patches + 1
    block = analytic_attention_flops(tokens, width, heads, attention, num_features) + 4 * tokens * width * mlp_dim
    return 2 * patches * patch_size**2 * channels * width + depth * block + 2 * width * num_classes


def _input_spec(model, batch_size):
    """(shape, dtype) of one input batch of a single-input model."""
    if not getattr(model, "inputs", None) or len(model.inputs) != 1:
        raise ValueError(f"count FLOPs needs a model with one fixed input, got {model.name!r}")
    inputs = model.inputs[0]
    shape = (batch_size, *inputs.shape[1:])
    if None in shape[1:]:
        raise ValueError(f"count FLOPs needs a fixed input shape, got {tuple(inputs.shape)}")
    return shape, inputs.dtype


def _profile_tf(concrete_function):
    """Total float ops of a concrete function's graph, variables frozen first.

    None when the graph holds an op the profiler cannot see into.
    """
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2
    from tensorflow.python.util import deprecation

    frozen = convert_variables_to_constants_v2(concrete_function)
    if any(op.type in _OPAQUE_OPS for op in frozen.graph.get_operations()):
        return None
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"  # the count is returned, not printed
    # The profiler calls a TF1 function of TensorFlow's own that logs a three-line deprecation
    # warning, which train.py and evaluate.py printed in the middle of their output.
    with deprecation.silence():
        return int(tf.compat.v1.profiler.profile(frozen.graph, options=options).total_float_ops)


def _cost_jax(jitted, model, *inputs):
    """FLOPs XLA reports for `jitted(trainable, non_trainable, *inputs)`."""
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    cost = jitted.lower(trainable, non_trainable, *inputs).compile().cost_analysis()
    # Older jax versions return one dict per device.
    if isinstance(cost, (list, tuple)):
        cost = cost[0]
    return int(cost["flops"])
