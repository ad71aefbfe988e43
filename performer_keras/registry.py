"""Variants are kernel x position x size, resolved in one place (STYLE rule 5).

One table per choice, free of Keras so that the harness can read it without a
backend: `KERNEL_TABLE` (name -> `Kernel`), `POSITION_TABLE` (name ->
`Position`) and `SIZES`. Everything that lists kernels or positions (the
layer's dispatch, the variant names, the analytic FLOP count, the tuner's
search spaces, the report's rows and plot styles) is derived from them, so a
new linear kernel is one `FeatureMap` file plus one `register_kernel` call
(README, "Adding a kernel").
"""

import dataclasses
import importlib
import inspect

from performer_keras.options import ROTATION_ORDERS, check_bool, check_choice


@dataclasses.dataclass(frozen=True)
class Kernel:
    """An attention kernel: what the layer, the FLOP count, the tuner and the figures need to know.

    Attributes:
        features: the `FeatureMap` class of a linear kernel, or "module:Class"
            of one in this package (imported on first use); None for the
            quadratic kernels that `KernelAttention` computes itself.
        options: `KernelAttention` arguments passed on to the feature map.
        random: phi projects onto `num_features` random directions; the FLOP
            count includes the projection and m = num_features (else m = d).
        searched: kernel options the tuner searches (`tuning/search_spaces.py`).
        rotation_order: default order of a rotation and the feature map
            ("before": rotate q, k; "after": rotate phi(q), phi(k)).
        main: a row of the comparison's main table.
        colour: its colour in every figure.
        pairwise: weighs token pairs (i, j), so a relative bias on their
            offsets applies; False for linformer, which mixes the sequence.
    """

    features: object = None
    options: tuple = ()
    random: bool = False
    searched: tuple = ()
    rotation_order: str = "before"
    main: bool = False
    colour: str = "black"
    pairwise: bool = True

    def __post_init__(self):
        for flag in ("random", "main", "pairwise"):
            check_bool(flag, getattr(self, flag))
        for names in ("options", "searched"):
            value = getattr(self, names)
            # A bare string would be read letter by letter ("'KernelAttention' object has no attribute 'n'").
            if not isinstance(value, tuple) or not all(isinstance(name, str) for name in value):
                raise ValueError(f"Kernel {names} must be a tuple of option names, got {value!r}")
        if self.features is None and (self.options or self.random):
            raise ValueError("Kernel options and random=True describe a feature map: give features= too")
        if not set(self.searched) <= set(self.options):
            raise ValueError(f"Kernel searched={self.searched} must be among its options={self.options}: "
                             "the tuner searches what the feature map takes")
        check_choice("rotation_order", self.rotation_order, ROTATION_ORDERS)

    @property
    def linear(self):
        """O(N) through a feature map, never an N x N matrix."""
        return self.features is not None


@dataclasses.dataclass(frozen=True)
class Position:
    """A position encoding of the patch grid.

    Attributes:
        kind: "embedding" (only the ViT's learned absolute embedding),
            "rotation" (rotates q and k, or their features) or "bias" (a
            relative bias indexed by the grid's offsets).
        layer: "module:Class" of its layer in this package, or None.
        options: (layer argument, `KernelAttention` attribute) pairs.
        normalize_qk: the default of `KernelAttention(normalize_qk=None)`.
        marker: its marker in every figure.
    """

    kind: str
    layer: str = None
    options: tuple = ()
    normalize_qk: bool = False
    marker: str = "x"


_RANDOM = ("num_features", "orthogonal", "redraw_interval", "seed")

KERNEL_TABLE = {
    "softmax": Kernel(main=True, colour="tab:blue"),
    "favor": Kernel("favor_features:FavorFeatures", (*_RANDOM, "stabilizer"), random=True,
                    searched=("num_features", "redraw_interval"), main=True, colour="tab:orange"),
    # ReLU features are not a kernel of q^T k, so RoFormer (sec. 3.4.2) rotates the
    # features instead and keeps the normaliser unrotated.
    "relu": Kernel("relu_features:ReluFeatures", (*_RANDOM, "deterministic"), random=True,
                   searched=("num_features",), rotation_order="after", main=True, colour="tab:green"),
    "exp": Kernel("exp_features:ExpFeatures", colour="tab:red"),
    "linformer": Kernel(colour="tab:purple", pairwise=False),
}

