"""performer-keras: Performer attention and relative positions as Keras 3 layers.

    import performer_keras as pk
    model = pk.create_model("favor-rope", image_shape=(32, 32, 3), size="small")

Importing the package loads no Keras (and so no TensorFlow): each public name
below is imported on first use (PEP 562), so the option tables and the registry
of names are free to read, and a command-line tool can reject a bad argument
before a backend starts. Loading a saved model needs the layer classes
registered: `keras.saving.load_model(path, custom_objects=pk.custom_objects())`,
or touch any layer name first.
"""

import importlib

# Public name -> the module that defines it.
_EXPORTS = {
    "CirculantString": "circulant_string",
    "ClassToken": "class_token",
    "ExpFeatures": "exp_features",
    "FavorFeatures": "favor_features",
    "KernelAttention": "kernel_attention",
    "PositionEmbedding": "position_embedding",
    "RandomFeatures": "random_features",
    "ReluFeatures": "relu_features",
    "RotaryEmbedding2D": "rotary_embedding_2d",
    "SmoothedSparseCrossentropy": "smoothed_sparse_crossentropy",
    "Standardize": "standardize",
    "StepDropout": "step_dropout",
    "ToeplitzBias2D": "toeplitz_bias_2d",
    "build_vit": "vit",
    "FeatureMap": "feature_map",
    "KERNELS": "registry",
    "POSITIONS": "registry",
    "Kernel": "registry",
    "register_kernel": "registry",
    "SIZES": "registry",
    "create_model": "registry",
    "list_variants": "registry",
    "parse_variant": "registry",
}
_SERIALIZABLE = tuple(name for name, module in _EXPORTS.items() if name[0].isupper() and module not in ("registry", "feature_map"))

__all__ = sorted((*_EXPORTS, "custom_objects"))


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'performer_keras' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"performer_keras.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__


def custom_objects():
    """{class name: class} of every layer and the loss; importing them registers them for `.keras` loading."""
    return {name: __getattr__(name) for name in _SERIALIZABLE}
