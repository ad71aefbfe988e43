"""Where the two exact algorithms of kernelized KERPLE cross: dense O(N^2 (m + d)) against FFT O(N log N m d).

    python -m profiles.kerple_paths     # -> profiles/results/<device>/<backend>/kerple_paths.json

Times one `KernelAttention` layer (favor-kerple) with `toeplitz_path="dense"`
and `"fft"` at growing grids (`PATCHES`), forward and forward + backward,
compiled once per point (`scaling.compiled_passes`), in two shapes
(`SHAPES`): the `cpu` profile's heads of dimension 16 with m = 16, and the
reference size's heads of dimension 32 with m = 64. The two paths of a grid
are measured alternately, `ROUNDS` times, and the median of each is kept, so
both see the same machine; a shape stops once the FFT path has won at two
grids in a row. The crossover is the smallest N from which the FFT path
trains faster; `KernelAttention`'s default `DENSE_TOEPLITZ_MAX_TOKENS` is
`dense_max_tokens` of the committed file: the largest measured N below that
crossover, where the dense path still won, or, where no shape reached a
crossover, the largest N measured (README, "KERPLE's two paths").
"""

import datetime
import json
import shlex
import statistics
import sys
from pathlib import Path

from experiments.cli import parser, start_backend

start_backend()  # before the imports below load Keras: why, in the docstring of profiles/__init__.py

import keras

from experiments import atomic
from profiles import bench
from profiles.__main__ import DEFAULT_OUT
from profiles.scaling import SCALING_CONFIG, build_subject, compiled_passes, grid_for, subject_inputs, time_calls

# Beyond 4,096 patches the dense path's N x N weights are the risk (at 8,192 patches, batch 4
# and 4 heads, 4 GiB a tensor), whatever the time: there `"auto"` takes the FFT path for its
# memory linear in N.
PATCHES = (16, 64, 256, 576, 1024, 2304, 4096)
PATHS = ("dense", "fft")
MODES = ("forward", "train")
ROUNDS = 3
# (layer config, patch grids): the reference shape's FFT correlates 7.8 times the channels
# per head, so its sweep stops at 1,024 patches, where the dense path is far ahead.
SHAPES = {
    "cpu": (dict(SCALING_CONFIG, width=64, heads=4, num_features=16, batch_size=4), PATCHES),
    "reference": (dict(SCALING_CONFIG, width=256, heads=8, num_features=64, batch_size=1), PATCHES[:5]),
}


def time_path(patches, path, kernel, config):
    """{mode: median ms} of one layer at `patches` patches (plus CLS) through `path`."""
    model = build_subject("layer", kernel, "kerple", grid_for(patches), config=config, toeplitz_path=path)
    inputs, labels = subject_inputs("layer", model, config)
    forward, train = compiled_passes(model, "layer")
    return {
        "forward": time_calls(forward, (inputs,), steps=3, max_seconds=5.0)["ms"],
        "train": time_calls(train, (inputs, labels), steps=3, max_seconds=5.0)["ms"],
    }


def measure(config, patches=PATCHES, rounds=ROUNDS, kernel="favor", log=print):
    """One row per grid: the median ms of each path and mode over `rounds` alternating rounds."""
    rows = []
    for count in patches:
        samples = {(path, mode): [] for path in PATHS for mode in MODES}
        for _ in range(rounds):
            for path in PATHS:
                for mode, ms in time_path(count, path, kernel, config).items():
                    samples[(path, mode)].append(ms)
                keras.backend.clear_session()
        row = {"patches": count, "tokens": count + 1, "grid": list(grid_for(count))}
        row.update({f"{path}_{mode}_ms": statistics.median(values) for (path, mode), values in samples.items()})
        row["fft_over_dense_train"] = row["fft_train_ms"] / row["dense_train_ms"]
        log(f"N={row['tokens']}: train dense {row['dense_train_ms']:.2f} ms, fft {row['fft_train_ms']:.2f} ms")
        rows.append(row)
        if len(rows) >= 2 and all(r["fft_over_dense_train"] < 1 for r in rows[-2:]):
            break
    return rows


def dense_max(rows):
    """The largest measured token count at which the dense path trains faster, or None."""
    return max((row["tokens"] for row in rows if row["dense_train_ms"] <= row["fft_train_ms"]), default=None)


def crossover(rows):
    """The smallest token count from which the FFT path trains faster at every larger measured N, or None."""
    for index, row in enumerate(rows):
        if all(later["fft_train_ms"] < later["dense_train_ms"] for later in rows[index:]):
            return row["tokens"]
    return None


def default_dense_max(shapes):
    """KernelAttention's DENSE_TOEPLITZ_MAX_TOKENS from {shape: {"crossover_tokens", "dense_max_tokens"}}.

    The dense path up to the last N where it measured faster before a
    crossover, in the shape that crosses first; with no crossover in any
    shape, up to the largest N where it measured faster (above it the FFT
    path is taken for its memory linear in N).
    """
    crossing = [s["dense_max_tokens"] for s in shapes.values() if s["crossover_tokens"] and s["dense_max_tokens"]]
    measured = [s["dense_max_tokens"] for s in shapes.values() if s["dense_max_tokens"]]
    return min(crossing) if crossing else max(measured, default=None)


def main(argv=None):
    args = parser("python -m profiles.kerple_paths", __doc__, "out").parse_args(argv)
    result_dir = Path(args.out or DEFAULT_OUT) / bench.device_slug() / keras.backend.backend()
    shapes = {}
    for name, (config, patches) in SHAPES.items():
        rows = measure(config, patches, log=lambda line: print(f"{name}: {line}", flush=True))
        shapes[name] = {"layer": dict(config, kernel="favor", position="kerple"), "points": rows,
                        "crossover_tokens": crossover(rows), "dense_max_tokens": dense_max(rows)}
    crossovers = [shape["crossover_tokens"] for shape in shapes.values() if shape["crossover_tokens"]]
    record = {
        "command": "python -m profiles.kerple_paths " + shlex.join(sys.argv[1:] if argv is None else argv),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        **bench.record_header(),
        "rounds": ROUNDS,
        "shapes": shapes,
        "crossover_tokens": min(crossovers) if crossovers else None,
        "dense_max_tokens": default_dense_max(shapes),
    }
    atomic.write_json(result_dir / "kerple_paths.json", record, indent=1, sort_keys=False)
    print(json.dumps({"crossover_tokens": record["crossover_tokens"], "file": str(result_dir / "kerple_paths.json")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