# The norm of normalised q and k, in units of sqrt(d). Luo et al.'s 1.0 puts FAVOR+ in its
# high-variance range (|q'|^2 = sqrt(d) after the d^-1/4 scaling): its relative error
# against softmax-kerple stays 0.95 at m = 1,024 (d = 32). At 0.25 it is 0.10 at m = 64
# and falls as 1/sqrt(m), the rate of a Monte Carlo mean (profiles.favor_estimator,
# profiles/results/cpu-epyc-2core/tensorflow/favor_estimator.json); softmax and linear
# kernels share it so that a kerple row differs from its softmax row by the kernel only.
DEFAULT_QK_NORM = 0.25
# A layer config or run record saved before the norm was an option was computed with
# Luo et al.'s, so it reads as this.
QK_NORM_BEFORE_OPTION = 1.0

POSITION_TABLE = {
    "absolute": Position("embedding", marker="o"),
    "rope": Position("rotation", "rotary_embedding_2d:RotaryEmbedding2D", (("mixed", "rope_mixed"),), marker="s"),
    "string": Position("rotation", "circulant_string:CirculantString", marker="^"),
    # Luo et al. normalise q and k for stability; the other positions do not.
    "kerple": Position("bias", "toeplitz_bias_2d:ToeplitzBias2D", normalize_qk=True, marker="D"),
}

# Live views: a kernel registered later is a valid choice everywhere at once.
KERNELS = KERNEL_TABLE.keys()
POSITIONS = POSITION_TABLE.keys()


def main_kernels():
    """The kernels of the comparison's main table (softmax, favor, relu)."""
    return tuple(name for name, kernel in KERNEL_TABLE.items() if kernel.main)


def linear_kernels():
    """The kernels computed through a feature map in O(N)."""
    return tuple(name for name, kernel in KERNEL_TABLE.items() if kernel.linear)


def positions_of(kind):
    """The positions of `kind` ("embedding", "rotation" or "bias")."""
    return tuple(name for name, position in POSITION_TABLE.items() if position.kind == kind)


def register_kernel(name, kernel):
    """Add a kernel to `KERNEL_TABLE`: from then on `f"{name}-rope"` is a variant like any other.

    Args:
        name: the kernel's short name (letters, digits and "_"; not taken).
        kernel: a `Kernel`, for a linear kernel with `features=` its
            `FeatureMap` subclass.
    """
    # The name becomes part of model, layer and folder names ("vit_elu_rope", runs/mnist/elu-rope).
    if not isinstance(name, str) or not (name.isascii() and name.isidentifier()):
        raise ValueError(f"a kernel name is letters, digits and '_' (without '-', which joins it to a position), got {name!r}")
    if name in KERNEL_TABLE:
        raise ValueError(f"kernel {name!r} exists; expected a new name, not one of {tuple(KERNELS)}")
    if not isinstance(kernel, Kernel):
        raise ValueError(f"register_kernel takes a Kernel, got {type(kernel).__name__}")
    if kernel.linear:
        feature_map(name, kernel)
    KERNEL_TABLE[name] = kernel


def feature_map(name, kernel):
    """The `FeatureMap` subclass of linear kernel `name`, checked: each of its options is an argument of it and of
    `KernelAttention`, which passes the layer's value on. Imports Keras."""
    from performer_keras.feature_map import FeatureMap
    from performer_keras.kernel_attention import KernelAttention

    try:
        features = resolve(kernel.features)
    except (ImportError, AttributeError):
        raise ValueError(f"kernel {name!r}: features {kernel.features!r} names no class of performer_keras") from None
    if not (isinstance(features, type) and issubclass(features, FeatureMap)):
        raise ValueError(f"kernel {name!r}: features must be a FeatureMap subclass, got {features!r}")
    for owner in (features, KernelAttention):
        unknown = [option for option in kernel.options if option not in inspect.signature(owner.__init__).parameters]
        if unknown:
            raise ValueError(f"kernel {name!r}: options {unknown} are not arguments of {owner.__name__}")
    return features


def resolve(reference):
    """The class a table entry names: a class as it is, "module:Class" imported from this package."""
    if not isinstance(reference, str):
        return reference
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(f"performer_keras.{module}"), name)


SIZES = {
    # A few seconds per epoch on subsampled data: tests and smoke runs.
    "tiny": dict(patch_size=7, width=16, depth=1, heads=2, mlp_dim=32),
    # Minutes per run on a 2-core CPU: the `small` benchmark profile.
    "small": dict(patch_size=4, width=64, depth=2, heads=4, mlp_dim=128),
    # The reference recipe (a GPU run).
    "reference": dict(patch_size=4, width=256, depth=6, heads=8, mlp_dim=512),
}


