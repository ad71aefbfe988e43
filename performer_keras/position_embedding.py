"""Learned absolute position embedding."""

import keras
from keras import ops

from performer_keras.batch_broadcast import over_batch
from performer_keras.options import check_finite, check_float_dtype, check_rank


@keras.saving.register_keras_serializable(package="performer_keras")
class PositionEmbedding(keras.layers.Layer):
    """Add a learned vector per token index (the ViT baseline, arXiv:2010.11929).

    Args:
        initializer_stddev: std of the truncated-normal initialisation (0.02, as ViT).

    Call arguments: inputs (batch, N, width) with N fixed. Returns the same shape.
    """

    def __init__(self, initializer_stddev=0.02, **kwargs):
        super().__init__(**kwargs)
        check_float_dtype(self)
        self.initializer_stddev = check_finite("initializer_stddev", initializer_stddev, low=0.0)

    def build(self, inputs_shape):
        check_rank("PositionEmbedding", inputs_shape, "(batch, tokens, width)", known=("tokens", "width"))
        self.embedding = self.add_weight(
            name="embedding",
            shape=(int(inputs_shape[1]), int(inputs_shape[2])),
            initializer=keras.initializers.TruncatedNormal(stddev=self.initializer_stddev),
        )
        # Keras then names a later input of other tokens or width, which otherwise failed in the backend's add.
        self.input_spec = keras.InputSpec(ndim=3, axes={1: int(inputs_shape[1]), 2: int(inputs_shape[2])})

    def call(self, inputs):
        return inputs + over_batch(ops.cast(self.embedding, inputs.dtype), inputs.shape[0])

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config["initializer_stddev"] = self.initializer_stddev
        return config
