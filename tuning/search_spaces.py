"""What the tuner searches, per kernel, in one readable place (STYLE rule 8).

Every variant searches the optimizer's learning rate and weight decay; a
kernel also searches the options its `registry.Kernel.searched` names (from
`KERNEL_OPTIONS`): `favor` and `relu` their number of random features m, and
`favor` how often it redraws them. A variant never searches what it does not use: softmax,
exp and linformer have no random features, and relu with `--deterministic`
(phi(x) = ReLU(x), no projection) has none either. Regularisation (`ON_REQUEST`:
dropout, label smoothing) every variant may search, but only when asked: the
default search tunes the optimizer under the run's own regularisation.

Command, time and accuracy of the default search (the `small` size, Hyperband
over at most 10 epochs per trial on the bundled MNIST):

    python -m tuning favor-rope --dataset mnist

    30 trials, each trained from scratch: 12 of 2 epochs, 10 of 4 and 8 of
    10, 144 epochs in all. An epoch of the `small` model on the 55,000
    training images takes about 3 minutes on 2 CPU cores, so expect about 7
    hours (a GPU: about an hour or less); `--max-trials`, `--epochs` and
    `--limit` shorten it. Expected best validation accuracy:
    about 0.98 for every kernel (an estimate from the `small` profile, not yet
    measured by a full search). A smoke search of the `tiny` model:

    python -m tuning favor-rope --dataset mnist --size tiny --limit 300 \\
        --batch-size 150 --epochs 1 --algorithm random --max-trials 3

    takes under a minute and reaches about 0.1 (2 steps on 300 images).

Narrow or widen a space from the command line (repeatable) or a JSON file:

    --space learning_rate=3e-4:1e-3     a log-uniform range low:high
    --space num_features=32,64          a choice among values
    --space redraw_interval=0           one value: fixed, not searched
    --space dropout=0:0.3               a fraction's range low:high is uniform
    --space label_smoothing=0,0.1       adds a dimension of `ON_REQUEST`
    --space-file space.json             {"learning_rate": "3e-4:1e-3",
                                         "num_features": [32, 64]}

Keys are `RunConfig` field names, so a trial's hyperparameters are a
`RunConfig` and `best_hparams.json` feeds `train.py --hparams` as it is.
"""

import dataclasses
import json
import math

from performer_keras.options import check_fraction
from performer_keras.registry import KERNEL_TABLE


class SearchError(ValueError):
    """Bad input to a search (a space, an option, a results folder); one line for the user."""


# How a `Range` draws, and the key that names it in search.json.
SAMPLINGS = {"log": "log_uniform", "linear": "uniform"}


@dataclasses.dataclass(frozen=True)
class Range:
    """A float drawn from [low, high]: log-uniformly (a rate, a decay) or uniformly
    (`sampling="linear"`: a fraction, whose range may start at 0)."""

    low: float
    high: float
    sampling: str = "log"

    def declare(self, hp, name):
        return hp.Float(name, self.low, self.high, sampling=self.sampling)

    def to_json(self):
        return {SAMPLINGS[self.sampling]: [self.low, self.high]}

    def __str__(self):
        return f"{self.low:g}:{self.high:g} ({SAMPLINGS[self.sampling].replace('_', '-')})"


@dataclasses.dataclass(frozen=True)
class Choice:
    """One of `values`; a single value is fixed, not searched."""

    values: tuple

    def declare(self, hp, name):
        if len(self.values) == 1:
            return hp.Fixed(name, self.values[0])
        return hp.Choice(name, list(self.values))

    def to_json(self):
        return {"choice": list(self.values)}

    def __str__(self):
        return ",".join(f"{v:g}" for v in self.values) + (" (fixed)" if len(self.values) == 1 else "")


# === The spaces ===

OPTIMIZER = {
    "learning_rate": Range(1e-4, 3e-3),
    "weight_decay": Range(1e-3, 0.3),
}
# The kernel options a kernel may search (`registry.Kernel.searched`) and their ranges.
KERNEL_OPTIONS = {
    "num_features": Choice((16, 32, 64, 128, 256)),
    # Steps between redraws of the projection; 0 keeps the first draw.
    "redraw_interval": Choice((0, 100, 1000)),
}


# Searched only when a `--space` names them, by any variant; otherwise the run's own value holds.
ON_REQUEST = ("dropout", "label_smoothing")


def kernel_space(kernel):
    """The default space of `kernel`: the optimizer, plus the kernel options its table entry searches."""
    searched = KERNEL_TABLE[kernel].searched
    unranged = [name for name in searched if name not in KERNEL_OPTIONS]
    if unranged:  # a registered kernel may search any of its options; a KeyError named neither kernel nor table
        raise SearchError(f"kernel {kernel!r} searches {unranged}, which have no range in tuning.search_spaces.KERNEL_OPTIONS "
                         f"{tuple(KERNEL_OPTIONS)}; add one there")
    return {**OPTIMIZER, **{name: KERNEL_OPTIONS[name] for name in searched}}


def _is_fraction(value):
    """The rule of `options.check_fraction`, which the layers and `RunConfig` apply, as a test."""
    try:
        check_fraction("value", value)
    except ValueError:
        return False
    return True


# The type, the valid values and the sampling of a `low:high` range (None: no range) of every
# hyperparameter a space may hold.
VALUE_RULES = {
    # name              type   valid when          said as              low:high
    "learning_rate": (float, lambda v: v > 0, "> 0", "log"),
    "weight_decay": (float, lambda v: v >= 0, ">= 0", "log"),
    "num_features": (int, lambda v: v >= 1, ">= 1", None),
    "redraw_interval": (int, lambda v: v >= 0, ">= 0 (0 = never)", None),
    "dropout": (float, _is_fraction, "in [0, 1)", "linear"),
    "label_smoothing": (float, _is_fraction, "in [0, 1)", "linear"),
}


