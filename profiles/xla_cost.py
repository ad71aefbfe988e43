"""Should the `cpu` profile compile its steps with XLA? Every variant's training with and without it.

    python -m profiles.xla_cost --datasets cifar10   # -> profiles/results/<device>/<backend>/xla_cost.json

For each dataset and each variant of the `cpu` profile, the run's own model
(`training.build_model` on the profile's RunConfig of seed 0: its size, heads,
m, batch size, optimizer and steps per execution) is built twice in one
process, with `jit_compile` False and True, and each trains alternately for
`ROUNDS` rounds of `model.fit` over real training images through the run's
own pipeline (`pipelines.train_batches`, with the
run's augmentation), so both see the same machine. The record keeps each
round's images/s, the medians and their ratio (XLA over not).
"""

import statistics
import sys
import time

from experiments.cli import expand_variants, fail, parser, start_backend

start_backend()  # before the imports below load Keras: why, in the docstring of profiles/__init__.py

import keras

from experiments import data, pipelines
from experiments.benchmark_profiles import get_profile
from experiments.training import augmentation, build_model
from profiles import bench
from profiles.__main__ import DEFAULT_OUT

PROG = "python -m profiles.xla_cost"
ROUNDS = 3
DISPATCHES = 3  # timed dispatches of `steps_per_execution` steps each, after one untimed
MODES = (False, True)


class _DispatchClock(keras.callbacks.Callback):
    """The instants at which each dispatch of steps ends (Keras calls this once per dispatch)."""

    def on_train_begin(self, logs=None):
        self.ends = []

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.perf_counter())


def measure(profile, variant, splits, rounds=ROUNDS, dispatches=DISPATCHES):
    """{"images_per_second": {mode: [rounds]}, "median": {mode: ...}, "xla_over_plain"} of one variant.

    A round is one `fit` of 1 + `dispatches` dispatches, timed from the end of
    the first to the end of the last: the first waits for the pipeline to
    start and `fit`'s teardown takes seconds, neither of which a 40-epoch
    run pays more than once.
    """
    models = {}
    for jit in MODES:
        config = profile.config(variant, splits.name, 0, jit_compile=jit)
        models[jit] = build_model(config, splits)
    per_dispatch = models[False].steps_per_execution * config.batch_size
    count = (1 + dispatches) * per_dispatch
    batches = pipelines.train_batches(splits.train[0][:count], splits.train[1][:count], config.batch_size,
                                      config.seed, augmentation(config, splits))
    # shuffle=False as train.py's fit: the pipeline orders each epoch (Keras warned that it ignores shuffle=True here).
    for model in models.values():  # compiles
        model.fit(batches, epochs=1, verbose=0, shuffle=False)
    rates = {jit: [] for jit in MODES}
    for _ in range(rounds):
        for jit, model in models.items():
            clock = _DispatchClock()
            model.fit(batches, epochs=1, verbose=0, callbacks=[clock], shuffle=False)
            rates[jit].append(dispatches * per_dispatch / (clock.ends[-1] - clock.ends[0]))
    keras.backend.clear_session()
    median = {str(jit).lower(): statistics.median(values) for jit, values in rates.items()}
    return dict(variant=variant, dataset=splits.name, batch_size=config.batch_size,
                images_per_second={str(jit).lower(): values for jit, values in rates.items()},
                median=median, xla_over_plain=median["true"] / median["false"])


def main(argv=None):
    args = parser(PROG, __doc__, "out", "datasets", "variants").parse_args(argv)
    profile = get_profile("cpu")
    try:  # all of them first: a dataset that cannot load would otherwise end the run after minutes of timing
        datasets = [data.load_dataset(dataset) for dataset in args.datasets or profile.datasets]
    except data.DataError as error:
        return fail(PROG, error)
    rows = []
    for splits in datasets:
        for variant in expand_variants(args.variants, profile.variants):
            row = measure(profile, variant, splits)
            rows.append(row)
            print(f"{splits.name} {variant}: {row['median']['false']:.0f} images/s plain, "
                  f"{row['median']['true']:.0f} with XLA, x{row['xla_over_plain']:.2f}", flush=True)
    path = bench.write_record(args.out or DEFAULT_OUT, "xla_cost", "profiles.xla_cost", argv, profile="cpu",
                              rounds=ROUNDS, timed_dispatches=DISPATCHES, rows=rows)
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
