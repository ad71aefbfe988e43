"""Deterministic exponential features: the `exp` row of the comparison."""

import keras
from keras import ops

from performer_keras.favor_features import positive_exp
from performer_keras.feature_map import FeatureMap
from performer_keras.options import check_finite


@keras.saving.register_keras_serializable(package="performer_keras")
class ExpFeatures(FeatureMap):
    """Deterministic exponential feature map (no random projection).

        x' = x d^(-1/4)
        phi(x') = exp(x' - M) + eps        (elementwise, m = d)

    so phi(q')^T phi(k') = sum_l exp(q'_l + k'_l) up to the constant
    exp(-M_q - M_k), which cancels in attention. M follows FAVOR+: each
    query's own maximum, one maximum per (batch, head) for keys (see
    `positive_exp`). A cheap, deterministic positive kernel, as in the
    "generalized attention" family of Choromanski et al. (arXiv:2009.14794).

    Call arguments: queries (..., N, d), keys (..., N, d).
    Returns: (phi(queries), phi(keys)), each (..., N, d), float32.
    Cost: O(N d).
    """

    def __init__(self, epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = check_finite("epsilon", epsilon, low=0.0)

    def output_dim(self, input_dim):
        return input_dim

    def call(self, queries, keys, training=None):
        scale = self.dim**-0.25

        def features(x, is_query):
            x = ops.cast(x, "float32") * scale
            return positive_exp(x, 0.0, is_query, self.epsilon)

        return features(queries, True), features(keys, False)

    def get_config(self):
        config = super().get_config()
        config["epsilon"] = self.epsilon
        return config