def default_space(config):
    """The space of `config`'s kernel (a `RunConfig`), less what its options switch off."""
    space = kernel_space(config.attention)
    if config.attention == "relu" and config.deterministic:
        space.pop("num_features")  # phi(x) = ReLU(x) has no random features
    return space


def space_for(config, overrides=None, strict=True):
    """`default_space(config)` with `overrides` ({name: dimension}) applied.

    A name of `ON_REQUEST` joins the space. With `strict`, an override of a
    hyperparameter the variant does not use is an error; otherwise (a sweep
    over several variants) it is skipped here.
    """
    space = default_space(config)
    for name, dimension in (overrides or {}).items():
        if name not in space and name not in ON_REQUEST:
            if strict:
                raise SearchError(
                    f"{config.variant} does not use {name}; its space holds {sorted(space)}"
                )
            continue
        space[name] = dimension
    return space


def declare(hp, space):
    """Declare every dimension of `space` on a KerasTuner `hp`; return {name: value}."""
    return {name: dimension.declare(hp, name) for name, dimension in space.items()}


def space_to_json(space):
    return {name: space[name].to_json() for name in sorted(space)}


def describe(space):
    """One line per hyperparameter, for `--show-space` and the summary."""
    return "\n".join(f"{name:16s} {space[name]}" for name in sorted(space))


# === Reading overrides ===


def parse_overrides(pairs=(), space_file=None):
    """{name: dimension} from `--space NAME=VALUES` pairs and a `--space-file` JSON.

    The command line wins over the file for the same name; a name given
    twice on the command line is an error.
    """
    overrides = {}
    if space_file is not None:
        try:
            with open(space_file) as f:
                loaded = json.load(f)
        except (OSError, ValueError) as error:
            raise SearchError(f"cannot read --space-file {space_file}: {error}") from None
        if not isinstance(loaded, dict):
            raise SearchError(f"--space-file {space_file} must hold a JSON object {{name: values}}")
        for name, value in loaded.items():
            overrides[name] = parse_dimension(name, value)
    given = set()
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep:
            raise SearchError(f"--space takes NAME=VALUES (e.g. num_features=32,64), got {pair!r}")
        name = name.strip()
        if name in given:  # which of the two the user meant is not ours to guess
            raise SearchError(f"--space gives {name} twice; give its values once (e.g. {name}=32,64)")
        given.add(name)
        overrides[name] = parse_dimension(name, text)
    return overrides


def parse_dimension(name, value):
    """A dimension from 'low:high', 'a,b,c', 'a', a JSON list, number, or `to_json` object."""
    if name not in VALUE_RULES:
        raise SearchError(f"Unknown hyperparameter {name!r}; expected one of {tuple(VALUE_RULES)}")
    kind, valid, said, sampling = VALUE_RULES[name]
    if isinstance(value, dict) and len(value) == 1 and set(value) <= set(SAMPLINGS.values()):
        (written,) = value
        if written != SAMPLINGS.get(sampling):
            takes = f"a {SAMPLINGS[sampling]} range" if sampling else "a list of values"
            raise SearchError(f"{name} takes {takes}, not {written}")
        value = value[written]
        if not (isinstance(value, list) and len(value) == 2):
            raise SearchError(f"{name}: {written} takes [low, high], got {value!r}")
        low, high = (_number(name, kind, v) for v in value)
        return _range(name, VALUE_RULES[name], low, high)
    if isinstance(value, dict) and len(value) == 1 and "choice" in value:
        value = value["choice"]
    if isinstance(value, str):
        if ":" in value:
            low, _, high = value.partition(":")
            return _range(name, VALUE_RULES[name], _number(name, kind, low), _number(name, kind, high))
        value = [v for v in value.split(",") if v.strip()] if value.strip() else []
    if not isinstance(value, list):
        value = [value]
    values = tuple(_number(name, kind, v) for v in value)
    if not values:
        raise SearchError(f"the space of {name} is empty; give at least one value")
    if len(set(values)) != len(values):
        raise SearchError(f"{name} repeats a value: {list(values)}")
    for v in values:
        if not valid(v):
            raise SearchError(f"{name} must be {said}, got {v!r}")
    return Choice(tuple(sorted(values)))


def _range(name, rules, low, high):
    _, valid, said, sampling = rules
    if sampling is None:
        raise SearchError(f"{name} takes a list of values (e.g. {name}=32,64), not a range")
    if sampling == "log" and not low > 0:
        raise SearchError(f"a log-uniform range of {name} needs 0 < low, got {low:g}:{high:g}")
    for v in (low, high):
        if not valid(v):
            raise SearchError(f"{name} must be {said}, got {v!r}")
    if not low < high:
        raise SearchError(f"the range of {name} is empty: {low:g}:{high:g} (need low < high)")
    return Range(low, high, sampling)


def _number(name, kind, value):
    if isinstance(value, bool):
        raise SearchError(f"{name} takes {kind.__name__} values, got {value!r}")
    try:
        if kind is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value) if not isinstance(value, str) else int(value.strip())
        number = float(value)
    except (TypeError, ValueError):
        raise SearchError(f"{name} takes {kind.__name__} values, got {value!r}") from None
    if not math.isfinite(number):  # 'inf' and JSON's Infinity pass every bound check, then train on an infinite rate
        raise SearchError(f"{name} takes finite values, got {value!r}")
    return number
