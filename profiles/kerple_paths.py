"""Where the three exact algorithms of kernelized KERPLE cross: dense O(N^2 (m + d)), FFT O(N log N m d), DFT O(N (H + W) m d).

    python -m profiles.kerple_paths     # -> profiles/results/<device>/<backend>/kerple_paths.json

Times one `KernelAttention` layer (favor-kerple) with `toeplitz_path="dense"`,
`"fft"` and `"dft"`, and softmax-kerple beside them (the layer a linear
kernel is to beat), at growing grids (`PATCHES`), forward and forward +
backward, compiled once per point (`scaling.compiled_passes`), in two shapes
(`SHAPES`): the `cpu` profile's heads of dimension 16 with m = 16, and the
reference size's heads of dimension 32 with m = 64. The subjects of a grid
are measured alternately, `ROUNDS` times, and the median of each is kept, so
all see the same machine; a shape stops once the FFT path has won at two
grids in a row, or at a grid where a path ran out of memory (a row with
`out_of_memory`: which path, the backend's message; no timings). Above
`DENSE_ONE_PIECE_ELEMENTS` the dense path runs in blocks of grid rows, one
after another (memory O(block N) on both backends), so both paths run at
every grid.

Where the FFT path wins depends on m and d, not on N alone, so `"auto"`
compares the two paths' multiply-adds (`kernel_attention.toeplitz_costs`,
the dense path's with its elementwise passes counted in) with the FFT
path's weighted by a factor: each point's `fft_over_dense_model`
is the ratio of the counts, and the point says the factor must be at least
1 / that ratio where the dense path trained faster and below it where the
FFT path did. `fft_cost_factor` is the geometric middle of the interval
that every measured point allows (`factor_interval`; `consistent` is false
where no factor fits every point, and the middle of the two bounds is kept;
README, "KERPLE's three paths"). The ratios and intervals follow from the
timings and the cost model: after a change of `toeplitz_costs`,
`--remodel` recomputes them in every committed file (`remodel`; the timings
stay as measured), and a test compares each committed file with today's
model.
The DFT path's factor is fitted the same way against the dense path
(`dft_over_dense_model`, `factor_interval(rows, "dft")`: `dft_cost_factor`);
files from before the DFT path did not time it.

`KernelAttention`'s factors are not one file's but `joint_factors` of
every committed file of the backend timed with XLA (`fitted`), all
machines' (`--fit-only` prints them): the FFT and DFT factors that make
`"auto"` take the fastest path it timed at every point, or one within 5% of
its time (`TIE`), by the widest margin (`fit_constraints`). Each file's own
`fft_cost_factor` and `dft_cost_factor` stay in it as that run's fit (its
own intervals order every pair of paths, ties included).

TensorFlow's passes compile with XLA, as train.py trains (`--no-jit-compile`
times them without, as every file did before 2026-12-07 evening); JAX's
always do. The record says which (`xla`).

`--shapes`, `--tokens` (patches) and `--rounds` narrow a run to some shapes
and grids, for a slow machine, and `--subjects` to some of the subjects: at
grids where softmax-kerple or the dense path would take minutes a step (or
more memory than the machine has), `--subjects fft dft` times the two
transform paths alone. A row without the dense path fits no factor and ends
no shape; `auto_mistakes` still checks `"auto"` among the paths it timed.
"""

import datetime
import json
import math
import statistics
import sys
from pathlib import Path

from experiments.cli import command_line, fail, parser, start_backend

start_backend()  # before the imports below load Keras: why, in the docstring of profiles/__init__.py

import keras
from scipy.optimize import linprog

from experiments import atomic
from experiments.training import passes_with_xla
from performer_keras.kernel_attention import auto_toeplitz_path, toeplitz_costs
from performer_keras.options import check_choice
from profiles import bench
from profiles.child import failure
from profiles.__main__ import DEFAULT_OUT
from profiles.scaling import SCALING_CONFIG, build_subject, compiled_passes, grid_for, subject_inputs, time_calls

