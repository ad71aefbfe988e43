"""How cost grows with the number of tokens N: a sweep, exponents, crossovers.

Each series is one attention kernel x position (plus, with `fused`, softmax
through `ops.dot_product_attention`, the flash path where a backend has one).
A series runs over patch grids of 8x8 .. 128x128 (64 .. 16,384 patches; one
CLS token more) in one of two scopes, at fixed width (`SCALING_CONFIG`):

    layer   one `KernelAttention` alone on (batch, N, width) inputs
    model   the whole ViT (patch size 4, so a 128x128 grid is a 512x512 image)

and two modes, each compiled once (a `tf.function`, with XLA if `jit_compile`,
or a `jax.jit`):

    forward  inference pass
    train    forward and backward pass: the gradient of a loss with respect
             to every trainable weight (mean square of the output for the
             layer, cross-entropy for the model); no optimizer update

For each point: the first call compiles, then up to `steps` calls are timed
(fewer when they pass `max_seconds`) and the median kept; peak memory of
building and running (`memory.PeakMemory`); forward FLOPs from the graph
(`flops.count_flops`) beside the analytic count; for a linear kernel with
kerple, the exact path `"auto"` took (`toeplitz_path`). A series runs in a child
process under a time limit per point and a memory limit: a point that runs out
of either is recorded as "oom" / "timeout" / "error", the same mode is
skipped ("skipped") at larger N (it would need even more), and the sweep goes on.

`fit_exponent` fits cost ~ N^k by least squares on log-log of the largest
points; `crossover` finds the N from which a linear kernel stays faster than
softmax, interpolated on log-log between the two measured points around it.
"""

import gc
import json
import math
import statistics
import sys
import time

import keras
import numpy as np

from experiments.compiled import compiled_predict
from experiments.flops import analytic_attention_flops, analytic_model_flops, count_flops
from performer_keras.kernel_attention import KernelAttention
from performer_keras.options import check_choice, check_positive
from performer_keras.registry import create_model, variant_name
from profiles import DEFAULT_PATCHES, SCOPES, bench
from profiles.child import DEFAULT_MEMORY_LIMIT, emit, failure, run_in_child
from profiles.memory import PeakMemory

# Fixed width, and batch 1: softmax at N = 16,385 holds 2 heads x N^2 float32
# weights, 2 GiB, before its backward pass.
# One block in the model scope: deeper models repeat the same block, which
# scales every time by the depth and moves no crossover.
SCALING_CONFIG = dict(width=64, heads=2, num_features=64, batch_size=1,
                      depth=1, mlp_dim=128, patch_size=4, channels=3, num_classes=10)
MODES = ("forward", "train")
MAX_CALLS, CHEAP_SECONDS = 25, 1.0
# Points of a series that `fit_exponent` fits by default: the largest N.
FIT_POINTS = 4


def grid_for(patches):
    """The squarest (rows, cols) grid with `patches` cells: 128 -> (8, 16)."""
    check_positive("patches", patches)
    rows = max(r for r in range(1, math.isqrt(patches) + 1) if patches % r == 0)
    return rows, patches // rows


def series_name(kernel, position, fused=False):
    """'favor-rope'; fused softmax is 'softmax-fused-rope'."""
    return variant_name(f"{kernel}-fused" if fused else kernel, position)


# === One point ===


def build_subject(scope, kernel, position, grid, fused=False, config=SCALING_CONFIG, **options):
    """The layer alone (wrapped in a functional model) or the whole ViT for `grid`; `options` go to every attention layer."""
    check_choice("scope", scope, SCOPES)
    if scope == "layer":
        tokens = 1 + grid[0] * grid[1]
        inputs = keras.Input((tokens, config["width"]), name="tokens")
        layer = KernelAttention(config["heads"], kernel, position, grid_size=grid, num_prefix_tokens=1,
                                num_features=config["num_features"], fused=fused, name="attention", **options)
        return keras.Model(inputs, layer(inputs), name=f"attention_{kernel}_{position}")
    patch = config["patch_size"]
    image_shape = (grid[0] * patch, grid[1] * patch, config["channels"])
    architecture = {k: config[k] for k in ("width", "depth", "heads", "mlp_dim", "patch_size", "num_features")}
    return create_model(variant_name(kernel, position), image_shape, config["num_classes"], "small",
                        fused=fused, **architecture, **options)


