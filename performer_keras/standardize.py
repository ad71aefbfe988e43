"""Per-channel standardisation of pixels, as the model's first layer."""

import keras
from keras import ops

from performer_keras.options import check_float_dtype, check_per_channel


@keras.saving.register_keras_serializable(package="performer_keras")
class Standardize(keras.layers.Layer):
    """``(images - mean) / std`` per channel, with fixed statistics of the training split.

    Keras' own ``Normalization`` is a preprocessing layer that calls into
    TensorFlow even under JAX, so a model built with it cannot run on a
    machine without TensorFlow (a typical CUDA JAX box). This layer is pure
    ``keras.ops``, holds no weights (the statistics live in its config) and
    computes in the layer's compute dtype.

    Args:
        mean, std: one value per channel, in the images' units (pixels 0..255).
    """

    def __init__(self, mean, std, **kwargs):
        super().__init__(**kwargs)
        check_float_dtype(self)
        self.mean, self.std = check_per_channel("mean", mean), check_per_channel("std", std)
        if len(self.mean) != len(self.std) or any(s <= 0 for s in self.std):
            raise ValueError(f"mean and std need one value per channel each and std > 0, got {mean} and {std}")

    def _check_channels(self, images_shape):
        if images_shape[-1] != len(self.mean):
            raise ValueError(f"Standardize has {len(self.mean)} channels, got images of shape {tuple(images_shape)}")

    def build(self, images_shape):
        # A functional model takes the output shape from compute_output_shape, without running `call`, so
        # unchecked here a 3-channel mean on 1-channel images built a model that failed only at its first step.
        self._check_channels(images_shape)

    def call(self, images):
        self._check_channels(images.shape)
        images = ops.cast(images, self.compute_dtype)
        mean = ops.convert_to_tensor(self.mean, self.compute_dtype)
        scale = ops.convert_to_tensor([1.0 / s for s in self.std], self.compute_dtype)
        return (images - mean) * scale

    def compute_output_shape(self, images_shape):
        return images_shape

    def get_config(self):
        return {**super().get_config(), "mean": self.mean, "std": self.std}
