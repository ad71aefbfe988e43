"""One place where short option strings and numbers are checked (STYLE rule 6).

The tables of kernels, positions and sizes are in `registry.py`.
"""

import math
import operator

import numpy as np

ROTATION_ORDERS = ("before", "after")
# What FAVOR+'s key stabiliser is the maximum of (`favor_features.positive_exp`). The default is
# not the Performer's "logits": with it FAVOR+ collapses to uniform attention at the `reference`
# size (README, "Why: FAVOR+ collapses ..."). A layer config or run record saved before the
# option existed was computed with the Performer's, so it reads as STABILIZER_BEFORE_OPTION.
STABILIZERS = ("logits", "exponent")
DEFAULT_STABILIZER = "exponent"
STABILIZER_BEFORE_OPTION = "logits"
# A seed every backend takes: keras.random.SeedGenerator keeps it as uint32 on JAX (int64 on
# TensorFlow, so a layer saved there with seed -1 or 2**32 would not load on JAX), and the numpy
# generators under keras.utils.set_random_seed take seeds below 2**32.
MAX_SEED = 2**32 - 1


def check_choice(argument, value, choices):
    """Return `value` if it is one of `choices`, else raise a ValueError naming both."""
    try:
        known = value in choices
    except TypeError:  # a list or a dict is no name, and `in` a dict of names would raise "unhashable type"
        known = False
    if not known:
        raise ValueError(
            f"Unknown {argument} {value!r}; expected one of {tuple(choices)}"
        )
    return value


def check_positive(argument, value):
    """Return `value` as an int if it is an integer >= 1 (NumPy's too), else raise a ValueError naming it."""
    return check_integer_at_least(argument, value, 1)


def check_non_negative(argument, value):
    """Return `value` as an int if it is an integer >= 0 (NumPy's too), else raise a ValueError naming it."""
    return check_integer_at_least(argument, value, 0)


def check_integer_at_least(argument, value, low):
    """Return `value` as an int if it is an integer >= `low` (NumPy's too), else raise a ValueError naming it."""
    integer = _as_integer(value)
    if integer is None or integer < low:
        raise ValueError(f"{argument} must be an integer >= {low}, got {value!r}")
    return integer


def _as_integer(value):
    """`value` as an int if it is a Python or NumPy integer, else None.

    operator.index takes Python and NumPy integers (shape arithmetic gives the
    latter) and refuses floats, which int() would cut (2.5 heads to 2) without a
    word; True is an int to Python, not a count.
    """
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def check_seed(argument, value, allow_none=False):
    """Return `value` as an int if it is an integer from 0 to MAX_SEED (NumPy's too; None too if `allow_none`), else raise a ValueError.

    Keras' own check refuses a NumPy integer with "must be an integer. Received: seed=3",
    and takes -1 or 2**40 on TensorFlow only.
    """
    if value is None and allow_none:
        return None
    integer = _as_integer(value)
    if integer is None or not 0 <= integer <= MAX_SEED:
        raise ValueError(f"{argument} must be {'None or ' if allow_none else ''}an integer from 0 to {MAX_SEED}, got {value!r}")
    return integer


def check_per_channel(argument, value):
    """Return `value` as a list of floats if it is a non-empty list, tuple or 1-D array of finite numbers, else raise a ValueError.

    Reading it item by item with float() took the string "12" as two channels, 1 and 2.
    """
    try:
        array = None if isinstance(value, (str, bytes)) else np.asarray(value)
    except ValueError:  # a ragged list
        array = None
    if array is None or array.ndim != 1 or not array.size \
            or not (np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)) \
            or not np.isfinite(array).all():
        raise ValueError(f"{argument} must be a list of finite numbers, one per channel, got {value!r}")
    return [float(v) for v in array]


def check_bool(argument, value, allow_none=False):
    """Return `value` as a bool if it is True or False (NumPy's too; None too if `allow_none`), else raise a ValueError.

    bool() would take anything: the string "false" from a hand-written config
    is truthy, and would silently switch the option on.
    """
    if value is None and allow_none:
        return None
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{argument} must be True or False{' or None' if allow_none else ''}, got {value!r}")
    return bool(value)


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


def check_grid_size(argument, value):
    """Return `value` as a (rows, cols) tuple of integers >= 1 (NumPy's too), else raise a ValueError naming it."""
    try:
        rows, cols = value
        return check_positive(argument, rows), check_positive(argument, cols)
    except (TypeError, ValueError):
        raise ValueError(f"{argument} must be (rows, cols), two integers >= 1, got {value!r}") from None


def check_float_dtype(layer):
    """Raise a ValueError naming `layer` if its dtype policy computes or keeps weights in other than floating point.

    Called at the end of each layer's `__init__`. Without it an integer policy failed in the backend (FAVOR+'s
    random projections, `PositionEmbedding`'s initialiser) or, worse, ran: `Standardize` cut its output to
    integers. The test is `keras.backend.is_float_dtype`'s, on the policy's standardised dtype names.
    """
    for dtype in (layer.compute_dtype, layer.variable_dtype):
        if not dtype.startswith(("float", "bfloat")):
            raise ValueError(f"{type(layer).__name__} computes in floating point; its dtype policy "
                             f"{layer.dtype_policy.name!r} has dtype {dtype}")


def check_rank(layer, shape, layout, known=()):
    """Raise a ValueError unless `shape` has one entry per name of `layout`, e.g. "(batch, tokens, width)",
    and a size for each axis named in `known` (the ones the layer's weights are made from).

    Unchecked, a wrong rank fails deep in the layer ("not enough values to
    unpack", a backend's concat error) instead of naming the input it wants,
    and an unknown size as "int() argument must be ... not 'NoneType'".
    """
    names = layout.strip("()").split(", ")
    if len(shape) != len(names):
        raise ValueError(f"{layer} takes {layout} inputs, got shape {tuple(shape)}")
    for name in known:
        if shape[names.index(name)] is None:
            raise ValueError(f"{layer} needs a known {name} to make its weights, got shape {tuple(shape)}")


def check_axis(layer, shape, axis, name, expected):
    """Raise a ValueError if `shape[axis]` is known and differs from `expected`, naming the axis and both sizes.

    Unchecked, a wrong size fails in a backend's reshape or matmul, deep in the
    traceback, or broadcasts into a wrong answer.
    """
    size = shape[axis]
    if size is not None and int(size) != expected:
        raise ValueError(f"{layer}: {name} must be {expected}, got {int(size)} (shape {tuple(shape)})")


def check_grid_tokens(layer, shape, axis, grid_size, num_prefix_tokens):
    """Raise a ValueError if `shape[axis]` is known and is not the prefix tokens plus the grid's."""
    height, width = grid_size
    check_axis(layer, shape, axis, f"the tokens axis ({num_prefix_tokens} prefix + the {height} x {width} grid)",
               num_prefix_tokens + height * width)


def check_positions(layer, inputs_shape, positions_shape):
    """Raise a ValueError unless `positions_shape` is (tokens, 2), tokens those of (..., tokens, dim) inputs."""
    check_rank(f"{layer} positions", positions_shape, "(tokens, 2)")
    check_axis(f"{layer} positions", positions_shape, 1, "the last axis, (row, column),", 2)
    if inputs_shape[-2] is not None:
        check_axis(f"{layer} positions", positions_shape, 0, "the number of positions, one per input token,", int(inputs_shape[-2]))
