"""Every setting of a training run, in one readable place (STYLE rule 8)."""

import dataclasses
import json

from experiments import atomic
from performer_keras.options import (DEFAULT_STABILIZER, ROTATION_ORDERS, STABILIZER_BEFORE_OPTION, STABILIZERS,
                                     check_bool, check_choice, check_finite, check_fraction, check_non_negative, check_positive, check_seed)
from performer_keras.registry import (DEFAULT_QK_NORM, QK_NORM_BEFORE_OPTION, SIZES, ignored_options, list_variants,
                                      model_config, normalizes_qk, parse_variant)

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
AUGMENTATIONS = ("none", "rotate", "rotate_shift", "crop_flip")
# Fields added after runs were committed, with the value a run folder without them had.
LATER_FIELDS = {"limit_test": True, "init_from_partial": False, "augment": None, "qk_norm": QK_NORM_BEFORE_OPTION,
                "learn_qk_norm": False, "jit_compile": None, "dropout": 0.0, "label_smoothing": 0.0, "stabilizer": STABILIZER_BEFORE_OPTION}
# Fields that say how a run's steps execute, not what they compute: XLA changes float
# rounding (and which random numbers a feature redraw gets, from the same distribution),
# so runs that differ only here stay comparable in one cell. They still belong to the
# run's identity: a run resumes only with its own setting.
EXECUTION_FIELDS = ("jit_compile",)


class RunError(ValueError):
    """A user error: bad argument, unreadable file, an output folder of another run."""


