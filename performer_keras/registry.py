"""Variants are kernel x position x size, resolved in one place (STYLE rule 5)."""

from performer_keras.options import KERNELS, POSITIONS, check_choice
from performer_keras.vit import build_vit

# The twelve variants of the comparison use these kernels; exp and linformer are
# extra rows.
MAIN_KERNELS = ("softmax", "favor", "relu")

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
    attention, _, position = str(name).partition("-")
    check_choice("attention", attention, KERNELS)
    check_choice("position", position or None, POSITIONS)
    return attention, position


def list_variants(extra=False):
    """The twelve {softmax, favor, relu} x positions (plus exp and linformer rows if `extra`)."""
    kernels = KERNELS if extra else MAIN_KERNELS
    return [
        variant_name(k, p)
        for k in kernels
        for p in POSITIONS
        if not (k == "linformer" and p == "kerple")
    ]


def model_config(size="reference", **overrides):
    """The `build_vit` arguments of `size` (a row of `SIZES`) with `overrides`."""
    config = dict(SIZES[check_choice("size", size, tuple(SIZES))])
    config.update(overrides)
    return config


def create_model(name, image_shape=(28, 28, 1), num_classes=10, size="reference", **overrides):
    """Build variant `name` ('favor-rope') at `size`; keyword arguments override the table."""
    attention, position = parse_variant(name)
    return build_vit(image_shape, num_classes, attention=attention, position=position, **model_config(size, **overrides))