PATCHES = (16, 64, 256, 576, 1024, 2304, 4096, 8192, 16384)
PATHS = ("dense", "fft", "dft")
# Each subject: (kernel, toeplitz_path); softmax has one exact path.
SUBJECTS = {**{path: ("favor", path) for path in PATHS}, "softmax": ("softmax", "auto")}
MODES = ("forward", "train")
ROUNDS = 3
# (layer config, patch grids).
SHAPES = {
    "cpu": (dict(SCALING_CONFIG, width=64, heads=4, num_features=16, batch_size=4), PATCHES),
    "reference": (dict(SCALING_CONFIG, width=256, heads=8, num_features=64, batch_size=1), PATCHES),
}


def time_path(patches, path, kernel, config, jit_compile=False):
    """{mode: (median ms, cold)} of one layer at `patches` patches (plus CLS) through `path` (TensorFlow's with XLA if
    `jit_compile`); cold where the first call, compilation included, was the measurement (`time_calls`)."""
    model = build_subject("layer", kernel, "kerple", grid_for(patches), config=config, toeplitz_path=path)
    inputs, labels = subject_inputs("layer", model, config)
    forward, train = compiled_passes(model, "layer", jit_compile)
    # `time_calls`' limit of 20 s: a first call above it is the measurement, compilation included,
    # and XLA takes seconds to compile a layer: with 5 s, a first run of TensorFlow with XLA timed
    # compilation into its steps of a few seconds, several times a warm step.
    timings = {"forward": time_calls(forward, (inputs,), steps=3), "train": time_calls(train, (inputs, labels), steps=3)}
    return {mode: (timing["ms"], timing["cold"]) for mode, timing in timings.items()}


def measure(config, patches=PATCHES, rounds=ROUNDS, subjects=SUBJECTS, log=print, jit_compile=False):
    """One row per grid: the median ms of each subject (`SUBJECTS`) and mode over `rounds` alternating rounds
    (TensorFlow's passes with XLA if `jit_compile`).

    A row's `cold` names each `{subject}_{mode}` that a compiling first call
    timed in some round (`time_calls`: one over 20 s is the measurement); the
    log marks such times with `*`. A subject that runs out of memory ends the
    shape with a row that says so (`out_of_memory`: the subject and the
    backend's first line) and no timings.
    The model and timing ratios against the dense path need it among `subjects`.
    """
    rows = []
    for count in patches:
        row = {"patches": count, "tokens": count + 1, "grid": list(grid_for(count))}
        samples = {(name, mode): [] for name in subjects for mode in MODES}
        cold = set()
        try:
            for _ in range(rounds):
                for name, (kernel, path) in subjects.items():
                    for mode, (ms, first_call) in time_path(count, path, kernel, config, jit_compile).items():
                        samples[(name, mode)].append(ms)
                        if first_call:
                            cold.add(f"{name}_{mode}")
                    keras.backend.clear_session()
        except Exception as error:
            if failure(error)[0] != "oom":  # an allocation the backend refused; anything else is a bug
                raise
            message = str(error).strip().splitlines()[0][:300]
            rows.append(dict(row, out_of_memory={"path": name, "error": message}))
            log(f"N={row['tokens']}: {name} out of memory ({message})")
            break
        row.update({f"{name}_{mode}_ms": statistics.median(values) for (name, mode), values in samples.items()})
        row["cold"] = sorted(cold)
        for path in ("fft", "dft"):
            if "dense" in subjects and path in subjects:
                row[f"{path}_over_dense_train"] = row[f"{path}_train_ms"] / row["dense_train_ms"]
                row[f"{path}_over_dense_model"] = model_ratio(count, config, path)
        log(f"N={row['tokens']}: train " + ", ".join(
            f"{name} {row[f'{name}_train_ms']:.2f} ms" + ("*" if f"{name}_train" in cold else "") for name in subjects))
        rows.append(row)
        if len(rows) >= 2 and all(r.get("fft_over_dense_train", 1.0) < 1 for r in rows[-2:]):
            break
    return rows


