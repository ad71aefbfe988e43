"""One variant's cost, measured like nanoGPT's bench.py.

`bench_variant` builds the full ViT of a variant at a size and a dataset's
resolution and runs Keras's own compiled train step (`train_on_batch`:
forward, backward and AdamW update) on one fixed random batch: the first step
traces and compiles, `burn_in` more steps warm caches up, then `steps` steps
are timed one by one and the median is kept. Beside the time it records the
FLOPs per image counted from the compiled graph (`experiments.flops`)
next to an analytic count of the matmuls, the parameter count, the peak
memory of building and training, a TensorBoard profiler trace of
`trace_steps` more steps with its three most expensive operations, and the
inference latency per image at batch 1. `bench_latency` measures batch 256,
the most memory-hungry measurement, on its own.

`profile_variant` runs both in child processes (`run_in_child`) with a time
and a memory limit, so that a variant which runs out of memory is recorded
with status "oom" instead of taking the machine (or a neighbour's process)
down with it. TensorFlow and JAX are used directly here on purpose: this is
profiling code, not a layer (STYLE rule 2).
"""

import datetime
import json
import math
import re
import statistics
import sys
import time
from pathlib import Path

import keras
import numpy as np

from experiments import atomic
from experiments.cli import command_line
from experiments.compiled import compiled_predict
from experiments.flops import analytic_model_flops, count_flops, count_training_flops
from experiments.latency import LATENCY_REPEATS, cpu_identity, device_name, measure_latency
from performer_keras.kernel_attention import KernelAttention
from performer_keras.options import check_choice, check_positive
from performer_keras.registry import create_model, model_config, parse_variant
from profiles.child import DEFAULT_MEMORY_LIMIT, emit, failure, progress, report_progress_as_events, run_in_child
from profiles.memory import PeakMemory
from profiles.traces import top_operations, trace_training

# (image shape, classes) of the datasets the project trains on.
RESOLUTIONS = {"mnist": ((28, 28, 1), 10), "cifar10": ((32, 32, 3), 10)}
_LATENCY_BATCH = 256


# === One variant ===


def random_batch(image_shape, num_classes, batch_size, seed=0):
    """Pixels in [0, 255] and integer labels: the cost does not depend on the data."""
    rng = np.random.default_rng(seed)
    images = rng.uniform(0, 255, size=(batch_size, *image_shape)).astype("float32")
    return images, rng.integers(0, num_classes, size=(batch_size,)).astype("int32")


def bench_variant(variant, dataset="mnist", size="reference", batch_size=32, burn_in=1, steps=3,
                  trace_steps=2, trace_dir=None, seed=0, jit_compile="auto", **overrides):
    """Training step time, FLOPs, parameters, peak memory, trace and batch-1 latency.

    Args:
        variant: a registry name ("favor-rope").
        dataset: a key of `RESOLUTIONS` (the image shape; no data is loaded).
        size: a row of `registry.SIZES`; `overrides` replace single entries
            and pass kernel options (num_features, fused, ...).
        batch_size: the training batch.
        burn_in, steps: untimed steps after the compiling one, then timed steps.
        trace_steps: steps traced by the profiler into `trace_dir` (0 or
            trace_dir None: no trace).
        jit_compile: `model.compile`'s ("auto": Keras' choice, XLA on JAX
            only on a CPU); the batch-1 latency compiles as the step did.

    Returns: dict of plain numbers: train_step_ms (median), train_images_per_s,
    compile_seconds, params (trainable), train_flops_per_image (forward and
    backward, from the graph at batch 1), inference_flops_per_image,
    analytic_flops_per_image (forward, `analytic_model_flops`),
    peak_memory_bytes (building, compiling and training), memory_method,
    latency_ms_batch1, trace_dir, top_operations and xla (whether the step
    was compiled with XLA).
    """
    for name, value in (("batch_size", batch_size), ("steps", steps)):
        check_positive(name, value)
    image_shape, num_classes = RESOLUTIONS[check_choice("dataset", dataset, tuple(RESOLUTIONS))]
    attention, position = parse_variant(variant)
    config = model_config(size, **overrides)
    keras.utils.set_random_seed(seed)
    images, labels = random_batch(image_shape, num_classes, batch_size, seed)

    with PeakMemory() as memory:
        model = create_model(variant, image_shape, num_classes, size, **overrides)
        model.compile(optimizer=keras.optimizers.AdamW(1e-3), loss="sparse_categorical_crossentropy",
                      jit_compile=jit_compile)
        compile_seconds = _seconds(model.train_on_batch, images, labels)
        for _ in range(burn_in):
            model.train_on_batch(images, labels)
        # train_on_batch returns numpy logs, so each call waits for its step.
        seconds = [_seconds(model.train_on_batch, images, labels) for _ in range(steps)]
    step = statistics.median(seconds)

    result = dict(
        record_header(),
        variant=variant, attention=attention, position=position, dataset=dataset, size=size,
        config=config, image_shape=list(image_shape), tokens=token_count(image_shape, config["patch_size"]),
        batch_size=batch_size, burn_in=burn_in, steps=steps,
        train_step_ms=step * 1000.0, train_step_ms_all=[s * 1000.0 for s in seconds],
        train_images_per_s=batch_size / step, compile_seconds=compile_seconds,
        params=int(sum(math.prod(w.shape) for w in model.trainable_weights)),
        peak_memory_bytes=memory.bytes, memory_method=memory.method,
        toeplitz_path=toeplitz_path_of(model), xla=bool(model.jit_compile),
    )
    progress("trace")
    result["trace_dir"], result["top_operations"] = None, []
    if trace_dir is not None and trace_steps:
        trace_training(model, images, labels, trace_steps, trace_dir)
        result["trace_dir"], result["trace_steps"] = str(trace_dir), trace_steps
        result["top_operations"] = top_operations(trace_dir)
    progress("flops")
    result["train_flops_per_image"] = count_training_flops(model, batch_size=1)
    result["inference_flops_per_image"] = count_flops(model, batch_size=1)
    result["analytic_flops_per_image"] = analytic_model_flops(image_shape, num_classes, attention, **config)
    progress("latency_batch1")
    predict = compiled_predict(model, result["xla"])
    result["latency_ms_batch1"] = measure_latency(predict, image_shape, "float32", 1, LATENCY_REPEATS[1])
    return result


