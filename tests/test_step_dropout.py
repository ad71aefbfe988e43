"""StepDropout against its definition (each unit 0 or x / (1 - rate)), its masks as a function of (seed, step),
and a ViT with it: the identity at inference, and a rebuilt model that continues a run's masks."""

import keras
import numpy as np
import pytest

import performer_keras as pk
from performer_keras import StepDropout

from layer_test_case import run_layer_test, to_numpy

RATE = 0.25


def test_layer_contract(tmp_path):
    inputs = np.random.default_rng(0).normal(size=(4, 5, 8)).astype("float32")
    run_layer_test(StepDropout, {"rate": RATE, "seed": 3}, inputs, (4, 5, 8), expected_num_trainable_weights=0,
                   expected_num_non_trainable_weights=1, tmp_path=tmp_path)


def test_training_keeps_each_unit_scaled_or_drops_it_and_inference_is_the_identity():
    inputs = np.random.default_rng(1).uniform(1.0, 2.0, size=(64, 256)).astype("float32")
    layer = StepDropout(RATE, seed=5)
    dropped = to_numpy(layer(inputs, training=True))
    kept = dropped != 0
    np.testing.assert_allclose(dropped[kept], inputs[kept] / (1 - RATE), rtol=1e-6)
    # 16,384 Bernoulli(0.25) draws: the dropped fraction is within 5 standard errors (0.017) of the rate.
    assert abs((1 - kept.mean()) - RATE) < 5 * np.sqrt(RATE * (1 - RATE) / kept.size)
    np.testing.assert_array_equal(to_numpy(layer(inputs, training=False)), inputs)
    np.testing.assert_array_equal(to_numpy(StepDropout(0.0, seed=5)(inputs, training=True)), inputs)


def test_the_mask_of_a_step_depends_on_the_seed_and_the_saved_step_alone():
    inputs = np.ones((8, 64), "float32")
    first = StepDropout(RATE, seed=7)
    masks = [to_numpy(first(inputs, training=True)) for _ in range(3)]
    assert not np.array_equal(masks[0], masks[1]) and not np.array_equal(masks[1], masks[2])
    # A layer rebuilt from the weights after the first step (a run resumed from its backup) goes on alike.
    resumed = StepDropout(RATE, seed=7)
    resumed.build(inputs.shape)
    first_again = StepDropout(RATE, seed=7)
    np.testing.assert_array_equal(to_numpy(first_again(inputs, training=True)), masks[0])
    resumed.set_weights(first_again.get_weights())
    np.testing.assert_array_equal(to_numpy(resumed(inputs, training=True)), masks[1])
    np.testing.assert_array_equal(to_numpy(resumed(inputs, training=True)), masks[2])
    assert not np.array_equal(to_numpy(StepDropout(RATE, seed=8)(inputs, training=True)), masks[0])


@pytest.mark.parametrize("rate", [-0.1, 1.0, float("nan")])
def test_refuses_a_rate_outside_0_to_1(rate):
    with pytest.raises(ValueError, match="rate"):
        StepDropout(rate)


@pytest.mark.parametrize("seed", [-1, 2**32, 0.5, "1"])
def test_refuses_a_seed_not_every_backend_takes(seed):
    with pytest.raises(ValueError, match=r"seed must be None or an integer from 0 to 4294967295"):
        StepDropout(RATE, seed=seed)


def test_a_vit_with_dropout_predicts_as_the_same_weights_without_it():
    keras.utils.set_random_seed(0)
    plain = pk.create_model("favor-rope", size="tiny")
    with_dropout = pk.create_model("favor-rope", size="tiny", dropout=0.2)
    depth = pk.SIZES["tiny"]["depth"]
    added = [layer.name for layer in with_dropout.layers if isinstance(layer, StepDropout)]
    assert len(added) == 1 + 3 * depth and not any(isinstance(layer, StepDropout) for layer in plain.layers)
    weights = {w.path: w for w in with_dropout.weights}
    for weight in plain.weights:
        weights[weight.path].assign(weight.value)
    images = np.random.default_rng(2).uniform(0, 255, size=(3, 28, 28, 1)).astype("float32")
    np.testing.assert_allclose(to_numpy(with_dropout(images, training=False)), to_numpy(plain(images)), atol=1e-6)
    assert not np.allclose(to_numpy(with_dropout(images, training=True)), to_numpy(plain(images)), atol=1e-3)
