"""Saliency maps of a benchmark's checkpoints: where each variant looks in a few test images.

A TensorFlow feature (tf-keras-vis and tf.GradientTape): on another backend
the report says the figure was not drawn and why.
"""

import warnings
from pathlib import Path

import numpy as np

from experiments import atomic
from experiments.figures import new_figure

SALIENCY_IMAGES = 4
SMOOTH_SAMPLES = 16
SMOOTH_NOISE = 0.1


def saliency_maps(model, images, labels):
    """(maps, method) for `images` and their true `labels`, maps in [0, 1].

    SmoothGrad (`SMOOTH_SAMPLES` noisy copies) of the class score, softmax
    replaced by identity, with tf-keras-vis; if tf-keras-vis fails on this
    Keras 3 model, the absolute input gradient of the class probability
    through tf.GradientTape (max over channels, scaled per image to [0, 1]).
    """
    import tensorflow as tf

    images = images.astype("float32")
    try:
        from tf_keras_vis.saliency import Saliency
        from tf_keras_vis.utils.model_modifiers import ReplaceToLinear
        from tf_keras_vis.utils.scores import CategoricalScore

        saliency = Saliency(model, model_modifier=ReplaceToLinear(), clone=True)
        with warnings.catch_warnings():
            # tf-keras-vis calls the model with a list of its one input; Keras 3 takes it and warns that the
            # structure "doesn't match" (in every report with checkpoints).
            warnings.filterwarnings("ignore", message="The structure of `inputs` doesn't match", category=UserWarning)
            maps = saliency(CategoricalScore([int(y) for y in labels]), images,
                            smooth_samples=SMOOTH_SAMPLES, smooth_noise=SMOOTH_NOISE)
        return np.asarray(maps), f"tf-keras-vis SmoothGrad ({SMOOTH_SAMPLES} samples, noise {SMOOTH_NOISE})"
    except Exception as error:  # noqa: BLE001 - any failure of the library falls back to the plain gradient
        fallback = f"plain input gradient (tf.GradientTape); tf-keras-vis failed: {type(error).__name__}"
    x = tf.convert_to_tensor(images)
    with tf.GradientTape() as tape:
        tape.watch(x)
        chosen = tf.gather(model(x, training=False), labels, axis=1, batch_dims=1)
    maps = tf.reduce_max(tf.abs(tape.gradient(chosen, x)), axis=-1).numpy()
    maps = maps / np.maximum(maps.reshape(len(maps), -1).max(axis=1)[:, None, None], 1e-12)
    return maps, fallback


def plot_saliency(cells, dataset, root, path):
    """Saliency of the first test images for every row with a checkpoint (its first finished seed).

    Returns (drawn: bool, note: str).
    """
    if not any(c["seeds"]["finished"] for c in cells):
        return False, "not drawn: no finished run"
    # Imported here so that the report's command starts the backend first (`cli.start_backend`).
    import keras

    if keras.backend.backend() != "tensorflow":
        return False, f"not drawn: saliency maps need the TensorFlow backend (this report ran on {keras.backend.backend()})"
    checkpoints = []
    for c in cells:
        for seed in c["seeds"]["finished"]:
            checkpoint = Path(root) / c["directory"] / f"seed{seed}" / "best.keras"
            if checkpoint.is_file():
                checkpoints.append((f"{c['label']} s{seed}", checkpoint, c["config"]))
                break
    if not checkpoints:
        return False, ("not drawn: no best.keras checkpoint (checkpoints are not committed; "
                       "run the benchmark command above to remake them)")
    from experiments.data import load_dataset
    from experiments.models import load_model_only

    splits = load_dataset(dataset, limit=checkpoints[0][2].get("limit"))
    images, labels = splits.test[0][:SALIENCY_IMAGES], splits.test[1][:SALIENCY_IMAGES]
    columns = 1 + len(checkpoints)
    figure = new_figure(1.35 * columns, 1.45 * len(images) + 0.6)
    methods = set()
    panels = []
    for title, checkpoint, _ in checkpoints:
        model = load_model_only(checkpoint)
        maps, method = saliency_maps(model, images, labels)
        methods.add(method)
        panels.append((title, maps))
    for row, image in enumerate(images):
        axes = figure.add_subplot(len(images), columns, row * columns + 1)
        axes.imshow(image.squeeze(), cmap="gray" if image.shape[-1] == 1 else None)
        axes.set_axis_off()
        if row == 0:
            axes.set_title("image", fontsize=7)
        for column, (title, maps) in enumerate(panels, 2):
            axes = figure.add_subplot(len(images), columns, row * columns + column)
            axes.imshow(maps[row], cmap="jet", vmin=0, vmax=1)
            axes.set_axis_off()
            if row == 0:
                axes.set_title(title, fontsize=6, rotation=30)
    figure.tight_layout()
    atomic.save_figure(figure, path, dpi=110)
    return True, "; ".join(sorted(methods))