def bench_latency(variant, dataset="mnist", size="reference", batch_size=_LATENCY_BATCH, repeats=None,
                  seed=0, jit_compile=False, **overrides):
    """Inference latency per image at `batch_size` and the peak memory of measuring it.

    `jit_compile`: TensorFlow's forward pass with XLA (JAX's always is).

    Returns: dict with latency_ms_batch<batch_size>, inference_peak_memory_bytes
    and memory_method. `repeats` defaults to `latency.LATENCY_REPEATS`.
    """
    image_shape, num_classes = RESOLUTIONS[check_choice("dataset", dataset, tuple(RESOLUTIONS))]
    keras.utils.set_random_seed(seed)
    repeats = repeats or LATENCY_REPEATS.get(batch_size, 5)
    with PeakMemory() as memory:
        model = create_model(variant, image_shape, num_classes, size, **overrides)
        latency = measure_latency(compiled_predict(model, jit_compile), image_shape, "float32", batch_size, repeats)
    return {f"latency_ms_batch{batch_size}": latency, "inference_peak_memory_bytes": memory.bytes,
            "memory_method": memory.method}


def toeplitz_path_of(model):
    """The exact KERPLE path (`toeplitz_path_used`) of `model`'s first attention layer: None unless a linear kernel with kerple."""
    return next((layer.toeplitz_path_used for layer in model.layers if isinstance(layer, KernelAttention)), None)


