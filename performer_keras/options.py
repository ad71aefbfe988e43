"""One place where short option strings are checked (STYLE rule 6)."""

import argparse

KERNELS = ("softmax", "favor", "relu", "exp", "linformer")
POSITIONS = ("absolute", "rope", "string", "kerple")
ROTATION_ORDERS = ("before", "after")


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


def positive_int(text):
    """argparse type for the scripts: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value
