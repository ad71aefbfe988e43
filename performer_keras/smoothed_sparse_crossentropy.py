"""Cross-entropy with label smoothing for integer labels and a model that outputs probabilities."""

import keras
from keras import ops

from performer_keras.options import check_fraction


@keras.saving.register_keras_serializable(package="performer_keras")
class SmoothedSparseCrossentropy(keras.losses.Loss):
    """Cross-entropy against (1 - s) one_hot(y) + s / K (Szegedy et al., arXiv:1512.00567).

    Keras' sparse cross-entropy has no label smoothing and its categorical one
    wants one-hot labels; datasets give integer labels, so they are made
    one-hot here. With s = 0 it is the sparse cross-entropy. `y_pred` holds
    probabilities, as `build_vit`'s head gives. A model compiled with it loads
    with `custom_objects=performer_keras.custom_objects()`.

    Args:
        label_smoothing: s in [0, 1): the mass spread evenly over the K classes.
    """

    def __init__(self, label_smoothing, name="smoothed_sparse_crossentropy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.label_smoothing = float(check_fraction("label_smoothing", label_smoothing))

    def call(self, y_true, y_pred):
        labels = ops.one_hot(ops.cast(ops.reshape(y_true, (-1,)), "int32"), ops.shape(y_pred)[-1], dtype=y_pred.dtype)
        return keras.losses.categorical_crossentropy(labels, y_pred, label_smoothing=self.label_smoothing)

    def get_config(self):
        return {**super().get_config(), "label_smoothing": self.label_smoothing}
