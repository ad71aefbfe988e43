"""A trained model to evaluate, whether a `.keras` file or a SavedModel, behind one interface."""

import dataclasses
import math
import zipfile
from collections.abc import Callable
from pathlib import Path

import keras
import numpy as np

import performer_keras
from experiments.cli import import_quietly
from experiments.compiled import compiled_predict
from experiments.flops import count_flops, count_saved_model_flops
from performer_keras.kernel_attention import KernelAttention


class EvaluationError(ValueError):
    """Bad input to `evaluation.evaluate` (a missing path, not a model, a mismatched dataset).

    The message is one line, so scripts print it instead of a traceback.
    """

    def __init__(self, message):
        super().__init__(" ".join(str(message).split()))


@dataclasses.dataclass
class LoadedModel:
    """What `evaluate` needs of a model, whether Keras or SavedModel.

    `predict` maps a batch (batch, H, W, C) of `dtype` pixels to class
    probabilities; `flops` counts one image's forward pass when called (None
    where the graph cannot be counted).
    attention and position come from the model's `KernelAttention` layers
    when it has them (None for a SavedModel).
    """

    predict: Callable
    dtype: str
    image_shape: tuple
    num_classes: int | None
    params: int | None
    flops: Callable[[], int | None]
    backend: str
    attention: str | None = None
    position: str | None = None


def load_model_only(path):
    """The Keras model of a `.keras` file without its optimizer, for every use but training on.

    A mixed_float16 run's loss-scale optimizer does not load back (Keras warns
    that it skips its variables), and nothing but training needs one. A file that is no zip archive (cut
    short, emptied, another format) is a ValueError saying so: Keras calls it "File not found".
    """
    if Path(path).is_file() and not zipfile.is_zipfile(path):
        raise ValueError(f"{path} is no .keras file (not a zip archive: damaged, or another format)")
    return keras.models.load_model(path, custom_objects=performer_keras.custom_objects(), compile=False)


def load_keras_model(path):
    """A `.keras` file as a `LoadedModel`, predicting through a compiled call."""
    try:
        model = load_model_only(path)
    except (ValueError, OSError) as err:
        raise EvaluationError(f"Could not load {path} as a Keras model: {first_line(err)}") from None
    attention = next((layer for layer in model.layers if isinstance(layer, KernelAttention)), None)
    return LoadedModel(
        predict=compiled_predict(model),
        dtype=model.inputs[0].dtype,
        image_shape=tuple(model.inputs[0].shape[1:]),
        num_classes=model.outputs[0].shape[-1],
        params=sum(math.prod(weight.shape) for weight in model.trainable_weights),
        flops=lambda: count_flops(model, batch_size=1),
        backend=keras.backend.backend(),
        attention=None if attention is None else attention.kernel_name,
        position=None if attention is None else attention.position,
    )


def load_saved_model(path, endpoint="serve"):
    """A SavedModel folder as a `LoadedModel`, predicting through `endpoint`.

    Trainable parameters are those the export tracked (`keras.export`
    records them); None if the SavedModel does not list any.
    """
    from experiments.export import tensorflow_missing

    missing = tensorflow_missing(f"reading the SavedModel {path}")
    if missing:
        raise EvaluationError(missing)
    tf = import_quietly("tensorflow")
    try:
        loaded = tf.saved_model.load(str(path))
    except (ValueError, OSError) as err:  # a damaged saved_model.pb or variables/
        raise EvaluationError(f"Could not load {path} as a SavedModel: {first_line(err)}") from None
    if not hasattr(loaded, endpoint):
        raise EvaluationError(f"SavedModel {path} has no {endpoint!r} endpoint")
    function = getattr(loaded, endpoint).concrete_functions[0]
    spec = function.structured_input_signature[0][0]
    variables = getattr(loaded, "trainable_variables", None)

    def predict(images):
        # Call through `loaded`: the endpoint alone does not keep the restored
        # variables alive, and TF fails once they are garbage-collected.
        return getattr(loaded, endpoint)(tf.convert_to_tensor(images))

    return LoadedModel(
        predict=predict,
        dtype=spec.dtype.name,
        image_shape=tuple(spec.shape[1:]),
        num_classes=_last_dim(function.structured_outputs),
        params=sum(math.prod(v.shape) for v in variables) if variables else None,
        flops=lambda: count_saved_model_flops(path, tuple(spec.shape[1:]), endpoint=endpoint),
        backend="tensorflow",
    )


def predict_all(model, images, batch_size):
    """float32 probabilities (n, classes) of `model` on uint8 `images`, in batches.

    Pixels are cast to the model's input dtype unchanged (float32 in [0, 255]
    for the Keras model, as `pipelines.eval_batches` yields them).
    """
    return np.concatenate([
        np.asarray(model.predict(images[start:start + batch_size].astype(model.dtype)), np.float32)
        for start in range(0, len(images), batch_size)
    ])


def _last_dim(outputs):
    """Classes of a single-tensor output spec; None for dict outputs or unknown width."""
    shape = getattr(outputs, "shape", None)
    return None if shape is None or not shape.rank else shape[-1]


def first_line(error):
    """The first line of an exception's message: what a one-line error can say of it."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
