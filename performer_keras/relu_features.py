"""Performer-ReLU features: generalized kernel attention with f = ReLU."""

import keras
from keras import ops

from performer_keras.feature_map import FeatureMap
from performer_keras.options import check_bool, check_finite
from performer_keras.random_features import RandomFeatures


@keras.saving.register_keras_serializable(package="performer_keras")
class ReluFeatures(RandomFeatures):
    """ReLU random features (Choromanski et al., ICLR 2021, arXiv:2009.14794, sec. 2.2).

        phi(x) = ReLU(W x) / sqrt(m) + eps        (random, default)
        phi(x) = ReLU(x) + eps                     (deterministic=True, m = d)

    W is an m x d orthogonal (or i.i.d.) random projection shared by queries,
    keys and heads. `eps` keeps the normaliser phi(q)^T sum_j phi(k_j) away
    from zero when every projected feature of a query is negative. Features are
    float32, as for FAVOR+.

    Args:
        num_features: m (ignored when deterministic). orthogonal,
            redraw_interval, seed: see `RandomFeatures`.
        deterministic: phi(x) = ReLU(x), no projection.
        epsilon: added to every feature.

    Call arguments:
        queries: (..., N, d). keys: (..., N, d). training: enables redraws.

    Returns:
        (phi(queries), phi(keys)), each (..., N, m), float32.

    Cost: O(N m d) time (O(N d) when deterministic), O(N m) memory.
    """

    def __init__(self, num_features=64, orthogonal=True, redraw_interval=0, deterministic=False, epsilon=1e-3, seed=None, **kwargs):
        super().__init__(num_features, orthogonal, redraw_interval, seed, **kwargs)
        self.deterministic = check_bool("deterministic", deterministic)
        self.epsilon = check_finite("epsilon", epsilon, low=0.0)

    def build(self, queries_shape, keys_shape=None):
        if self.deterministic:
            FeatureMap.build(self, queries_shape, keys_shape)  # no projection to draw
        else:
            super().build(queries_shape, keys_shape)

    def output_dim(self, input_dim):
        return input_dim if self.deterministic else self.num_features

    def call(self, queries, keys, training=None):
        if self.deterministic:
            return self.feature_map(queries, keys, None)
        return super().call(queries, keys, training=training)

    def feature_map(self, queries, keys, projection):
        def features(x):
            x = ops.cast(x, "float32")
            if projection is None:
                return ops.relu(x) + self.epsilon
            logits = ops.matmul(x, ops.transpose(ops.cast(projection, "float32")))  # (..., N, m)
            return ops.relu(logits) * self.num_features**-0.5 + self.epsilon

        return features(queries), features(keys)

    def get_config(self):
        config = super().get_config()
        config.update(deterministic=self.deterministic, epsilon=self.epsilon)
        return config
