"""One place where short option strings and numbers are checked (STYLE rule 6).

The tables of kernels, positions and sizes are in `registry.py`.
"""

import math

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


def check_fraction(argument, value):
    """Return `value` if it is a finite number in [0, 1) (a dropout rate, a label smoothing), else raise a ValueError."""
    if check_finite(argument, value, low=0.0) >= 1.0:
        raise ValueError(f"{argument} must be < 1, got {value!r}")
    return value


def check_finite(argument, value, low=None, low_open=False):
    """Return `value` if it is a finite number (>= `low`, or > `low` if `low_open`), else raise a ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{argument} must be a finite number, got {value!r}")
    if low is not None and (value <= low if low_open else value < low):
        raise ValueError(f"{argument} must be {'>' if low_open else '>='} {low}, got {value!r}")
    return value
