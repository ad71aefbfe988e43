"""Dropout whose masks depend on (seed, training step) alone."""

import keras
from keras import ops

from performer_keras.options import check_float_dtype, check_fraction, check_seed


@keras.saving.register_keras_serializable(package="performer_keras")
class StepDropout(keras.layers.Layer):
    """Dropout (Srivastava et al., JMLR 2014) that a run resumed from its weights repeats exactly.

    Keras' `Dropout` draws its masks from a `SeedGenerator` whose state is not
    saved with the weights, so a run resumed from a backup would draw its first
    epoch's masks again and part from the uninterrupted run. Here a saved step
    counter sets the generator's state before each training call, so the mask
    of training call s is a function of (seed, s) alone, as `RandomFeatures`
    does for its redraws. At inference (`training=False`) it is the identity.

    Args:
        rate: the fraction of units set to 0 in training, in [0, 1); the kept
            units are scaled by 1 / (1 - rate).
        seed: the layer's seed (None: drawn from the global seed set by
            `keras.utils.set_random_seed`, so one seeded build gives the same
            seeds every time).

    Call arguments:
        inputs: a tensor of any shape.
        training: drop units only when true.

    Returns: inputs, with units dropped in training; same shape and dtype.
    """

    def __init__(self, rate, seed=None, **kwargs):
        super().__init__(**kwargs)
        check_float_dtype(self)
        self.rate = check_fraction("rate", rate)
        self.seed = check_seed("seed", seed, allow_none=True)
        self.seed_generator = keras.random.SeedGenerator(self.seed, name="seed_generator")
        self.supports_masking = True

    def build(self, input_shape):
        self.step = self.add_weight(name="step", shape=(), dtype="int32", initializer="zeros", trainable=False)

    def call(self, inputs, training=None):
        if not training or self.rate == 0.0:
            return inputs
        self.step.assign(self.step + 1)
        state = self.seed_generator.state
        state.assign(ops.stack([state[0], ops.cast(self.step, state.dtype)]))
        return keras.random.dropout(inputs, self.rate, seed=self.seed_generator)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(rate=self.rate, seed=self.seed)
        return config
