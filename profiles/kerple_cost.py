"""What kerple costs a linear kernel: the ViT's training step with kerple against absolute positions.

    python -m profiles.kerple_cost                     # -> profiles/results/<device>/<backend>/kerple_cost.json
    KERAS_BACKEND=jax python -m profiles.kerple_cost
    python -m profiles.kerple_cost --jit-compile       # both models with XLA -> kerple_cost-jit.json

For each setting of `SETTINGS` (the `small` ViT with m = 16 at batch 64, the
`cpu` profile's, and the `reference` ViT with m = 64 at batch 16, at MNIST's
50 and CIFAR-10's 65 tokens) and each
linear kernel of the main table, three models (<kernel>-absolute,
<kernel>-kerple, the train.py defaults otherwise, and <kernel>-absolute with
q and k l2-normalised as kerple does by default) are built and compiled in one
process, then timed alternately: `ROUNDS` rounds of `STEPS` training steps
(`train_on_batch`, AdamW) each, so all see the same machine; the medians of
the step times are compared. The kerple issue's target is a `ratio` (kerple
over absolute, each with its default) of at most `TARGET`;
`ratio_same_normalization` (kerple over normalised absolute) is the
position's own cost and `normalization_ratio` the normalisation's. The
kerple model runs the Toeplitz path `KernelAttention` picks at that N
(`toeplitz_path` in the record). `--[no-]jit-compile` compiles every
model's step with (without) XLA and names the file after the choice; without
either, all use train.py's default (`training.keras_jit_compile`: XLA on
both backends since 2026-11-25).
"""

import statistics
import sys
import time

from experiments.cli import parser, start_backend

start_backend()  # before the imports below load Keras: why, in the docstring of profiles/__init__.py

import keras

from experiments.training import keras_jit_compile
from performer_keras.kernel_attention import KernelAttention
from performer_keras.registry import create_model, linear_kernels, main_kernels
from profiles import bench
from profiles.__main__ import DEFAULT_OUT
from profiles.bench import RESOLUTIONS, random_batch

# (size, batch size, dataset, m): the profiles' settings of each size.
SETTINGS = tuple((size, batch, dataset, m) for size, batch, m in (("small", 64, 16), ("reference", 16, 64))
                 for dataset in ("mnist", "cifar10"))
KERNELS = tuple(k for k in main_kernels() if k in linear_kernels())
# Timed models: name -> (position, overrides). kerple l2-normalises q and k by default and absolute does
# not, so "absolute_normalized" separates the position's cost from the normalisation's.
MODELS = {"absolute": ("absolute", {}), "kerple": ("kerple", {}), "absolute_normalized": ("absolute", {"normalize_qk": True})}
ROUNDS, STEPS = 5, 4
TARGET = 1.5


def pair(kernel, size, batch_size, dataset, rounds=ROUNDS, steps=STEPS, num_features=16, jit_compile="auto"):
    """{model: {"ms": median step ms, "ms_all", "normalizes_qk"}} for `MODELS`, plus the ratios and "toeplitz_path", for one kernel
    and setting."""
    image_shape, num_classes = RESOLUTIONS[dataset]
    images, labels = random_batch(image_shape, num_classes, batch_size)
    models = {}
    for name, (position, overrides) in MODELS.items():
        keras.utils.set_random_seed(0)
        model = create_model(f"{kernel}-{position}", image_shape, num_classes, size, num_features=num_features,
                             **overrides)
        model.compile(optimizer=keras.optimizers.AdamW(1e-3), loss="sparse_categorical_crossentropy",
                      jit_compile=jit_compile)
        model.train_on_batch(images, labels)  # compiles
        model.train_on_batch(images, labels)
        models[name] = model
    samples = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            for _ in range(steps):
                start = time.perf_counter()
                model.train_on_batch(images, labels)  # returns numpy: waits for the step
                samples[name].append(1000.0 * (time.perf_counter() - start))
    attentions = {name: next(layer for layer in model.layers if isinstance(layer, KernelAttention))
                  for name, model in models.items()}
    result = {name: {"ms": statistics.median(values), "ms_all": values, "normalizes_qk": attentions[name].normalizes}
              for name, values in samples.items()}
    attention = attentions["kerple"]
    keras.backend.clear_session()
    return dict(result, kernel=kernel, size=size, batch_size=batch_size, dataset=dataset,
                tokens=1 + attention.grid_size[0] * attention.grid_size[1], num_features=num_features,
                toeplitz_path=attention.toeplitz_path_used, jit_compile=bool(models["kerple"].jit_compile),
                ratio=result["kerple"]["ms"] / result["absolute"]["ms"],
                ratio_same_normalization=result["kerple"]["ms"] / result["absolute_normalized"]["ms"],
                normalization_ratio=result["absolute_normalized"]["ms"] / result["absolute"]["ms"],
                target=TARGET, met=result["kerple"]["ms"] <= TARGET * result["absolute"]["ms"])


def main(argv=None):
    args = parser("python -m profiles.kerple_cost", __doc__, "out", "jit-compile").parse_args(argv)
    jit_compile = keras_jit_compile(args.jit_compile)
    name = {None: "kerple_cost", True: "kerple_cost-jit", False: "kerple_cost-nojit"}[args.jit_compile]
    rows = []
    for size, batch_size, dataset, num_features in SETTINGS:
        for kernel in KERNELS:
            row = pair(kernel, size, batch_size, dataset, num_features=num_features, jit_compile=jit_compile)
            rows.append(row)
            print(f"{size} {dataset} ({row['tokens']} tokens) {kernel}: kerple {row['kerple']['ms']:.1f} ms, "
                  f"absolute {row['absolute']['ms']:.1f} ms, x{row['ratio']:.2f}; normalised absolute "
                  f"{row['absolute_normalized']['ms']:.1f} ms, x{row['ratio_same_normalization']:.2f}", flush=True)
    met = all(row["met"] for row in rows)
    path = bench.write_record(args.out or DEFAULT_OUT, name, "profiles.kerple_cost", argv, rounds=ROUNDS,
                              steps_per_round=STEPS, target=TARGET, met_everywhere=met, rows=rows)
    print(f"written: {path} (target met everywhere: {met})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
