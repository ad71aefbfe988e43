"""Random projections shared by the FAVOR+ and ReLU feature maps.

`RandomFeatures` owns the (num_features, dim) projection matrix W as a
non-trainable weight, so a saved model reloads with the very features it was
trained with, and optionally redraws it every `redraw_interval` training steps.

Why the redraw happens inside `call` and not in a callback: Keras 3's JAX
trainer keeps the model state in a jitted loop and writes it back to the
variables only at epoch ends, so a variable assigned by a callback mid-epoch is
silently discarded on JAX. A step counter and a `keras.random.SeedGenerator`
inside the layer give the same schedule on every backend; at inference
(`training=False`) the projection never changes.
"""

import keras
from keras import ops

from performer_keras.feature_map import FeatureMap
from performer_keras.options import check_bool, check_non_negative, check_positive, check_seed


def draw_projection(num_features, dim, orthogonal, seed):
    """Sample a (num_features, dim) projection for random features.

    Orthogonal (Choromanski et al. 2021, section 2.4): stack ceil(m/d)
    independent d x d blocks with orthonormal rows (QR of a Gaussian matrix,
    signs fixed by diag(R) so each block is Haar-distributed), then give every
    row the norm of an independent d-dimensional Gaussian vector (chi(d)), so
    each row is marginally N(0, I_d) but rows within a block are exactly
    orthogonal. This lowers the estimator's variance at no extra cost.
    I.i.d.: every entry N(0, 1).
    """
    if not orthogonal:
        return keras.random.normal((num_features, dim), seed=seed)
    blocks = -(-num_features // dim)
    # ONE draw split in two: an integer seed would make two separate draws
    # start from the same numbers, tying the row norms to the very Gaussian
    # the directions come from, and rows would no longer be N(0, I_d).
    samples = keras.random.normal((blocks * dim + num_features, dim), seed=seed)
    gaussian = ops.reshape(samples[: blocks * dim], (blocks, dim, dim))
    q, r = ops.qr(gaussian)  # (blocks, dim, dim) each
    signs = ops.sign(ops.diagonal(r, axis1=-2, axis2=-1))  # (blocks, dim)
    rows = ops.transpose(q * signs[:, None, :], (0, 2, 1))  # rows orthonormal
    rows = ops.reshape(rows, (blocks * dim, dim))[:num_features]
    norms = ops.norm(samples[blocks * dim :], axis=-1)  # (num_features,) chi(dim)
    return rows * norms[:, None]


class RandomFeatures(FeatureMap):
    """Base of feature maps phi(x) built on a random projection W (m x d).

    Subclasses implement `feature_map(queries, keys)`; this class owns W, its
    sampling and its redraw schedule.

    Args:
        num_features: m, the number of random features (>= 1).
        orthogonal: block-orthogonal rows (default) or i.i.d. Gaussian rows.
        redraw_interval: 0 never redraws; K > 0 draws a fresh W every K
            training steps (never at inference).
        seed: seed of the layer's `SeedGenerator` (None: from the global seed
            set by `keras.utils.set_random_seed`).
    """

    def __init__(
        self, num_features=64, orthogonal=True, redraw_interval=0, seed=None, **kwargs
    ):
        super().__init__(**kwargs)
        self.num_features = check_positive("num_features", num_features)
        self.orthogonal = check_bool("orthogonal", orthogonal)
        self.redraw_interval = check_non_negative("redraw_interval", redraw_interval)
        self.seed = check_seed("seed", seed, allow_none=True)
        self.seed_generator = keras.random.SeedGenerator(self.seed, name="seed_generator")

    def draw(self):
        """A fresh projection from the layer's seed generator."""
        return ops.cast(
            draw_projection(self.num_features, self.dim, self.orthogonal, self.seed_generator),
            self.variable_dtype,
        )

    def build(self, queries_shape, keys_shape=None):
        super().build(queries_shape, keys_shape)
        self.projection = self.add_weight(
            name="projection",
            shape=(self.num_features, self.dim),
            initializer=lambda shape, dtype=None: self.draw(),
            trainable=False,
        )
        if self.redraw_interval:
            self.step = self.add_weight(
                name="step", shape=(), dtype="int32", initializer="zeros", trainable=False
            )

    def output_dim(self, input_dim):
        return self.num_features

    def current_projection(self, training):
        """W for this call: redrawn first when a training step hits the interval."""
        if training and self.redraw_interval:
            self.step.assign(self.step + 1)
            due = ops.equal(ops.mod(self.step, self.redraw_interval), 0)
            # Keras does not save a SeedGenerator's state with the weights, so the
            # draw is made a function of (seed, step) alone: a run resumed from a
            # backup redraws exactly the features of the uninterrupted run.
            state = self.seed_generator.state
            state.assign(ops.stack([state[0], ops.cast(self.step, state.dtype) * 2]))
            # `.value`: JAX's where rejects a Variable inside a jitted train step.
            self.projection.assign(ops.where(due, self.draw(), self.projection.value))
        return self.projection.value

    def call(self, queries, keys, training=None):
        return self.feature_map(queries, keys, self.current_projection(training))

    def get_config(self):
        config = super().get_config()
        config.update(
            num_features=self.num_features,
            orthogonal=self.orthogonal,
            redraw_interval=self.redraw_interval,
            seed=self.seed,
        )
        return config
