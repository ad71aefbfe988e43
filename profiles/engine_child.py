"""One process of the engine benchmark (`profiles/engine.py`): training images/s of its subjects.

Run as a script, ``python profiles/engine_child.py TASK_JSON``, with the code
to measure first on PYTHONPATH: the parent runs it against this checkout and
against another one (`--baseline`), so it uses only what both have
(`training.build_model`, `training._train_model`, `data.load_dataset`,
`RunConfig`). It reports one event per measurement (`profiles.child.emit`).

Subjects, each measured once per round, rounds alternating, the first round
a warm-up (compilation) that is not kept:

* ``fit:<variant>``: the project's model, ``model.fit`` on float32 numpy
  arrays of the training split, no callbacks (a bare fit).
* ``stock``: the same ViT with every `KernelAttention` replaced by Keras'
  ``MultiHeadAttention`` (same heads and widths), fitted the same way.
* ``train_path``: train.py's own path, ``training._train_model`` into a
  fresh folder for two epochs (its pipeline with augmentation, its callbacks
  and writes; a 256-image validation split); the second epoch's
  ``epoch_seconds`` from history.csv is kept.
* ``matmul:square`` and ``matmul:vit`` (`profiles/matmul_rate.py`): GFLOP/s
  of large square matmuls and of the ViT's own forward matmul shapes at
  the task's batch, the ceilings a training rate is read against; with
  them, a ``flops`` event gives each ``fit:`` subject's training FLOPs per
  image, counted from its graph (`flops.count_training_flops`).

A task with a ``precision`` builds every model under that dtype policy. A
task with a ``barrier`` ({folder, index, count}: one of `count` children
started at once, `engine.concurrent_train_path`) waits before each timed
round until all `count` have reached it, so their rounds overlap.
"""

import csv
import json
import sys
import tempfile
import time
from pathlib import Path

import keras
import numpy as np


class StockSelfAttention(keras.layers.Layer):
    """Keras' MultiHeadAttention called on one input, so it stands where a KernelAttention stood."""

    def __init__(self, num_heads, key_dim, **kwargs):
        super().__init__(**kwargs)
        self.attention = keras.layers.MultiHeadAttention(num_heads, key_dim)

    def build(self, inputs_shape):
        self.attention.build(inputs_shape, inputs_shape)

    def call(self, inputs):
        return self.attention(inputs, inputs)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape


def stock_model(model, config, splits):
    """`model` with each KernelAttention swapped for `StockSelfAttention`, compiled like the project's."""
    from experiments import training

    def swap(layer):
        if type(layer).__name__ == "KernelAttention":
            width = layer.input.shape[-1]
            return StockSelfAttention(layer.num_heads, key_dim=width // layer.num_heads, name=layer.name)
        return layer.__class__.from_config(layer.get_config())

    stock = keras.models.clone_model(model, clone_function=swap)
    steps = len(splits.train[0]) // config.batch_size
    stock.compile(optimizer=training.build_optimizer(config, steps), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], steps_per_execution=model.steps_per_execution, jit_compile=model.jit_compile)
    return stock


