"""SavedModel export whose serving signature takes uint8 images (a TensorFlow feature)."""

import importlib.util

import keras

from experiments.cli import import_quietly


def tensorflow_missing(feature):
    """None when TensorFlow can be imported, else one line saying that `feature` needs it.

    A JAX machine set up for a GPU usually has no TensorFlow (beside a CUDA
    JAX it clashes over CUDA libraries); training, evaluation and the reports
    run there without it, and only SavedModels need it.
    """
    if importlib.util.find_spec("tensorflow") is not None:
        return None
    return (f"{feature} needs TensorFlow, which is not installed here (KERAS_BACKEND={keras.backend.backend()}); "
            "`pip install tensorflow`, or run this step on a machine that has it")


def export_saved_model(model, export_dir):
    """Write `model` as a TF SavedModel with endpoint `serve`: uint8 (batch, H, W, C) -> probabilities.

    The model normalises pixels itself, so serving only casts uint8 to float32.
    """
    tf = import_quietly("tensorflow")

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        name="serve",
        # keras.ops, not tf.cast: on JAX the endpoint is traced by JAX (jax2tf) and gets JAX arrays.
        fn=lambda images: model(keras.ops.cast(images, "float32"), training=False),
        input_signature=[tf.TensorSpec((None,) + tuple(model.input_shape[1:]), tf.uint8, name="images")],
    )
    archive.write_out(str(export_dir), verbose=False)
    return export_dir
