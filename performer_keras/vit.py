"""The functional Vision Transformer, top to bottom as in the paper's figure."""

import keras

from performer_keras.class_token import ClassToken
from performer_keras.kernel_attention import KernelAttention
from performer_keras.options import check_bool, check_fraction, check_integer_at_least, check_positive
from performer_keras.position_embedding import PositionEmbedding
from performer_keras.standardize import Standardize
from performer_keras.step_dropout import StepDropout


# The `KernelAttention` arguments that `build_vit` derives, and from what.
_DERIVED_OPTIONS = {"num_heads": "heads", "kernel_name": "attention", "kernel": "attention",
                    "grid_size": "image_shape and patch_size", "num_prefix_tokens": "the one class token"}


def build_vit(
    image_shape,
    num_classes,
    attention="softmax",
    position="absolute",
    patch_size=4,
    width=256,
    depth=6,
    heads=8,
    mlp_dim=512,
    absolute_position=True,
    dropout=0.0,
    mean=None,
    std=None,
    name=None,
    **kernel_options,
):
    """A pre-LayerNorm ViT (Dosovitskiy et al., arXiv:2010.11929) with `KernelAttention`.

    Input: images (batch, H, W, C) as float pixel values in [0, 255]; the
    model normalises them itself with the training split's per-channel `mean`
    and `std` (pixel units), so a saved or exported model takes raw pixels.
    Output: class probabilities (batch, num_classes), float32.

    Args:
        image_shape: (H, W, C); H and W must divide by `patch_size`.
        attention, position: the kernel and position encoding of every block
            (see `KernelAttention`).
        patch_size, width, depth, heads, mlp_dim: the architecture; defaults
            are the reference recipe.
        absolute_position: add the learned absolute embedding (kept in every
            variant unless switched off).
        dropout: rate of `StepDropout` on the embedded tokens, each block's
            attention output, MLP hidden units and MLP output (ViT's places).
            0 (the default) adds no layer, so the model is the one without.
        mean, std: per-channel normalisation statistics (None: 0 and 255).
        **kernel_options: passed to every `KernelAttention` (num_features,
            redraw_interval, rotation_order, ...).
    """
    try:
        height, img_width, channels = (check_positive("image_shape", side) for side in image_shape)
    except (TypeError, ValueError):
        raise ValueError(f"image_shape must be (height, width, channels), three integers >= 1, got {image_shape!r}") from None
    # Given again, Python's "got multiple values for argument" named neither the ViT's own argument nor why;
    # `kernel`, the old name of kernel_name, would have replaced `attention` with a DeprecationWarning.
    derived = [f"{option} (from {source})" for option, source in _DERIVED_OPTIONS.items() if option in kernel_options]
    if derived:
        raise ValueError(f"build_vit sets {', '.join(derived)} of every KernelAttention itself; leave it out of the kernel options")
    for argument, value in dict(patch_size=patch_size, width=width, depth=depth, mlp_dim=mlp_dim).items():
        check_positive(argument, value)
    check_fraction("dropout", dropout)  # here, or StepDropout's error would name its own argument, "rate"
    # A softmax over one class is 1 whatever the image: nothing to learn. One bound for 0 and 1 alike, so
    # a user who corrects 0 to 1 is not refused a second time with another bound.
    check_integer_at_least("num_classes", num_classes, 2)
    if height % patch_size or img_width % patch_size:
        raise ValueError(f"image size {height}x{img_width} is not divisible by patch_size={patch_size}")
    grid = (height // patch_size, img_width // patch_size)
    mean = [0.0] * channels if mean is None else mean
    std = [255.0] * channels if std is None else std

    # === Layers and functional model ===
    images = keras.Input(shape=tuple(image_shape), name="images")
    x = Standardize(mean, std, name="normalize")(images)
    x = keras.layers.Conv2D(width, patch_size, strides=patch_size, name="patch_embedding")(x)
    x = keras.layers.Reshape((grid[0] * grid[1], width), name="patches")(x)  # (batch, P, width)
    x = ClassToken(name="class_token")(x)  # (batch, 1 + P, width)
    if check_bool("absolute_position", absolute_position):
        x = PositionEmbedding(name="position_embedding")(x)

    def dropped(tensor, name):
        return StepDropout(dropout, name=f"{name}_dropout")(tensor) if dropout else tensor

    x = dropped(x, "embedding")
    for i in range(depth):
        y = keras.layers.LayerNormalization(epsilon=1e-6, name=f"block_{i}_attention_norm")(x)
        y = KernelAttention(
            heads, attention, position, grid_size=grid, num_prefix_tokens=1,
            name=f"block_{i}_attention", **kernel_options,
        )(y)
        x = keras.layers.Add(name=f"block_{i}_attention_residual")([x, dropped(y, f"block_{i}_attention")])
        y = keras.layers.LayerNormalization(epsilon=1e-6, name=f"block_{i}_mlp_norm")(x)
        y = keras.layers.Dense(mlp_dim, activation="gelu", name=f"block_{i}_mlp_hidden")(y)
        y = keras.layers.Dense(width, name=f"block_{i}_mlp_output")(dropped(y, f"block_{i}_mlp_hidden"))
        x = keras.layers.Add(name=f"block_{i}_mlp_residual")([x, dropped(y, f"block_{i}_mlp_output")])
    x = keras.layers.LayerNormalization(epsilon=1e-6, name="final_norm")(x)
    cls = x[:, 0]  # (batch, width): the CLS token
    probabilities = keras.layers.Dense(num_classes, activation="softmax", dtype="float32", name="head")(cls)
    return keras.Model(images, probabilities, name=name or f"vit_{attention}_{position}")