def measure(task, emit):
    from experiments import data, training
    from experiments.run_config import RunConfig

    splits = data.load_dataset(task["dataset"], limit=task["limit"], validation_size=task["validation_size"])
    x, y = splits.train[0].astype("float32"), splits.train[1]
    # Only what a task sets, so a baseline commit without the setting can still be measured.
    extra = {name: task[name] for name in ("num_features", "precision") if name in task}
    configs = {variant: RunConfig(variant=variant, dataset=task["dataset"], size=task["size"], epochs=task["epochs"],
                                  batch_size=task["batch_size"], seed=0, limit=task["limit"], **extra)
               for variant in task["variants"]}
    models = {}
    for subject in task["subjects"]:
        if subject.startswith("fit:"):
            with training.dtype_policy(configs[subject[4:]].precision):
                models[subject] = training.build_model(configs[subject[4:]], splits)
        elif subject == "stock":
            base = configs[task["variants"][0]]
            with training.dtype_policy(base.precision):
                models[subject] = stock_model(training.build_model(base, splits), base, splits)
    if any(subject.startswith("matmul:") for subject in task["subjects"]):
        from experiments import flops

        emit({"event": "flops", "train_flops_per_image": {
            name: flops.count_training_flops(model, batch_size=task["batch_size"]) / task["batch_size"]
            for name, model in models.items() if name.startswith("fit:")}})
    emit({"event": "setup", "train_images": len(x),
          "params": {name: int(sum(np.prod(w.shape) for w in m.trainable_weights)) for name, m in models.items()},
          "dtype_policies": {name: m.dtype_policy.name for name, m in models.items()}})
    for round_index in range(task["rounds"] + 1):
        if "barrier" in task and round_index > 0:
            wait_at_barrier(**task["barrier"], round_index=round_index)
        for subject in task["subjects"]:
            if subject.startswith("matmul:"):
                emit({"event": "sample", "subject": subject, "round": round_index, "warmup": round_index == 0,
                      "gflops_per_second": matmul_gflops(subject, configs[task["variants"][0]], x.shape[1:],
                                                         task["batch_size"])})
                continue
            if subject == "train_path":
                seconds = train_path_seconds(configs[task["variants"][0]], splits, training)
            else:
                history = models[subject].fit(x, y, batch_size=task["batch_size"], epochs=1, shuffle=False,
                                              verbose=0, callbacks=[training.EpochStats()])
                seconds = history.history["epoch_seconds"][-1]
            steps = len(x) // task["batch_size"]
            emit({"event": "sample", "subject": subject, "round": round_index, "warmup": round_index == 0,
                  "images_per_second": steps * task["batch_size"] / seconds})


def matmul_gflops(subject, config, image_shape, batch_size):
    """GFLOP/s of `subject`'s matmuls: "matmul:square", or "matmul:vit", the forward shapes of `config`'s ViT."""
    from performer_keras.registry import model_config
    from profiles import matmul_rate
    from profiles.bench import token_count

    dtype = keras.DTypePolicy(config.precision).compute_dtype
    if subject == "matmul:square":
        return matmul_rate.matmul_gflops(matmul_rate.square_shapes(), copies=matmul_rate.SQUARE_COPIES, dtype=dtype)
    size = model_config(**config.model_overrides())
    tokens = token_count(image_shape, size["patch_size"])
    return matmul_rate.matmul_gflops(matmul_rate.vit_shapes(batch_size, tokens, size["width"], size["heads"],
                                                            size["mlp_dim"]), dtype=dtype)


def wait_at_barrier(folder, index, count, round_index, timeout_s=900.0):
    """Mark this child as ready for `round_index` and return once all `count` children are (RuntimeError after `timeout_s`)."""
    (Path(folder) / f"ready-{round_index}-{index}").touch()
    deadline = time.monotonic() + timeout_s
    while len(list(Path(folder).glob(f"ready-{round_index}-*"))) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"engine child {index}: the other workers never reached round {round_index}")
        time.sleep(0.05)


def train_path_seconds(config, splits, training):
    import dataclasses

    two_epochs = dataclasses.replace(config, epochs=2)
    with tempfile.TemporaryDirectory() as folder:
        training._train_model(two_epochs, splits, None, Path(folder), 0)
        # Read here rather than with the measured code's reader, which moved between the commits compared.
        with open(Path(folder) / "history.csv", newline="") as f:
            rows = list(csv.DictReader(f))
    return float(rows[-1]["epoch_seconds"])


def main(argv):
    from profiles.child import emit

    import experiments
    from experiments import training

    task = json.loads(argv[0])
    if hasattr(training, "use_compilation_cache"):  # absent from older commits measured as a baseline
        training.use_compilation_cache()
    # Where the measured code was really imported from, so a baseline cannot silently measure this checkout.
    emit({"event": "start", "backend": keras.backend.backend(), "code": task.get("code"),
          "experiments_from": str(Path(experiments.__file__).resolve().parent.parent)})
    measure(task, emit)
    emit({"event": "done"})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