@dataclasses.dataclass
class RunConfig:
    """A training run. `python train.py` with no argument runs these defaults.

    The model size comes from `size` (a row of `registry.SIZES`); `width`,
    `depth`, `heads`, `mlp_dim` and `patch_size` override single entries.
    Kernel options are passed to every attention layer.
    """

    variant: str = "softmax-absolute"
    dataset: str = "mnist"
    epochs: int = 10
    batch_size: int = 128
    learning_rate: float = 1e-3
    weight_decay: float = 0.05
    warmup_epochs: float = 1.0
    dropout: float = 0.0
    label_smoothing: float = 0.0
    seed: int = 42
    size: str = "small"
    width: int | None = None
    depth: int | None = None
    heads: int | None = None
    mlp_dim: int | None = None
    patch_size: int | None = None
    absolute_position: bool = True
    num_features: int = 64
    orthogonal: bool = True
    redraw_interval: int = 0
    deterministic: bool = False
    rotation_order: str | None = None
    rope_mixed: bool = False
    normalize_qk: bool | None = None
    qk_norm: float = DEFAULT_QK_NORM
    learn_qk_norm: bool = True
    linformer_dim: int = 32
    stabilizer: str = DEFAULT_STABILIZER
    limit: int | None = None
    limit_test: bool = True
    precision: str = "float32"
    jit_compile: bool | None = None
    init_from: str | None = None
    init_from_partial: bool = False
    augment: str | None = None

    def __post_init__(self):
        try:
            parse_variant(self.variant)
            # An empty name would read the current folder as a folder of images.
            if not isinstance(self.dataset, str) or not self.dataset.strip():
                raise ValueError(f"dataset must be a name or path, got {self.dataset!r}")
            check_choice("size", self.size, tuple(SIZES))
            check_choice("precision", self.precision, PRECISIONS)
            if self.augment is not None:
                check_choice("augment", self.augment, AUGMENTATIONS)
            if self.rotation_order is not None:
                check_choice("rotation_order", self.rotation_order, ROTATION_ORDERS)
            check_choice("stabilizer", self.stabilizer, STABILIZERS)
            for name in ("epochs", "batch_size", "num_features", "linformer_dim"):
                check_positive(name, getattr(self, name))
            for name in ("width", "depth", "heads", "mlp_dim", "patch_size", "limit"):
                if getattr(self, name) is not None:
                    check_positive(name, getattr(self, name))
            check_finite("learning_rate", self.learning_rate, low=0.0, low_open=True)
            check_finite("weight_decay", self.weight_decay, low=0.0)
            check_finite("warmup_epochs", self.warmup_epochs, low=0.0)
            check_fraction("dropout", self.dropout)
            check_fraction("label_smoothing", self.label_smoothing)
            check_finite("qk_norm", self.qk_norm, low=0.0, low_open=True)
            check_non_negative("redraw_interval", self.redraw_interval)
            check_seed("seed", self.seed)
            for name in ("jit_compile", "normalize_qk"):
                check_bool(name, getattr(self, name), allow_none=True)
            for name in ("absolute_position", "orthogonal", "deterministic", "rope_mixed", "limit_test", "init_from_partial",
                         "learn_qk_norm"):
                check_bool(name, getattr(self, name))
            if self.variant not in list_variants(extra=True):
                raise ValueError(f"variant {self.variant!r} does not exist; expected one of {list_variants(extra=True)}")
            model_config(**self.model_overrides())
        except (ValueError, TypeError) as error:
            raise RunError(str(error)) from None

    def check_data(self, image_shape, train_examples):
        """Raise RunError if the run cannot train on images of `image_shape` with `train_examples` examples."""
        patch = model_config(**self.model_overrides())["patch_size"]
        height, width = image_shape[:2]
        if height % patch or width % patch:
            raise RunError(f"patch_size {patch} does not divide the {height}x{width} images of {self.dataset}")
        if self.batch_size > train_examples:
            raise RunError(f"batch_size {self.batch_size} exceeds the {train_examples} training examples of {self.dataset}")

    def ignored(self, names):
        """{name: which variants read it} for the fields `names` that this run's variant ignores."""
        ignored = ignored_options(self.attention, self.position, self.normalize_qk, self.deterministic)
        return {name: ignored[name] for name in names if name in ignored}

    @property
    def attention(self):
        return parse_variant(self.variant)[0]

    @property
    def position(self):
        return parse_variant(self.variant)[1]

    def model_overrides(self):
        """Keyword arguments of `create_model` beyond the variant name."""
        sizes = {k: getattr(self, k) for k in ("width", "depth", "heads", "mlp_dim", "patch_size", "dropout")}
        kernel = {
            k: getattr(self, k)
            for k in (
                "absolute_position", "num_features", "orthogonal", "redraw_interval", "deterministic",
                "rotation_order", "rope_mixed", "normalize_qk", "qk_norm", "learn_qk_norm", "linformer_dim", "stabilizer",
            )
        }
        return dict(size=self.size, **{k: v for k, v in sizes.items() if v is not None}, **kernel)

    @property
    def normalizes_qk(self):
        """Whether the attention l2-normalises q and k (the position's default unless `normalize_qk` says)."""
        return normalizes_qk(self.position, self.normalize_qk)

    def to_dict(self):
        """Every field; those of `LATER_FIELDS` only when not their default, so run folders
        written before they existed still match, and `qk_norm` and `learn_qk_norm` only
        where q and k are normalised (elsewhere they change nothing, so their defaults
        may change)."""
        values = dataclasses.asdict(self)
        for name, default in LATER_FIELDS.items():
            if values[name] == default:
                del values[name]
        if not self.normalizes_qk:
            values.pop("qk_norm", None)
            values.pop("learn_qk_norm", None)
        return values

    @classmethod
    def fields(cls):
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_recorded(cls, values):
        """The run a `to_dict` record describes (a run folder's config.json, a tuner's hyperparameters).

        A `LATER_FIELDS` field it lacks was either not there yet or left out at
        that value: both mean the value of `LATER_FIELDS`, which for some fields
        is not today's default (the stabiliser, Luo et al.'s q/k norm). Where q
        and k are not normalised their norm options were left out as unread and
        keep today's defaults, so that `from_recorded(c.to_dict()) == c`.
        """
        config = cls(**{**LATER_FIELDS, **values})
        if config.normalizes_qk:
            return config
        unread = ("qk_norm", "learn_qk_norm")
        return dataclasses.replace(config, **{name: values.get(name, getattr(cls, name)) for name in unread})

    @classmethod
    def from_args(cls, args, strict=True):
        """The run an `experiments.cli.RUN_OPTIONS` command line describes: defaults < --hparams < flags.

        `--attention`/`--position` are an alternative to `--variant`; a missing
        one defaults to softmax or absolute. `--limit all` lifts a limit that the
        --hparams file sets. If `strict`, a flag that the variant ignores
        (`--num-features` for softmax, `--qk-norm` without normalised q and k)
        is a RunError rather than a silent no-op, as `--init-from-partial`
        without `--init-from` always is; a --hparams file may hold any field (a
        tuner's holds them all).
        """
        variant, attention, position = (getattr(args, name, None) for name in ("variant", "attention", "position"))
        if attention or position:
            if variant:
                raise RunError("give either --variant or --attention/--position, not both")
            variant = f"{attention or 'softmax'}-{position or 'absolute'}"
        explicit = {name: getattr(args, name, None) for name in cls.fields() if name != "variant"}
        lift_limit = explicit.get("limit") == "all"
        if lift_limit:
            explicit["limit"] = None
        config = cls.from_sources(getattr(args, "hparams", None), variant=variant, **explicit)
        ignored = config.ignored(cls.given(args)) if strict else {}
        if ignored:
            name, readers = next(iter(ignored.items()))
            raise RunError(f"--{name.replace('_', '-')} changes nothing in {config.variant}; it applies to {readers}")
        if getattr(args, "init_from_partial", None) and config.init_from is None:
            raise RunError("--init-from-partial changes nothing without --init-from (a checkpoint to start from)")
        # from_sources reads None as "not given", so lifting a file's limit comes after it.
        return dataclasses.replace(config, limit=None) if lift_limit else config

    @classmethod
    def given(cls, args):
        """The fields that a parsed command line sets (argparse leaves the others None)."""
        return [name for name in cls.fields() if getattr(args, name, None) is not None]

    @classmethod
    def from_sources(cls, hparams_file=None, **explicit):
        """Defaults < the `hparams_file` JSON < explicit (non-None) keyword arguments.

        The JSON is either a flat mapping of field names or the tuner's
        `best_hparams.json` ({"hyperparameters": {...}, ...}).
        """
        values = {}
        if hparams_file is not None:
            values.update(read_hparams(hparams_file, "--hparams file")[0])
        values.update({k: v for k, v in explicit.items() if v is not None})
        return cls(**values)


