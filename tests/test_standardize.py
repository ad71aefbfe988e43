"""Standardize against a numpy reference, its config, and a model with it under mixed precision."""

import keras
import numpy as np
import pytest

from performer_keras import Standardize


def test_matches_numpy_and_round_trips_its_config():
    images = np.random.default_rng(0).integers(0, 256, (4, 6, 5, 3)).astype(np.float32)
    mean, std = [120.0, 110.5, 99.0], [60.0, 55.0, 70.25]
    layer = Standardize(mean, std, name="normalize")
    expected = (images - np.array(mean)) / np.array(std)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer(images)), expected, rtol=1e-6, atol=1e-6)
    clone = Standardize.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config() and not clone.weights
    np.testing.assert_allclose(keras.ops.convert_to_numpy(clone(images)), expected, rtol=1e-6, atol=1e-6)
    half = Standardize(mean, std, dtype="mixed_bfloat16")
    assert keras.backend.standardize_dtype(half(images).dtype) == "bfloat16"


def test_refuses_mismatched_channels_and_zero_std():
    with pytest.raises(ValueError, match="std > 0"):
        Standardize([0.0], [0.0])
    with pytest.raises(ValueError, match="one value per channel each"):
        Standardize([0.0, 1.0], [1.0])
    with pytest.raises(ValueError, match="finite"):
        Standardize([0.0], [float("nan")])
    with pytest.raises(ValueError, match="finite"):
        Standardize([float("inf")], [1.0])
    with pytest.raises(ValueError, match="3 channels"):
        Standardize([0.0] * 3, [1.0] * 3)(np.zeros((1, 2, 2, 1), np.float32))


@pytest.mark.parametrize("mean", ["12", 33.3, [None], ["a"], [[1.0]], []])
def test_refuses_statistics_that_are_not_a_list_of_numbers(mean):
    # Read item by item with float(), the string "12" was two channels, 1 and 2; a bare number ended in
    # "'float' object is not iterable", None in a float() TypeError.
    with pytest.raises(ValueError, match=r"mean must be a list of finite numbers, one per channel, got "):
        Standardize(mean, [1.0])


def test_takes_numpy_statistics_and_keeps_plain_floats_in_its_config():
    layer = Standardize(np.array([33.3], np.float32), (np.float64(78.6),))
    assert layer.get_config()["mean"] == [pytest.approx(33.3)] and type(layer.get_config()["std"][0]) is float


def test_a_model_whose_statistics_have_other_channels_than_its_images_is_refused_when_built():
    # A functional model takes Standardize's output shape without running its call, so the check in `call` let
    # build_vit make a model with a 3-channel mean on 1-channel images that failed only at its first step.
    from performer_keras import build_vit

    with pytest.raises(ValueError, match=r"Standardize has 3 channels, got images of shape \(None, 8, 8, 1\)"):
        build_vit((8, 8, 1), 10, width=8, heads=2, depth=1, mlp_dim=8, mean=[1.0, 2.0, 3.0], std=[1.0] * 3)
    model = build_vit((8, 8, 3), 10, width=8, heads=2, depth=1, mlp_dim=8, mean=[1.0, 2.0, 3.0], std=[1.0] * 3)
    assert model(np.zeros((1, 8, 8, 3), np.float32)).shape == (1, 10)
