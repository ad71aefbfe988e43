"""FAVOR+ positive random features for the softmax kernel."""

import keras
from keras import ops

from performer_keras.options import check_finite
from performer_keras.random_features import RandomFeatures


def positive_exp(logits, squared_norm_half, is_query, epsilon):
    """exp(logits - |x|^2/2 - M) + epsilon with the Performer stabiliser M.

    M must cancel in the attention ratio. For a query it is the query's own
    maximum over features: it multiplies numerator and normaliser of that query
    alike. For keys it must be ONE constant per (batch, head): a per-key
    maximum would rescale each key's weight differently and silently change
    the attention (the bug of several public ports). M is a constant of the
    estimator, so it sits under `stop_gradient`.
    """
    axes = -1 if is_query else (-2, -1)
    stabiliser = ops.stop_gradient(ops.max(logits, axis=axes, keepdims=True))
    return ops.exp(logits - squared_norm_half - stabiliser) + epsilon


@keras.saving.register_keras_serializable(package="performer_keras")
class FavorFeatures(RandomFeatures):
    """FAVOR+ features (Choromanski et al., ICLR 2021, arXiv:2009.14794).

        x' = x d^(-1/4)
        phi(x') = m^(-1/2) (exp(W x' - |x'|^2 / 2 - M) + eps)

    so that E[phi(q')^T phi(k')] = exp(q^T k / sqrt(d)) (up to the constant
    exp(-M_q - M_k), which cancels in attention), the softmax kernel. One W
    serves queries and keys (and all heads); M is described in
    `positive_exp`. Features are computed in float32 so that logits of
    magnitude 50 neither overflow nor underflow under mixed precision.

    Args:
        num_features: m. orthogonal, redraw_interval, seed: see
            `RandomFeatures`.
        epsilon: keeps every feature, hence the normaliser, positive.

    Call arguments:
        queries: (..., N, d). keys: (..., N, d). training: enables redraws.

    Returns:
        (phi(queries), phi(keys)), each (..., N, m), float32.

    Cost: O(N m d) time, O(N m) memory.
    """

    def __init__(self, num_features=64, orthogonal=True, redraw_interval=0, epsilon=1e-6, seed=None, **kwargs):
        super().__init__(num_features, orthogonal, redraw_interval, seed, **kwargs)
        self.epsilon = check_finite("epsilon", epsilon, low=0.0)

    def feature_map(self, queries, keys, projection):
        scale = self.dim**-0.25
        projection = ops.cast(projection, "float32")

        def features(x, is_query):
            x = ops.cast(x, "float32") * scale
            logits = ops.matmul(x, ops.transpose(projection))  # (..., N, m)
            half_norm = 0.5 * ops.sum(ops.square(x), axis=-1, keepdims=True)
            return positive_exp(logits, half_norm, is_query, self.epsilon) * self.num_features**-0.5

        return features(queries, True), features(keys, False)

    def get_config(self):
        config = super().get_config()
        config["epsilon"] = self.epsilon
        return config