def record_header():
    """Which device, backend and versions produced a record."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax as backend_module
    else:
        import tensorflow as backend_module
    return dict(device=device_name(), cpu=cpu_identity(), backend=backend, backend_version=backend_module.__version__,
                keras_version=keras.__version__)


def write_record(out, name, module, argv, **fields):
    """Write <out>/<device>/<backend>/<name>.json: the command that made it, the date, `record_header()`, `fields`.

    `argv` is the command line `main` was given (None: the process's own). Returns the path.
    """
    path = Path(out) / device_slug() / keras.backend.backend() / f"{name}.json"
    record = {"command": command_line(module, argv),
              "date": datetime.datetime.now().isoformat(timespec="seconds"), **record_header(), **fields}
    atomic.write_json(path, record, indent=1, sort_keys=False)
    return path


def device_slug(name=None):
    """A folder name for a device: "cpu: Intel(R) Xeon(R) Processor (2 cores)" -> "cpu-xeon-2core".

    "gpu: NVIDIA H100 80GB HBM3" -> "gpu-h100-80gb-hbm3". `name` defaults to
    `latency.device_name()`.
    """
    kind, _, model = (name or device_name()).partition(": ")
    cores = re.search(r"\((\d+) cores?\)", model)
    model = re.sub(r"\(\d+ cores?\)|\d+-core|\((r|tm)\)|@.*", " ", model, flags=re.I)
    words = [w for w in re.findall(r"[a-z0-9]+", model.lower())
             if w not in ("intel", "amd", "nvidia", "processor", "cpu", "core", "tm", "r")]
    return "-".join([kind.strip().lower() or "device", *words[:4], *([f"{cores.group(1)}core"] if cores else [])])


def token_count(image_shape, patch_size):
    """Tokens of the ViT on `image_shape` images: its patches and the CLS token."""
    return (image_shape[0] // patch_size) * (image_shape[1] // patch_size) + 1


def _seconds(function, *args):
    start = time.perf_counter()
    function(*args)
    return time.perf_counter() - start


# === Both measurements of a variant ===

PHASES = {"train": bench_variant, "latency": bench_latency}


def profile_variant(variant, dataset="mnist", size="reference", batch_size=32, burn_in=1, steps=3,
                    trace_steps=2, trace_dir=None, isolate=True, time_limit_s=900,
                    memory_limit_bytes=DEFAULT_MEMORY_LIMIT, jit_compile=False, **overrides):
    """`bench_variant` and `bench_latency` (batch 256) of one variant, merged into one record.

    `jit_compile`: TensorFlow's step and forward passes with XLA (JAX's
    always are); the record says which (`xla`).

    With `isolate`, each runs in a child process under `time_limit_s` (per
    stage) and `memory_limit_bytes`; a stage that fails leaves its fields None
    and says why in `status` ({"train": "ok", "latency_batch256": "oom"})
    and `status_detail`. Returns the record (see `bench_variant`).
    """
    xla = keras.backend.backend() != "tensorflow" or jit_compile
    common = dict(variant=variant, dataset=dataset, size=size, jit_compile=xla, **overrides)
    phases = {
        "train": dict(common, batch_size=batch_size, burn_in=burn_in, steps=steps, trace_steps=trace_steps,
                      trace_dir=None if trace_dir is None else str(trace_dir)),
        f"latency_batch{_LATENCY_BATCH}": dict(common),
    }
    record, status, detail = {}, {}, {}
    for phase, kwargs in phases.items():
        function = "train" if phase == "train" else "latency"
        if isolate:
            results = []
            status[phase], detail[phase] = run_in_child(
                "profiles.bench", {"phase": function, "kwargs": kwargs}, time_limit_s, memory_limit_bytes,
                on_event=lambda event: results.append(event) if event.get("event") == "result" else None,
            )
            result = results[-1] if results else {}
            if result.get("status", "ok") != "ok":
                status[phase], detail[phase] = result["status"], result.get("detail")
        else:
            try:
                result = PHASES[function](**kwargs)
                status[phase], detail[phase] = "ok", None
            except Exception as err:  # recorded, like a child's failure
                result = {}
                status[phase], detail[phase] = failure(err)
        record.update({k: v for k, v in result.items() if k not in ("event", "status", "memory_method")})
        if "memory_method" in result:
            record.setdefault("memory_method", result["memory_method"])
    for key in BENCH_FIELDS:
        record.setdefault(key, None)
    record.update(variant=variant, dataset=dataset, size=size, batch_size=batch_size, xla=xla,
                  status=status, status_detail={k: v for k, v in detail.items() if v})
    return record


# The fields every bench record has (None where a measurement failed).
BENCH_FIELDS = (
    "variant", "attention", "position", "dataset", "size", "tokens", "batch_size", "params",
    "train_step_ms", "train_images_per_s", "latency_ms_batch1", f"latency_ms_batch{_LATENCY_BATCH}",
    "train_flops_per_image", "inference_flops_per_image", "analytic_flops_per_image",
    "peak_memory_bytes", "inference_peak_memory_bytes", "trace_dir", "top_operations",
    "device", "backend", "toeplitz_path", "xla",
)


def _child_main(task):
    """Entry of `python -m profiles.bench TASK_JSON`: one phase, one result event."""
    report_progress_as_events()
    emit({"event": "start", "phase": task["phase"]})
    try:
        result = PHASES[task["phase"]](**task["kwargs"])
        emit({"event": "result", "status": "ok", **result})
    except Exception as err:  # reported to the parent, which records it
        status, detail = failure(err)
        emit({"event": "result", "status": status, "detail": detail})


if __name__ == "__main__":
    _child_main(json.loads(sys.argv[1]))
