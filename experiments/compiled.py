"""A model's inference call compiled once, shared by evaluation, FLOP counting and the cost profiles."""

import keras

from experiments.cli import BACKENDS
from performer_keras.options import check_choice


def compiled_forward(model, jit_compile=False):
    """(function, variables): `function(*variables, images)` is `model(images, training=False)`, compiled once.

    TensorFlow: a `tf.function` (with XLA if `jit_compile`) and no variables
    (it reads the model's own).
    JAX: a `jax.jit` of the stateless call over the (trainable,
    non-trainable) variable values, which are passed in rather than closed
    over so XLA does not fold them into the program as constants. Callers
    run it (`compiled_predict`) or lower it to read the compiler's cost
    (`flops.count_flops`).
    """
    backend = check_choice("backend", keras.backend.backend(), BACKENDS)
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(lambda images: model(images, training=False), autograph=False, jit_compile=jit_compile), ()
    import jax

    def forward(trainable, non_trainable, images):
        return model.stateless_call(trainable, non_trainable, images, training=False)[0]

    variables = ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables])
    return jax.jit(forward), variables


def compiled_predict(model, jit_compile=False):
    """images -> model(images, training=False), compiled once (`compiled_forward`)."""
    function, variables = compiled_forward(model, jit_compile)
    return lambda images: function(*variables, images)
