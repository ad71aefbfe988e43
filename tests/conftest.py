"""Shared pytest set-up for the layer tests (backend-agnostic)."""

import os
import sys

import keras
import pytest

# The package is used from the checkout, not installed.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)


@pytest.fixture(autouse=True)
def fixed_global_seed():
    """Layers built with seed=None and Keras initializers draw the same numbers every run."""
    keras.utils.set_random_seed(1234)
    yield
