"""SavedModel export whose serving signature takes uint8 images (a TensorFlow feature)."""

import importlib.util
from pathlib import Path

import keras

from experiments import atomic
from experiments.cli import import_quietly
from experiments.run_config import check_recorded

# Written into an export folder last: the run it is an export of (a rerun may replace it, no other run may write
# over it) and that run's settings, so that evaluate.py knows the export's data and variant without the run folder.
EXPORT_RECORD = "export_of.json"


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


def write_export_record(export_dir, run_dir, config):
    """`EXPORT_RECORD` in `export_dir`: the run folder `run_dir` and its RunConfig `config`."""
    atomic.write_json(Path(export_dir) / EXPORT_RECORD, {"run": str(Path(run_dir).resolve()), "config": config.to_dict()})


def read_export_record(export_dir):
    """(run folder or None, RunConfig or None) of the export in `export_dir`; (None, None) without a record.

    An export made before the record held its run's settings has no "config". A record damaged by hand or disk
    is a ValueError (a RunError where its settings describe no run) naming the file.
    """
    path = Path(export_dir) / EXPORT_RECORD
    if not path.is_file():
        return None, None
    record = atomic.read_json_object(path)
    config = record.get("config")
    return record.get("run"), None if config is None else check_recorded(config, f"{path}'s config")