def read_recorded(path):
    """The RunConfig that the config.json at `path` records; RunError (a ValueError) in one line naming the file
    where it is no JSON object, lacks a field `to_dict` always writes, or holds a key or a value no run has.

    A run writes its config.json atomically, but a hand edit or a damaged disk does not: the pilots' summary read
    such a file's keys as the run's settings, and an empty object would be a run of today's defaults.
    """
    try:
        recorded = atomic.read_json_object(path)
    except (OSError, ValueError) as error:
        raise RunError(str(error)) from None
    return check_recorded(recorded, path)


def check_recorded(recorded, where):
    """The RunConfig of `recorded` (what `to_dict` wrote), or a RunError naming `where` (`read_recorded`)."""
    if not isinstance(recorded, dict):
        raise RunError(f"{where} describes no run (a JSON {type(recorded).__name__}, not an object)")
    always = set(RunConfig.fields()) - set(LATER_FIELDS)
    missing, unknown = sorted(always - set(recorded)), sorted(set(recorded) - set(RunConfig.fields()))
    problems = ([f"lacks {missing}"] if missing else []) + ([f"unknown keys {unknown}"] if unknown else [])
    if problems:
        raise RunError(f"{where} describes no run ({'; '.join(problems)})")
    try:
        return RunConfig.from_recorded(recorded)
    except RunError as error:
        raise RunError(f"{where} describes no run ({error})") from None


def check_keep_epochs(keep_epochs, epochs, whose="the run"):
    """RunError where `keep_epochs` (`--keep-epochs`) names an epoch that `whose` `epochs` epochs never reach."""
    past = sorted(epoch for epoch in set(keep_epochs) if epoch > epochs)
    if past:
        raise RunError(f"--keep-epochs {' '.join(map(str, past))}: {whose} has {epochs} epoch{'s' * (epochs != 1)}")


def read_hparams(path, what="hyperparameters file"):
    """(hyperparameters, searched) of a JSON of `RunConfig` fields; RunError (one line) if it is not one.

    The file is either a flat object of field names or the tuner's
    best_hparams.json, which holds the winning RunConfig under
    "hyperparameters" and the names the search varied under "searched".
    `searched` is that list, or every key of a flat file. The tuner's RunConfig
    comes back whole, as `RunConfig.from_recorded` reads it.
    """
    try:
        with open(path) as f:
            loaded = json.load(f)
    except (OSError, ValueError) as error:
        raise RunError(f"cannot read {what} {path}: {error}") from None
    hparams = loaded.get("hyperparameters", loaded) if isinstance(loaded, dict) else loaded
    if not isinstance(hparams, dict):
        raise RunError(f"{what} {path} must hold a JSON object of hyperparameters")
    searched = loaded.get("searched", list(hparams))
    unknown = sorted((set(hparams) | set(searched)) - set(RunConfig.fields()))
    if unknown:
        raise RunError(f"{what} {path} has unknown keys {unknown}; expected some of {RunConfig.fields()}")
    if hparams is not loaded:
        # The tuner's file holds its trial's RunConfig as `to_dict` wrote it, so what it leaves out is not a default.
        hparams = dataclasses.asdict(RunConfig.from_recorded(hparams))
    return hparams, searched
