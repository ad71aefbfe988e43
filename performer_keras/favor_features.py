"""FAVOR+ positive random features for the softmax kernel."""

import keras
from keras import ops

from performer_keras.options import (DEFAULT_STABILIZER, STABILIZER_BEFORE_OPTION, STABILIZERS, check_choice,
                                     check_finite)
from performer_keras.random_features import RandomFeatures


def positive_exp(logits, squared_norm_half, is_query, epsilon, stabilizer=DEFAULT_STABILIZER):
    """exp(logits - |x|^2/2 - M) + epsilon with the Performer stabiliser M.

    M must cancel in the attention ratio. For a query it is the query's own
    maximum over features: it multiplies numerator and normaliser of that query
    alike. For keys it must be ONE constant per (batch, head): a per-key
    maximum would rescale each key's weight differently and silently change
    the attention (the bug of several public ports). M is a constant of the
    estimator, so it sits under `stop_gradient`.

    `stabilizer` says what M is the maximum of: "exponent" (the default),
    logits - |x|^2/2, so that the largest feature of each query, and of one
    key per (batch, head), is exactly 1 + epsilon; or "logits", as in
    Choromanski et al.'s code. Without epsilon the two give the same
    attention. With it they do not once keys are long: the logits' maximum
    exceeds the exponent's by about the longest key's |k'|^2/2, which can
    push every other key's features under epsilon, where they no longer
    depend on the key and pass it no gradient, and attention becomes a
    uniform average (in trained models too: README, "Why: FAVOR+ collapses
    ..."). Both keep every exponential at most 1, so neither overflows.
    """
    exponent = logits - squared_norm_half
    axes = -1 if is_query else (-2, -1)
    stabiliser = ops.max(exponent if stabilizer == "exponent" else logits, axis=axes, keepdims=True)
    return ops.exp(exponent - ops.stop_gradient(stabiliser)) + epsilon


@keras.saving.register_keras_serializable(package="performer_keras")
class FavorFeatures(RandomFeatures):
    """FAVOR+ features (Choromanski et al., ICLR 2021, arXiv:2009.14794).

        x' = x d^(-1/4)
        phi(x') = m^(-1/2) (exp(W x' - |x'|^2 / 2 - M) + eps)

    so that E[phi(q')^T phi(k')] = exp(q^T k / sqrt(d)) (up to the constant
    exp(-M_q - M_k), which cancels in attention), the softmax kernel. One W
    serves queries and keys (and all heads); M is described in
    `positive_exp`, after `stabilizer`. Features are computed in float32 so that logits of
    magnitude 50 neither overflow nor underflow under mixed precision.

    Args:
        num_features: m. orthogonal, redraw_interval, seed: see
            `RandomFeatures`.
        epsilon: keeps every feature, hence the normaliser, positive.
        stabilizer: "exponent" (the default) or "logits" (the Performer's):
            what the stabiliser M is the maximum of (`positive_exp`). A
            config saved without it (before the option) means "logits".

    Call arguments:
        queries: (..., N, d). keys: (..., N, d). training: enables redraws.

    Returns:
        (phi(queries), phi(keys)), each (..., N, m), float32.

    Cost: O(N m d) time, O(N m) memory.
    """

    def __init__(self, num_features=64, orthogonal=True, redraw_interval=0, epsilon=1e-6, seed=None,
                 stabilizer=DEFAULT_STABILIZER, **kwargs):
        super().__init__(num_features, orthogonal, redraw_interval, seed, **kwargs)
        self.epsilon = check_finite("epsilon", epsilon, low=0.0)
        self.stabilizer = check_choice("stabilizer", stabilizer, STABILIZERS)

    def feature_map(self, queries, keys, projection):
        scale = self.dim**-0.25
        projection = ops.cast(projection, "float32")

        def features(x, is_query):
            x = ops.cast(x, "float32") * scale
            logits = ops.matmul(x, ops.transpose(projection))  # (..., N, m)
            half_norm = 0.5 * ops.sum(ops.square(x), axis=-1, keepdims=True)
            return positive_exp(logits, half_norm, is_query, self.epsilon, self.stabilizer) * self.num_features**-0.5

        return features(queries, True), features(keys, False)

    @classmethod
    def from_config(cls, config):
        return super().from_config({"stabilizer": STABILIZER_BEFORE_OPTION, **config})

    def get_config(self):
        config = super().get_config()
        config.update(epsilon=self.epsilon, stabilizer=self.stabilizer)
        return config