def variant_name(attention, position):
    return f"{attention}-{position}"


def parse_variant(name):
    """'favor-rope' -> ('favor', 'rope'), each part checked."""
    attention, dash, position = str(name).partition("-")
    if not dash:
        raise ValueError(f"variant {name!r} must be <kernel>-<position> such as 'favor-rope'; kernels {tuple(KERNELS)}, "
                         f"positions {tuple(POSITIONS)}")
    check_choice("attention", attention, KERNELS)
    check_choice("position", position, POSITIONS)
    return attention, position


def list_variants(extra=False):
    """The twelve main kernels x positions (plus every other kernel's rows if `extra`)."""
    kernels = KERNELS if extra else main_kernels()
    return [variant_name(k, p) for k in kernels for p in POSITIONS if compatible(k, p)]


def normalizes_qk(position, normalize_qk=None):
    """Whether attention l2-normalises q and k: `normalize_qk`, or the position's default when None."""
    return POSITION_TABLE[position].normalize_qk if normalize_qk is None else check_bool("normalize_qk", normalize_qk)


def compatible(kernel, position):
    """Whether the pair exists: a kernel that mixes the sequence (linformer) has no token pairs to bias."""
    return KERNEL_TABLE[kernel].pairwise or POSITION_TABLE[position].kind != "bias"


# The `KernelAttention` options that only some variants read (the others ignore them).
SELECTIVE_OPTIONS = ("num_features", "orthogonal", "redraw_interval", "deterministic", "rotation_order", "rope_mixed",
                     "qk_norm", "learn_qk_norm", "linformer_dim", "stabilizer")


def ignored_options(kernel, position, normalize_qk=None, deterministic=False):
    """{option: which variants read it} for the `SELECTIVE_OPTIONS` that variant (kernel, position) ignores.

    Setting one of them changes nothing in that variant's model, so a command
    line that sets one for it asks for something it will not get.
    `normalize_qk` and `deterministic` are the variant's own settings.
    """
    spec, place = KERNEL_TABLE[kernel], POSITION_TABLE[position]
    read = {*spec.options, *(attribute for _, attribute in place.options)}
    if deterministic and "deterministic" in spec.options:
        read -= set(_RANDOM)  # phi(x) = f(x): no projection to size, orthogonalise or redraw
    if place.kind == "rotation" and spec.linear:
        read.add("rotation_order")  # softmax has no feature map to rotate after
    if normalizes_qk(position, normalize_qk):
        read.update(("qk_norm", "learn_qk_norm"))
    if not spec.pairwise:
        read.add("linformer_dim")
    return {option: _readers(option) for option in SELECTIVE_OPTIONS if option not in read}


def _readers(option):
    """Which variants read `option` of `SELECTIVE_OPTIONS`, in words."""
    if option == "rotation_order":
        return f"a linear kernel ({', '.join(linear_kernels())}) with a rotation ({', '.join(positions_of('rotation'))})"
    if option in ("qk_norm", "learn_qk_norm"):
        return "normalised q and k (normalize_qk, on by default for kerple)"
    if option == "linformer_dim":
        return ", ".join(name for name, kernel in KERNEL_TABLE.items() if not kernel.pairwise)
    kernels = [name + (" without deterministic" if option in _RANDOM and "deterministic" in kernel.options else "")
               for name, kernel in KERNEL_TABLE.items() if option in kernel.options]
    return ", ".join(kernels + [name for name, place in POSITION_TABLE.items() if option in dict(place.options).values()])


def model_config(size="reference", **overrides):
    """The `build_vit` arguments of `size` (a row of `SIZES`) with `overrides`; ValueError if the heads do not
    divide the width."""
    config = dict(SIZES[check_choice("size", size, tuple(SIZES))])
    config.update(overrides)
    if config["width"] % config["heads"]:
        raise ValueError(f"width {config['width']} is not divisible by heads {config['heads']}")
    return config


def create_model(name, image_shape=(28, 28, 1), num_classes=10, size="reference", **overrides):
    """Build variant `name` ('favor-rope') at `size`; keyword arguments override the table."""
    # Imported here so that the tables above are readable without loading Keras.
    from performer_keras.vit import build_vit

    attention, position = parse_variant(name)
    return build_vit(image_shape, num_classes, attention=attention, position=position, **model_config(size, **overrides))
