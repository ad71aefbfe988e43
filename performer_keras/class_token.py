"""Learned CLS token prepended to the patch sequence."""

import keras
from keras import ops

from performer_keras.options import check_float_dtype, check_rank


@keras.saving.register_keras_serializable(package="performer_keras")
class ClassToken(keras.layers.Layer):
    """Prepend one learned token (Dosovitskiy et al., arXiv:2010.11929).

    Call arguments: inputs (batch, P, width). Returns (batch, 1 + P, width).
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        check_float_dtype(self)

    def build(self, inputs_shape):
        check_rank("ClassToken", inputs_shape, "(batch, tokens, width)", known=("width",))
        self.token = self.add_weight(name="token", shape=(1, 1, int(inputs_shape[-1])), initializer="zeros")
        # Keras then names a later input of another width, which otherwise failed in the backend's broadcast.
        self.input_spec = keras.InputSpec(ndim=3, axes={-1: int(inputs_shape[-1])})

    def call(self, inputs):
        token = ops.cast(self.token, inputs.dtype)
        token = ops.broadcast_to(token, (ops.shape(inputs)[0], 1, ops.shape(inputs)[-1]))
        return ops.concatenate([token, inputs], axis=1)

    def compute_output_shape(self, inputs_shape):
        tokens = None if inputs_shape[1] is None else inputs_shape[1] + 1
        return (inputs_shape[0], tokens, inputs_shape[2])
