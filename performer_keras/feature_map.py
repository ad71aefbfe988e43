"""The base of every feature map phi of a linear kernel."""

import keras

from performer_keras.options import check_float_dtype


class FeatureMap(keras.layers.Layer):
    """Base of the feature maps phi with phi(q)^T phi(k) ~ kappa(q, k).

    `KernelAttention` computes a linear kernel as
    phi(q) (phi(k)^T v) / phi(q) (phi(k)^T 1), so phi must be positive (the
    normaliser divides) and is computed in float32. A subclass implements

        output_dim(input_dim)             the width m of phi(x)
        call(queries, keys, training)     (phi(queries), phi(keys)), float32

    and takes its options as keyword arguments named as in `KernelAttention`
    (`registry.Kernel.options` says which are passed). This base records the
    head dimension d in `build` (`self.dim`) and answers `feature_dim` and
    `compute_output_shape`. A subclass is registered for serialisation with
    `keras.saving.register_keras_serializable` and as a kernel with
    `performer_keras.register_kernel`.

    Call arguments: queries (..., N, d), keys (..., N, d), training.
    Returns: (phi(queries), phi(keys)), each (..., N, m), float32.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        check_float_dtype(self)

    def build(self, queries_shape, keys_shape=None):
        # phi(q)^T phi(k) needs one projection for both; else the backend's matmul fails, naming neither.
        if keys_shape is not None and keys_shape[-1] != queries_shape[-1]:
            raise ValueError(f"{type(self).__name__} takes queries and keys of one width d, got {queries_shape[-1]} "
                             f"and {keys_shape[-1]}")
        if queries_shape[-1] is None:
            raise ValueError(f"{type(self).__name__} needs a known width d of queries and keys to make its weights, "
                             f"got shape {tuple(queries_shape)}")
        self.dim = int(queries_shape[-1])

    def output_dim(self, input_dim):
        raise NotImplementedError(f"{type(self).__name__} must say the width of its features: output_dim(input_dim)")

    @property
    def feature_dim(self):
        """m, the width of phi(x) (after `build`)."""
        return self.output_dim(self.dim)

    def compute_output_shape(self, queries_shape, keys_shape=None):
        keys_shape = queries_shape if keys_shape is None else keys_shape
        m = self.output_dim(int(queries_shape[-1]))
        return tuple(queries_shape[:-1]) + (m,), tuple(keys_shape[:-1]) + (m,)