def model_ratio(patches, config, path="fft"):
    """`path`'s multiply-adds over the dense path's (`toeplitz_costs`) for `patches` patches plus CLS."""
    costs = toeplitz_costs(patches + 1, grid_for(patches), config["num_features"], config["width"] // config["heads"])
    return costs[path] / costs["dense"]


def timed(rows):
    """The rows with timings of every subject (not a grid where one ran out of memory)."""
    return [row for row in rows if "out_of_memory" not in row]


def factor_interval(rows, path="fft"):
    """(low, high, consistent): the cost factors of `path` that pick the faster of it and the dense path at every row.

    `"auto"` prefers the dense path where factor x {path}_over_dense_model >= 1,
    so a row where the dense path trained faster asks factor >= 1 / ratio
    (low: the largest such bound), one where `path` did asks
    factor < 1 / ratio (high: the smallest). None where no row asks; rows
    that did not time both `path` and the dense path (files from before the
    DFT path, runs with fewer `--subjects`) ask nothing.
    """
    ratio, train = f"{path}_over_dense_model", f"{path}_train_ms"
    rows = [row for row in timed(rows) if ratio in row]
    dense_won = [1 / r[ratio] for r in rows if r["dense_train_ms"] <= r[train]]
    path_won = [1 / r[ratio] for r in rows if r[train] < r["dense_train_ms"]]
    low, high = max(dense_won, default=None), min(path_won, default=None)
    return low, high, low is None or high is None or low < high


def file_fit(rows):
    """A record's own fit to its `rows`: the FFT and DFT factor intervals against the dense path (`factor_interval`),
    whether each is consistent, and their geometric middles (`fft_cost_factor`, `dft_cost_factor`)."""
    low, high, consistent = factor_interval(rows)
    dft_low, dft_high, dft_consistent = factor_interval(rows, "dft")
    return {"factor_interval": [low, high], "consistent": consistent, "fft_cost_factor": geometric_middle(low, high),
            "dft_factor_interval": [dft_low, dft_high], "dft_consistent": dft_consistent,
            "dft_cost_factor": geometric_middle(dft_low, dft_high)}


def remodel(record):
    """`record` with the fields that follow from its timings and the cost model recomputed under today's
    `toeplitz_costs`: each point's `{path}_over_dense_model` and the `file_fit` fields it has. The timings stay."""
    for shape in record["shapes"].values():
        for row in timed(shape["points"]):
            for path in ("fft", "dft"):
                if f"{path}_over_dense_model" in row:
                    row[f"{path}_over_dense_model"] = model_ratio(row["patches"], shape["layer"], path)
    rows = [row for shape in record["shapes"].values() for row in shape["points"]]
    record.update({key: value for key, value in file_fit(rows).items() if key in record})
    return record


def geometric_middle(low, high):
    """The geometric middle of a factor interval (low, high): a record's `fft_cost_factor` or `dft_cost_factor`; None unless both bounds were measured."""
    return None if low is None or high is None else (low * high) ** 0.5


# Paths whose training times at a point lie within this factor of the fastest's are tied there, and neither
# the fit nor the check of `"auto"` asks one run to order them: the same grid and shape on two machines put the
# dense and DFT paths 4% apart one way (family-23 EPYC) and 2% the other (family-25 model-17), which no factors
# fit together, and runs of one command on one machine have differed by 10-20% (profiles/README.md). 5% is a
# round number above both differences (2.2% would untangle them) and well below the runs' spread.
TIE = 1.05


def timed_paths(record):
    """(shape, tokens, {path: its multiply-adds by `toeplitz_costs`}, the fastest path, the paths `TIE`d with it) at
    each timed point of a record, over the paths the point timed (dense and FFT only in files from before the DFT
    path); the tied paths include the fastest."""
    for name, shape in record["shapes"].items():
        layer = shape["layer"]
        for point in timed(shape["points"]):
            paths = [path for path in PATHS if f"{path}_train_ms" in point]
            costs = toeplitz_costs(point["tokens"], tuple(point["grid"]), layer["num_features"],
                                   layer["width"] // layer["heads"])
            fastest = min(paths, key=lambda path: point[f"{path}_train_ms"])
            tied = {path for path in paths if point[f"{path}_train_ms"] <= TIE * point[f"{fastest}_train_ms"]}
            yield name, point["tokens"], {path: costs[path] for path in paths}, fastest, tied


def fitted(records, backend):
    """The records that `backend`'s factors are fitted to: those timed with XLA (`xla`), as train.py trains on both
    backends. TensorFlow's files timed without it stay as its record, fitted to nothing: XLA moves the paths apart
    unevenly (profiles/README.md, "With XLA")."""
    return [record for record in records if record["backend"] == backend and record["xla"]]


def path_constraints(records, backend):
    """[(faster, slower, log(slower's count / faster's count))] at every timed point of the `fitted` `records` of `backend`.

    One for each path a point timed that is not tied with its fastest
    (`TIE`): `"auto"` takes the fastest where its factor x count is the
    smaller, i.e. where log f_faster - log f_slower < the third entry (the
    dense path's factor is 1); a path tied with the fastest asks nothing.
    """
    return [(fastest, path, math.log(costs[path] / costs[fastest]))
            for record in fitted(records, backend)
            for _, _, costs, fastest, tied in timed_paths(record) for path in costs if path not in tied]


# The factors `joint_factors` may choose: a path 100 times cheaper or 10,000 times dearer a
# multiply-add than the dense path is outside anything measured, and the bound keeps the fit
# finite where the points bound a factor on one side only.
FACTOR_RANGE = (1e-2, 1e4)


def joint_factors(records, backend):
    """The FFT and DFT factors that make `"auto"` take the fastest path at every point of the `fitted` `records` of `backend`
    by the widest margin (`fit_constraints` of `path_constraints`): {"fft", "dft", "margin", "consistent"}."""
    return fit_constraints(path_constraints(records, backend))


def fit_constraints(constraints):
    """{"fft", "dft", "margin", "consistent"}: the factors that meet `constraints` (`path_constraints`) by the widest margin.

    In log factors each constraint is a half-plane; the fit maximises the
    smallest slack t (a linear program): at every point the fastest path's
    weighted count is at least `margin` = e^t times below each other timed
    path's, so a factor could be off by less than that and `"auto"` would
    still take each point's fastest path. Where the
    widest margin leaves a factor free along a segment (a path no point
    bounds as tightly as the others), the fit takes the segment's middle.
    With the dense and FFT paths alone this is the geometric middle of
    `factor_interval`. `consistent` is false where no factors fit every
    constraint (margin < 1: the fit then keeps the largest miss smallest); a
    path no constraint names keeps factor 1.
    """
    index = {"fft": 0, "dft": 1}
    rows = []
    for faster, slower, _ in constraints:  # log f_faster - log f_slower + t <= bound
        row = [0.0, 0.0, 1.0]
        for path, sign in ((faster, 1.0), (slower, -1.0)):
            if path in index:
                row[index[path]] += sign
        rows.append(row)
    bounds = [bound for _, _, bound in constraints]
    if not rows:
        return {"fft": 1.0, "dft": 1.0, "margin": None, "consistent": True}
    limits = [tuple(math.log(limit) for limit in FACTOR_RANGE)] * 2 + [(None, None)]

    def solve(objective, margin=None):
        floor = ([[0.0, 0.0, -1.0]], [-margin]) if margin is not None else ([], [])
        result = linprog(objective, A_ub=rows + floor[0], b_ub=bounds + floor[1], bounds=limits, method="highs")
        if not result.success:
            raise RuntimeError(f"factor fit failed: {result.message}")
        return result.x

    best = solve([0.0, 0.0, -1.0])[2]
    # The ends of the widest-margin set along each log factor (a point or a segment), a hair inside.
    ends = [solve(objective, best - 1e-9) for objective in ([1, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0])]
    named = {path for constraint in constraints for path in constraint[:2]}
    return {"fft": math.exp((ends[0][0] + ends[1][0]) / 2) if "fft" in named else 1.0,
            "dft": math.exp((ends[2][1] + ends[3][1]) / 2) if "dft" in named else 1.0,
            "margin": math.exp(best), "consistent": bool(best > 0)}


def committed_paths(root=None):
    """The path of every kerple_paths.json under `root` (default: profiles/results), sorted."""
    return sorted(Path(root or DEFAULT_OUT).rglob("kerple_paths.json"))


def committed_records(root=None):
    """Every kerple_paths.json under `root` (default: profiles/results), read."""
    return [json.loads(path.read_text()) for path in committed_paths(root)]


def auto_mistakes(record):
    """(shape, tokens, auto's path, the fastest) at each point of a kerple_paths record where `"auto"`, with the
    factors of the record's backend, would take none of the paths the point timed fastest or `TIE`d with it
    (`timed_paths`)."""
    return [(name, tokens, chosen, fastest) for name, tokens, costs, fastest, tied in timed_paths(record)
            for chosen in [auto_toeplitz_path(costs, record["backend"])] if chosen not in tied]


def dense_and_fft(rows):
    """The rows that timed both the dense and the FFT path."""
    return [row for row in timed(rows) if "dense_train_ms" in row and "fft_train_ms" in row]


def dense_max(rows):
    """The largest measured token count at which the dense path trains faster than the FFT path, or None."""
    return max((row["tokens"] for row in dense_and_fft(rows) if row["dense_train_ms"] <= row["fft_train_ms"]),
               default=None)


def crossover(rows):
    """The smallest token count from which the FFT path trains faster than the dense one at every larger measured N, or None."""
    rows = dense_and_fft(rows)
    for index, row in enumerate(rows):
        if all(later["fft_train_ms"] < later["dense_train_ms"] for later in rows[index:]):
            return row["tokens"]
    return None


def main(argv=None):
    prog = "python -m profiles.kerple_paths"
    args = parser(prog, __doc__, "shapes", "subjects", "tokens", "rounds", "out", "fit-only",
                  "remodel", "jit-compile").parse_args(argv)
    if args.remodel:
        for path in committed_paths(args.out):
            atomic.write_json(path, remodel(json.loads(path.read_text())), indent=1, sort_keys=False)
            print(path)
        return 0
    if args.fit_only:
        records = committed_records(args.out)
        print(json.dumps({backend: joint_factors(records, backend)
                          for backend in sorted({record["backend"] for record in records})}))
        return 0
    try:
        xla = passes_with_xla(args.jit_compile)
        names = [check_choice("shape", name, SHAPES) for name in args.shapes or SHAPES]
        subjects = {check_choice("subject", name, SUBJECTS): SUBJECTS[name] for name in args.subjects or SUBJECTS}
    except ValueError as error:
        return fail(prog, error)
    result_dir = Path(args.out or DEFAULT_OUT) / bench.device_slug() / keras.backend.backend()
    rounds = args.rounds or ROUNDS
    shapes = {}
    for name in names:
        config, patches = SHAPES[name]
        rows = measure(config, args.tokens or patches, rounds, subjects,
                       log=lambda line: print(f"{name}: {line}", flush=True), jit_compile=xla)
        shapes[name] = {"layer": dict(config, kernel="favor", position="kerple"), "points": rows,
                        "crossover_tokens": crossover(rows), "dense_max_tokens": dense_max(rows)}
    crossovers = [shape["crossover_tokens"] for shape in shapes.values() if shape["crossover_tokens"]]
    points = [row for shape in shapes.values() for row in shape["points"]]
    record = {
        "command": command_line("profiles.kerple_paths", argv),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        **bench.record_header(),
        "rounds": rounds,
        "xla": xla,
        "subjects": list(subjects),
        "shapes": shapes,
        "crossover_tokens": min(crossovers) if crossovers else None,
        **file_fit(points),
    }
    atomic.write_json(result_dir / "kerple_paths.json", record, indent=1, sort_keys=False)
    print(json.dumps({key: record[key] for key in ("fft_cost_factor", "factor_interval", "dft_cost_factor", "dft_factor_interval")}
                     | {"file": str(result_dir / "kerple_paths.json")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
