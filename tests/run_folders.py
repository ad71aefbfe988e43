"""A run folder as training leaves it, for the tests of the tools that read one."""

import json

import keras

import performer_keras


def tiny_run_folder(run, variant, config, history):
    """Write best.keras (a tiny MNIST `variant` at seed 0), config.json (`config`) and history.csv (`history`,
    the CSV's text) into `run`; return the model."""
    keras.utils.set_random_seed(0)
    model = performer_keras.create_model(variant, size="tiny", image_shape=(28, 28, 1), num_classes=10)
    model.save(run / "best.keras")
    (run / "config.json").write_text(json.dumps(config))
    (run / "history.csv").write_text(history)
    return model
