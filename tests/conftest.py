"""Shared pytest set-up for the layer tests (backend-agnostic)."""

import keras
import pytest


@pytest.fixture(autouse=True)
def fixed_global_seed():
    """Layers built with seed=None and Keras initializers draw the same numbers every run."""
    keras.utils.set_random_seed(1234)
    yield
