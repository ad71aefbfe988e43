"""SmoothedSparseCrossentropy against the cross-entropy written out in numpy, and its config."""

import keras
import numpy as np
import pytest

from performer_keras import SmoothedSparseCrossentropy, custom_objects


def brute_force(labels, probabilities, smoothing):
    classes = probabilities.shape[-1]
    targets = (1 - smoothing) * np.eye(classes)[labels] + smoothing / classes
    return np.mean(-np.sum(targets * np.log(probabilities), axis=-1))


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.5])
@pytest.mark.parametrize("label_shape", [(6,), (6, 1)])
def test_matches_the_cross_entropy_against_smoothed_one_hot_targets(smoothing, label_shape):
    rng = np.random.default_rng(0)
    probabilities = rng.dirichlet(np.ones(10), size=6).astype("float32")
    labels = rng.integers(0, 10, size=6)
    loss = SmoothedSparseCrossentropy(smoothing)(labels.reshape(label_shape), probabilities)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loss), brute_force(labels, probabilities, smoothing),
                               rtol=1e-5)
    if smoothing == 0.0:
        sparse = keras.losses.SparseCategoricalCrossentropy()(labels, probabilities)
        np.testing.assert_allclose(keras.ops.convert_to_numpy(loss), keras.ops.convert_to_numpy(sparse), rtol=1e-6)


def test_round_trips_its_config_and_is_among_the_custom_objects():
    loss = SmoothedSparseCrossentropy(0.1)
    assert SmoothedSparseCrossentropy.from_config(loss.get_config()).get_config() == loss.get_config()
    assert custom_objects()["SmoothedSparseCrossentropy"] is SmoothedSparseCrossentropy


@pytest.mark.parametrize("smoothing", [-0.1, 1.0, float("inf")])
def test_refuses_a_smoothing_outside_0_to_1(smoothing):
    with pytest.raises(ValueError, match="label_smoothing"):
        SmoothedSparseCrossentropy(smoothing)
