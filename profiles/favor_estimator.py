"""How well favor-kerple estimates softmax-kerple, by the number of features m and the norm of q and k.

    python -m profiles.favor_estimator    # -> profiles/results/<device>/<backend>/favor_estimator.json

Two `KernelAttention` layers with the same weights (q, k, v and output
projections and the same learned Toeplitz bias, drawn at random), one softmax,
one FAVOR+ with m random features: the relative error
|out_favor - out_softmax| / |out_softmax| over a batch of random tokens, the
median over `TRIALS` feature draws. At head dimension d = 32 (the reference
size's), N = 65 tokens, for m in `FEATURES` and q, k normalised to
`qk_norm` x sqrt(d) for each of `QK_NORMS` (1.0 is Luo et al.'s norm, 0.25
`registry.DEFAULT_QK_NORM`). A Monte Carlo estimate improves as 1/sqrt(m) at
best, so the error should fall 4 times from m = 64 to m = 1,024; where it does
not, the estimator is in its high-variance range (exp(|q|^2) weights). The
fall is also fitted: the slope of log error against log m between m = 64 and
1,024, per draw of weights and inputs, with its 95% t-interval over draws
(`slope_interval`); -0.5 is the Monte Carlo rate.
"""

import datetime
import functools
import statistics
import sys
from pathlib import Path

from experiments.cli import command_line, parser, start_backend

start_backend()  # before the imports below load Keras: why, in the docstring of profiles/__init__.py

import keras
import numpy as np

from experiments import atomic, significance
from performer_keras.kernel_attention import KernelAttention
from performer_keras.registry import DEFAULT_QK_NORM
from profiles import bench
from profiles.__main__ import DEFAULT_OUT

FEATURES = (16, 64, 256, 1024)
QK_NORMS = (1.0, 0.5, DEFAULT_QK_NORM)
TRIALS = 8
SLOPE_FEATURES = (64, 128, 256, 512, 1024)
HEADS, HEAD_DIM, GRID, BATCH = 2, 32, (8, 8), 4


@functools.cache  # the error table and the slopes share their (m, norm, seed) points
def relative_error(num_features, qk_norm, seed, bias_scale=0.5):
    """|favor-kerple - softmax-kerple| / |softmax-kerple| of one feature draw, same weights and inputs."""
    rng = np.random.default_rng(seed)
    tokens, width = 1 + GRID[0] * GRID[1], HEADS * HEAD_DIM
    x = rng.normal(size=(BATCH, tokens, width)).astype("float32")
    common = dict(num_heads=HEADS, position="kerple", grid_size=GRID, qk_norm=qk_norm)
    softmax = KernelAttention(kernel_name="softmax", **common)
    favor = KernelAttention(kernel_name="favor", num_features=num_features, seed=seed, **common)
    softmax(x), favor(x)
    for name in ("query", "key", "value", "output_dense"):
        for target, source in zip(getattr(favor, name).weights, getattr(softmax, name).weights):
            target.assign(source)
    softmax.toeplitz.bias.assign(rng.normal(size=softmax.toeplitz.bias.shape).astype("float32") * bias_scale)
    favor.toeplitz.bias.assign(softmax.toeplitz.bias)
    exact, estimate = (np.asarray(keras.ops.convert_to_numpy(layer(x)), "float64") for layer in (softmax, favor))
    return float(np.linalg.norm(estimate - exact) / np.linalg.norm(exact))


def error_table(features=FEATURES, qk_norms=QK_NORMS, trials=TRIALS):
    """{qk_norm: {m: median relative error over `trials` draws}}."""
    return {
        norm: {m: statistics.median(relative_error(m, norm, seed) for seed in range(trials)) for m in features}
        for norm in qk_norms
    }


def slope_interval(qk_norm, features=SLOPE_FEATURES, trials=TRIALS):
    """The fall of the error with m: {"mean", "ci95", "slopes"} of d log(error) / d log(m) over draws.

    Draw s fixes the weights and inputs (seed s) and redraws the features at
    each m; its slope is the least-squares fit over `features`.
    """
    logs = np.log(features)
    slopes = [float(np.polyfit(logs, np.log([relative_error(m, qk_norm, seed) for m in features]), 1)[0])
              for seed in range(trials)]
    return {"mean": float(np.mean(slopes)), "ci95": significance.t_interval(slopes), "slopes": slopes}


def main(argv=None):
    args = parser("python -m profiles.favor_estimator", __doc__, "out").parse_args(argv)
    result_dir = Path(args.out or DEFAULT_OUT) / bench.device_slug() / keras.backend.backend()
    table = error_table()
    record = {
        "command": command_line("profiles.favor_estimator", argv),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        **bench.record_header(),
        "setting": dict(heads=HEADS, head_dim=HEAD_DIM, grid=list(GRID), tokens=1 + GRID[0] * GRID[1], batch=BATCH,
                        trials=TRIALS, bias_scale=0.5),
        "relative_error": {str(norm): {str(m): error for m, error in row.items()} for norm, row in table.items()},
        "fall_from_m64_to_m1024": {str(norm): row[64] / row[1024] for norm, row in table.items()},
        "default_qk_norm": DEFAULT_QK_NORM,
        "slope_features": list(SLOPE_FEATURES),
        "slope": {str(norm): slope_interval(norm) for norm in QK_NORMS},
    }
    atomic.write_json(result_dir / "favor_estimator.json", record, indent=1, sort_keys=False)
    for norm, row in table.items():
        slope = record["slope"][str(norm)]
        print(f"qk_norm {norm}: " + ", ".join(f"m={m} {error:.3f}" for m, error in row.items())
              + f"; slope {slope['mean']:.3f} [{slope['ci95'][0]:.3f}, {slope['ci95'][1]:.3f}]")
    print(f"written: {result_dir / 'favor_estimator.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