def subject_inputs(scope, model, config=SCALING_CONFIG, seed=0):
    """(inputs, labels) for one batch of `model`."""
    rng = np.random.default_rng(seed)
    shape = (config["batch_size"], *model.inputs[0].shape[1:])
    if scope == "layer":
        inputs = rng.standard_normal(shape).astype("float32")
    else:
        inputs = rng.uniform(0, 255, shape).astype("float32")
    return inputs, np.zeros((config["batch_size"],), "int32")


def compiled_passes(model, scope, jit_compile=False):
    """(forward(x), train(x, y)) compiled for the backend; both return arrays to wait on.

    `jit_compile`: TensorFlow's passes with XLA (JAX's are always XLA's).
    """
    if scope == "layer":
        loss_fn = lambda labels, outputs: keras.ops.mean(keras.ops.square(outputs))
    else:
        loss_fn = lambda labels, outputs: keras.ops.mean(
            keras.losses.sparse_categorical_crossentropy(labels, outputs))
    forward = compiled_predict(model, jit_compile)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        @tf.function(autograph=False, jit_compile=jit_compile)
        def train(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            return loss, tape.gradient(loss, model.trainable_variables)

        return forward, train
    import jax

    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    def loss(trainable, non_trainable, x, y):
        return loss_fn(y, model.stateless_call(trainable, non_trainable, x, training=True)[0])

    grad = jax.jit(jax.value_and_grad(loss))
    return forward, (lambda x, y: grad(trainable, non_trainable, x, y))


def time_calls(function, args, steps=3, max_seconds=20.0):
    """Compile-and-run once, then time `steps` calls and keep the median.

    Timing stops early once the timed calls pass `max_seconds` (at least one
    is timed), and goes on up to `MAX_CALLS` while they stay under
    `CHEAP_SECONDS` in all: millisecond calls on a shared machine need more
    than three samples for a steady median. A compiling call that alone
    takes over `max_seconds` is the measurement (`cold`: True): tracing and
    compiling add a second or two, a few percent of such a call, and a
    second call would double the cost of the largest points. Every result
    is copied to numpy, which waits for asynchronous backends.

    Returns: dict(ms=median, ms_all=[...], compile_s, cold).
    """
    wait = lambda result: keras.tree.map_structure(np.asarray, result)
    start = time.perf_counter()
    wait(function(*args))
    compile_s = time.perf_counter() - start
    if compile_s > max_seconds:
        return dict(ms=compile_s * 1000.0, ms_all=[], compile_s=compile_s, cold=True)
    seconds = []
    while not seconds or (len(seconds) < steps and sum(seconds) < max_seconds) or (
            len(seconds) < MAX_CALLS and sum(seconds) < CHEAP_SECONDS):
        start = time.perf_counter()
        wait(function(*args))
        seconds.append(time.perf_counter() - start)
    return dict(ms=statistics.median(seconds) * 1000.0, ms_all=[s * 1000.0 for s in seconds], compile_s=compile_s,
                cold=False)


def measure_point(scope, kernel, position, patches, mode, fused=False, config=SCALING_CONFIG, steps=3,
                  max_seconds=20.0, jit_compile=False):
    """One (N, mode) point: time, peak memory and (forward) FLOPs. Raises on failure."""
    grid = grid_for(patches)
    with PeakMemory() as memory:
        model = build_subject(scope, kernel, position, grid, fused, config)
        inputs, labels = subject_inputs(scope, model, config)
        forward, train = compiled_passes(model, scope, jit_compile)
        function, args = (forward, (inputs,)) if mode == "forward" else (train, (inputs, labels))
        timing = time_calls(function, args, steps, max_seconds)
    result = dict(status="ok", peak_bytes=memory.bytes, memory_method=memory.method,
                  toeplitz_path=bench.toeplitz_path_of(model), **timing)
    if mode == "forward":
        batch = config["batch_size"]
        result["flops"] = _optional(lambda: count_flops(model, batch_size=batch) // batch)
        result["analytic_flops"] = analytic_flops(scope, kernel, grid, config)
    return result


def analytic_flops(scope, kernel, grid, config=SCALING_CONFIG):
    """Analytic forward FLOPs per example (matmuls only; see `flops.analytic_attention_flops`)."""
    tokens = 1 + grid[0] * grid[1]
    if scope == "layer":
        return analytic_attention_flops(tokens, config["width"], config["heads"], kernel, config["num_features"])
    patch = config["patch_size"]
    image_shape = (grid[0] * patch, grid[1] * patch, config["channels"])
    architecture = {k: config[k] for k in ("width", "depth", "heads", "mlp_dim", "patch_size", "num_features")}
    return analytic_model_flops(image_shape, config["num_classes"], kernel, **architecture)


def _optional(function):
    try:
        return function()
    except Exception:  # a count that cannot be made is missing, not a failed point
        return None


# A child stops after a point that peaked above this, and the parent starts a fresh one for the
# rest: the allocators keep what a large point used and the memory limit polls the resident set,
# so a large point would otherwise fail the limit on memory an earlier one left behind.
FRESH_CHILD_AFTER_BYTES = 2**30


def run_tasks(task, emit):
    """Measure task["points"] ([patches, mode] pairs) in order; stop at the first failure.

    Each point sends a "start" event, then a "result" event (with status "ok"
    or the failure). The backend state is cleared between points; after a
    point whose peak passed `FRESH_CHILD_AFTER_BYTES` the child stops, and
    the parent measures the remaining points in a new one.
    """
    for patches, mode in task["points"]:
        emit({"event": "start", "patches": patches, "mode": mode})
        try:
            result = measure_point(task["scope"], task["kernel"], task["position"], patches, mode,
                                   task.get("fused", False), task["config"], task["steps"], task["max_seconds"],
                                   task.get("jit_compile", False))
        except Exception as err:  # recorded by the parent, which decides what to skip
            status, detail = failure(err)
            result = dict(status=status, detail=detail)
        emit({"event": "result", "patches": patches, "mode": mode, **result})
        keras.backend.clear_session()
        gc.collect()
        if result["status"] != "ok" or (result.get("peak_bytes") or 0) > FRESH_CHILD_AFTER_BYTES:
            return


# === A series ===


def run_series(scope, kernel, position, fused=False, patches=DEFAULT_PATCHES, modes=MODES, config=SCALING_CONFIG,
               steps=3, max_seconds=20.0, isolate=True, time_limit_s=120, memory_limit_bytes=DEFAULT_MEMORY_LIMIT,
               points_per_child=None, log=None, jit_compile=False):
    """One kernel x position over `patches`, each point in `modes`; returns the series record.

    With `isolate`, points run in child processes (`points_per_child` each,
    default all of them: a restart costs a backend import) under
    `time_limit_s` per point and `memory_limit_bytes`. A failed (N, mode) is
    recorded with its status; that mode is then "skipped" at every larger N,
    and after a failed forward pass so is the train pass at the same N.
    `jit_compile`: TensorFlow's passes with XLA (JAX's always are); the
    record says which (`xla`).
    """
    check_choice("scope", scope, SCOPES)
    for mode in modes:
        check_choice("mode", mode, MODES)
    patches = sorted(set(int(p) for p in patches))
    results = {(p, m): None for p in patches for m in modes}

    def record(patches_, mode, result):
        results[(patches_, mode)] = result
        if log:
            log(scope, series_name(kernel, position, fused), patches_, mode, result)
        if result["status"] == "ok":
            return
        for (p, m), value in results.items():
            later = p > patches_ or (p == patches_ and mode == "forward")
            if value is None and later and (m == mode or mode == "forward"):
                results[(p, m)] = dict(status="skipped", detail=f"{mode} {result['status']} at {patches_} patches")

    task = dict(scope=scope, kernel=kernel, position=position, fused=fused, config=config, steps=steps,
                max_seconds=max_seconds, jit_compile=jit_compile)
    while True:
        pending = [[p, m] for (p, m), value in results.items() if value is None]
        if not pending:
            break
        task["points"] = pending[:points_per_child] if points_per_child else pending
        if not isolate:
            run_tasks(task, lambda event: event["event"] == "result" and record(
                event["patches"], event["mode"], _strip(event)))
            continue
        running = []

        def on_event(event):
            if event["event"] == "start":
                running[:] = [(event["patches"], event["mode"])]
            elif event["event"] == "result":
                running.clear()
                record(event["patches"], event["mode"], _strip(event))

        status, detail = run_in_child("profiles.scaling", task, time_limit_s, memory_limit_bytes, on_event)
        if status != "ok" and not running and results[tuple(task["points"][0])] is None:
            running = [tuple(task["points"][0])]  # it died before its first point started
        if running:  # the child died inside a point: that point failed
            record(*running[0], dict(status=status if status != "ok" else "error", detail=detail))
    return dict(
        scope=scope, series=series_name(kernel, position, fused), kernel=kernel, position=position, fused=fused,
        config=config, steps=steps, max_seconds=max_seconds, time_limit_s=time_limit_s,
        memory_limit_bytes=memory_limit_bytes, xla=keras.backend.backend() != "tensorflow" or jit_compile,
        **bench.record_header(),
        points=[_point(p, {m: results[(p, m)] for m in modes}) for p in patches],
    )


def _strip(event):
    return {k: v for k, v in event.items() if k not in ("event", "patches", "mode")}


def _point(patches, modes):
    grid = grid_for(patches)
    return dict(patches=patches, grid=list(grid), tokens=patches + 1, **modes)


# === Analysis ===


def ok_points(series, mode, quantity="ms"):
    """[(tokens, value)] of the points of `series` where `mode` succeeded."""
    return [(p["tokens"], p[mode][quantity]) for p in series["points"]
            if p.get(mode) and p[mode]["status"] == "ok" and p[mode].get(quantity)]


def fit_exponent(series, mode="forward", quantity="ms", largest=FIT_POINTS):
    """k of cost ~ N^k: least squares on log-log of the `largest` successful points.

    The largest points, because at small N fixed costs (projections, call
    overhead) hide the asymptotic growth. Returns dict(exponent, from_tokens,
    to_tokens, points), or None with fewer than two points.
    """
    points = sorted(ok_points(series, mode, quantity))[-largest:]
    if len(points) < 2:
        return None
    tokens, values = np.log([p[0] for p in points]), np.log([max(p[1], 1e-12) for p in points])
    slope = float(np.polyfit(tokens, values, 1)[0])
    return dict(exponent=slope, from_tokens=points[0][0], to_tokens=points[-1][0], points=len(points))


def crossover(linear, softmax, mode="forward", quantity="ms"):
    """The N from which `linear` stays cheaper than `softmax` (two series records).

    Over the token counts both measured, r(N) = linear / softmax. The
    crossover lies between the last N with r >= 1 and the next one; it is
    interpolated where log r crosses 0, linearly in log N.

    Returns a dict with `kind`:
        "interpolated"  tokens = the crossover, between = the two measured N
        "below"         cheaper at every measured N: tokens = the smallest
        "none"          never cheaper: up_to = the largest N both measured;
                        softmax_failed = the smallest N where softmax did not
                        run (failed, or skipped after failing at a smaller N
                        or in the forward pass) while `linear` still ran, if any
        "no-data"       no N measured by both
    """
    lin, soft = dict(ok_points(linear, mode, quantity)), dict(ok_points(softmax, mode, quantity))
    common = sorted(set(lin) & set(soft))
    if not common:
        return dict(kind="no-data", tokens=None)
    ratio = [lin[n] / soft[n] for n in common]
    slower = [i for i, r in enumerate(ratio) if r >= 1.0]
    if not slower:
        return dict(kind="below", tokens=common[0], ratios=dict(zip(common, ratio)))
    i = slower[-1]
    if i == len(common) - 1:
        failed = [p["tokens"] for p in softmax["points"]
                  if p.get(mode) and p[mode]["status"] != "ok" and p["tokens"] in lin]
        return dict(kind="none", tokens=None, up_to=common[-1], softmax_failed=min(failed) if failed else None,
                    ratios=dict(zip(common, ratio)))
    (n0, r0), (n1, r1) = (common[i], ratio[i]), (common[i + 1], ratio[i + 1])
    fraction = math.log(r0) / (math.log(r0) - math.log(r1))
    tokens = math.exp(math.log(n0) + fraction * (math.log(n1) - math.log(n0)))
    return dict(kind="interpolated", tokens=tokens, between=[n0, n1], ratios=dict(zip(common, ratio)))


if __name__ == "__main__":
    # One tiny point first, unrecorded, so that the start-up of a fresh
    # runtime (thread pools, kernel caches) is not charged to the first point.
    _optional(lambda: measure_point("layer", "softmax", "absolute", 16, "train", steps=1))
    keras.backend.clear_session()
    run_tasks(json.loads(sys.argv[1]), emit)
