"""One place where short option strings are checked (STYLE rule 6)."""

import argparse

KERNELS = ("softmax", "favor", "relu", "exp", "linformer")
POSITIONS = ("absolute", "rope", "string", "kerple")
ROTATION_ORDERS = ("before", "after")
AUGMENTATIONS = ("none", "rotate", "crop_flip")


def check_choice(argument, value, choices):
    """Return `value` if it is one of `choices`, else raise a ValueError naming both."""
    if value not in choices:
        raise ValueError(
            f"Unknown {argument} {value!r}; expected one of {tuple(choices)}"
        )
    return value


def check_positive(argument, value):
    """Return `value` if it is an integer >= 1, else raise a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{argument} must be an integer >= 1, got {value!r}")
    return value


def check_non_negative(argument, value):
    """Return `value` if it is an integer >= 0, else raise a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{argument} must be an integer >= 0, got {value!r}")
    return value


def check_finite(argument, value, low=None, low_open=False):
    """Return `value` if it is a finite number (>= `low`, or > `low` if `low_open`), else raise a ValueError."""
    import math

    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{argument} must be a finite number, got {value!r}")
    if low is not None and (value <= low if low_open else value < low):
        raise ValueError(f"{argument} must be {'>' if low_open else '>='} {low}, got {value!r}")
    return value


def positive_int(text):
    """argparse type for the scripts: an integer >= 1."""
    return _int_at_least(text, 1)


def non_negative_int(text):
    """argparse type for the scripts: an integer >= 0."""
    return _int_at_least(text, 0)


def _int_at_least(text, low):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= {low}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected a whole number >= {low}, got {text!r}")
    return value
