"""One variant's cost, measured like nanoGPT's bench.py.

`bench_variant` builds the full ViT of a variant at a size and a dataset's
resolution and runs Keras's own compiled train step (`train_on_batch`:
forward, backward and AdamW update) on one fixed random batch: the first step
traces and compiles, `burn_in` more steps warm caches up, then `steps` steps
are timed one by one and the median is kept. Beside the time it records the
FLOPs per image counted from the compiled graph (`performer_keras.flops`)
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

import contextlib
import ctypes
import gc
import json
import math
import os
import queue
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import keras
import numpy as np

from performer_keras.evaluation import LATENCY_REPEATS, compiled_predict, device_name, measure_latency
from performer_keras.flops import analytic_attention_flops, count_flops, count_training_flops
from performer_keras.options import check_choice, check_positive
from performer_keras.registry import create_model, model_config, parse_variant

REPO = Path(__file__).resolve().parent.parent
# (image shape, classes) of the datasets the project trains on.
RESOLUTIONS = {"mnist": ((28, 28, 1), 10), "cifar10": ((32, 32, 3), 10)}
# Children talk to the parent in lines with this prefix; everything else they
# print (TensorFlow's logs) is ignored.
EVENT_PREFIX = "PROFILE-JSON "
DEFAULT_MEMORY_LIMIT = 8 * 2**30
_POLL_SECONDS = 0.05
_LATENCY_BATCH = 256


# === Memory ===


class PeakMemory:
    """Peak memory used while a `with` block runs, by the best counter the device has.

    * CPU (any backend): the rise of the process's resident set. On entry,
      freed heap goes back to the OS (`malloc_trim`) and the high-water mark
      VmHWM is reset (`/proc/self/clear_refs`); the peak is VmHWM at exit
      minus VmRSS at entry. Without /proc it is `ru_maxrss`, the peak of the
      whole process.
    * TensorFlow on a GPU: the allocator's peak (`get_memory_info`), reset on entry.
    * JAX on a GPU: `memory_stats()["peak_bytes_in_use"]` (run with
      XLA_PYTHON_CLIENT_PREALLOCATE=false). It cannot be reset, so it is the
      peak of the process: measure one thing per process.

    After the block: `bytes` (int) and `method` (str).
    """

    def __enter__(self):
        self.method, self._device = _memory_counter()
        if self.method == "tf-gpu-peak":
            import tensorflow as tf

            tf.config.experimental.reset_memory_stats(self._device)
        elif self.method == "rss-hwm":
            gc.collect()
            _malloc_trim()
            with open("/proc/self/clear_refs", "w") as file:
                file.write("5")  # 5 resets the peak resident set size (Linux >= 4.0)
            self._start = _proc_status_bytes("VmRSS")
        return self

    def __exit__(self, *exc):
        if self.method == "tf-gpu-peak":
            import tensorflow as tf

            self.bytes = int(tf.config.experimental.get_memory_info(self._device)["peak"])
        elif self.method == "jax-device-peak":
            self.bytes = int(self._device.memory_stats()["peak_bytes_in_use"])
        elif self.method == "rss-hwm":
            self.bytes = _proc_status_bytes("VmHWM") - self._start
        else:
            import resource

            self.bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return False


def _memory_counter():
    """(method, device) of `PeakMemory` for this process's backend and device."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        if tf.config.list_physical_devices("GPU"):
            return "tf-gpu-peak", "GPU:0"
    elif backend == "jax":
        import jax

        device = jax.devices()[0]
        if device.platform != "cpu" and (device.memory_stats() or {}).get("peak_bytes_in_use") is not None:
            return "jax-device-peak", device
    try:
        with open("/proc/self/clear_refs", "w") as file:
            file.write("5")
        return "rss-hwm", None
    except OSError:
        return "ru_maxrss", None


def _proc_status_bytes(field, pid="self"):
    """A `kB` field of /proc/<pid>/status in bytes; 0 when the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as file:
            for line in file:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass  # the child exited between two polls
    return 0


def _malloc_trim():
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


# === One variant ===


def random_batch(image_shape, num_classes, batch_size, seed=0):
    """Pixels in [0, 255] and integer labels: the cost does not depend on the data."""
    rng = np.random.default_rng(seed)
    images = rng.uniform(0, 255, size=(batch_size, *image_shape)).astype("float32")
    return images, rng.integers(0, num_classes, size=(batch_size,)).astype("int32")


def analytic_model_flops(image_shape, num_classes, attention, patch_size, width, depth, heads, mlp_dim,
                         num_features=64, **_):
    """Forward FLOPs of the ViT's matmuls on one image (2 per multiply-add).

        patch embedding   2 P (p^2 C) D        P patches of p x p x C pixels
        per block         `analytic_attention_flops`(N, D, H, kernel, m) + 4 N D mlp
        head              2 D classes

    with N = P + 1 tokens. Like `analytic_attention_flops` it leaves out
    normalisation, biases, softmax and the rotations and FFTs of positions,
    so the graph count comes out somewhat above it (far above for kerple's
    FFTs on JAX; TensorFlow's profiler counts no FLOPs for FFT ops at all).
    """
    rows, cols, channels = image_shape
    patches = (rows // patch_size) * (cols // patch_size)
    tokens = patches + 1
    block = analytic_attention_flops(tokens, width, heads, attention, num_features) + 4 * tokens * width * mlp_dim
    return 2 * patches * patch_size**2 * channels * width + depth * block + 2 * width * num_classes


def bench_variant(variant, dataset="mnist", size="reference", batch_size=32, burn_in=1, steps=3,
                  trace_steps=2, trace_dir=None, seed=0, **overrides):
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

    Returns: dict of plain numbers: train_step_ms (median), train_images_per_s,
    compile_seconds, params (trainable), train_flops_per_image (forward and
    backward, from the graph at batch 1), inference_flops_per_image,
    analytic_flops_per_image (forward, `analytic_model_flops`),
    peak_memory_bytes (building, compiling and training), memory_method,
    latency_ms_batch1, trace_dir and top_operations.
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
        model.compile(optimizer=keras.optimizers.AdamW(1e-3), loss="sparse_categorical_crossentropy")
        compile_seconds = _seconds(model.train_on_batch, images, labels)
        for _ in range(burn_in):
            model.train_on_batch(images, labels)
        # train_on_batch returns numpy logs, so each call waits for its step.
        seconds = [_seconds(model.train_on_batch, images, labels) for _ in range(steps)]
    step = statistics.median(seconds)

    result = dict(
        record_header(),
        variant=variant, attention=attention, position=position, dataset=dataset, size=size,
        config=config, image_shape=list(image_shape), tokens=_tokens(image_shape, config["patch_size"]),
        batch_size=batch_size, burn_in=burn_in, steps=steps,
        train_step_ms=step * 1000.0, train_step_ms_all=[s * 1000.0 for s in seconds],
        train_images_per_s=batch_size / step, compile_seconds=compile_seconds,
        params=int(sum(math.prod(w.shape) for w in model.trainable_weights)),
        peak_memory_bytes=memory.bytes, memory_method=memory.method,
    )
    _progress("trace")
    result["trace_dir"], result["top_operations"] = None, []
    if trace_dir is not None and trace_steps:
        trace_training(model, images, labels, trace_steps, trace_dir)
        result["trace_dir"], result["trace_steps"] = str(trace_dir), trace_steps
        result["top_operations"] = top_operations(trace_dir)
    _progress("flops")
    result["train_flops_per_image"] = count_training_flops(model, batch_size=1)
    result["inference_flops_per_image"] = count_flops(model, batch_size=1)
    result["analytic_flops_per_image"] = analytic_model_flops(image_shape, num_classes, attention, **config)
    _progress("latency_batch1")
    predict = compiled_predict(model)
    result["latency_ms_batch1"] = measure_latency(predict, image_shape, "float32", 1, LATENCY_REPEATS[1])
    return result


def bench_latency(variant, dataset="mnist", size="reference", batch_size=_LATENCY_BATCH, repeats=None,
                  seed=0, **overrides):
    """Inference latency per image at `batch_size` and the peak memory of measuring it.

    Returns: dict with latency_ms_batch<batch_size>, inference_peak_memory_bytes
    and memory_method. `repeats` defaults to `evaluation.LATENCY_REPEATS`.
    """
    image_shape, num_classes = RESOLUTIONS[check_choice("dataset", dataset, tuple(RESOLUTIONS))]
    keras.utils.set_random_seed(seed)
    repeats = repeats or LATENCY_REPEATS.get(batch_size, 5)
    with PeakMemory() as memory:
        model = create_model(variant, image_shape, num_classes, size, **overrides)
        latency = measure_latency(compiled_predict(model), image_shape, "float32", batch_size, repeats)
    return {f"latency_ms_batch{batch_size}": latency, "inference_peak_memory_bytes": memory.bytes,
            "memory_method": memory.method}


def record_header():
    """Which device, backend and versions produced a record."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax as backend_module
    else:
        import tensorflow as backend_module
    return dict(device=device_name(), backend=backend, backend_version=backend_module.__version__,
                keras_version=keras.__version__)


def device_slug(name=None):
    """A folder name for a device: "cpu: Intel(R) Xeon(R) Processor (2 cores)" -> "cpu-xeon-2core".

    "gpu: NVIDIA H100 80GB HBM3" -> "gpu-h100-80gb-hbm3". `name` defaults to
    `evaluation.device_name()`.
    """
    kind, _, model = (name or device_name()).partition(": ")
    cores = re.search(r"\((\d+) cores?\)", model)
    model = re.sub(r"\(\d+ cores?\)|\d+-core|\((r|tm)\)|@.*", " ", model, flags=re.I)
    words = [w for w in re.findall(r"[a-z0-9]+", model.lower())
             if w not in ("intel", "amd", "nvidia", "processor", "cpu", "core", "tm", "r")]
    return "-".join([kind.strip().lower() or "device", *words[:4], *([f"{cores.group(1)}core"] if cores else [])])


def _tokens(image_shape, patch_size):
    return (image_shape[0] // patch_size) * (image_shape[1] // patch_size) + 1


def _seconds(function, *args):
    start = time.perf_counter()
    function(*args)
    return time.perf_counter() - start


# === Trace ===


def trace_training(model, images, labels, steps, trace_dir):
    """Profile `steps` training steps into `trace_dir` (TensorBoard's Profile tab).

    `tensorboard --logdir trace_dir` shows them; the profiler writes
    `plugins/profile/<run>/<host>.xplane.pb` on both backends.
    """
    Path(trace_dir).mkdir(parents=True, exist_ok=True)
    if keras.backend.backend() == "jax":
        import jax

        start, stop = (lambda: jax.profiler.start_trace(str(trace_dir))), jax.profiler.stop_trace
    else:
        import tensorflow as tf

        start, stop = (lambda: tf.profiler.experimental.start(str(trace_dir))), tf.profiler.experimental.stop
    start()
    try:
        for _ in range(steps):
            model.train_on_batch(images, labels)
    finally:
        stop()


def top_operations(trace_dir, count=3):
    """The `count` operations with the most self time in the newest trace under `trace_dir`.

    Read from the profiler's framework op statistics (the Profile tab's
    "framework_op_stats" tool). Names are folded across blocks and layer
    instances ("block_3_attention_1/MatMul_2" -> "attention/MatMul"), so an
    operation repeated in every block counts once with its total; gradients
    are marked "(backward)". Device rows are used when there are any (GPU),
    host rows otherwise; idle time is left out.

    JAX on a CPU leaves those statistics empty: its XLA operations run as
    thunks on the runtime's own threads, so they are ranked from the trace
    events on those threads instead (`_xla_cpu_operations`).

    Returns: list of {"operation", "type", "self_ms", "share"} (share of the
    traced busy self time), most expensive first; [] when there is no trace.
    """
    files = sorted(Path(trace_dir).glob("plugins/profile/*/*.xplane.pb"), key=os.path.getmtime)
    if not files:
        return []
    from xprof.convert import raw_to_tool_data  # installed with tensorboard-plugin-profile

    return (_framework_operations(raw_to_tool_data, str(files[-1]), count)
            or _xla_cpu_operations(raw_to_tool_data, str(files[-1]), count))


def _framework_operations(raw_to_tool_data, xplane, count):
    data, _ = raw_to_tool_data.xspace_to_tool_data([xplane], "framework_op_stats", {})
    tables = json.loads(data) if data else []
    rows = []
    for table in tables if isinstance(tables, list) else [tables]:
        column = {col["id"]: i for i, col in enumerate(table.get("cols", []))}
        for row in table.get("rows", []):
            cell = [c.get("v") if c else None for c in row["c"]]
            rows.append((cell[column["host_or_device"]], cell[column["type"]],
                         cell[column["operation"]], float(cell[column["total_self_time"]] or 0.0)))
    on_device = any(where == "Device" for where, *_ in rows)
    totals = {}
    for where, op_type, name, self_us in rows:
        if op_type == "IDLE" or (where == "Device") != on_device:
            continue
        key = (_fold_op_name(name), op_type)
        totals[key] = totals.get(key, 0.0) + self_us
    return _ranked(totals, count)


def _xla_cpu_operations(raw_to_tool_data, xplane, count):
    """Operations ranked by their time on XLA's CPU threads, from the trace viewer's events."""
    data, _ = raw_to_tool_data.xspace_to_tool_data([xplane], "trace_viewer", {})
    events = json.loads(data).get("traceEvents", []) if data else []
    xla_threads = {(e.get("pid"), e.get("tid")) for e in events
                   if e.get("ph") == "M" and e.get("name") == "thread_name"
                   and str(e.get("args", {}).get("name", "")).startswith("tf_XLA")}
    totals = {}
    for event in events:
        # "Thunk::Execute"-style names are the runtime around the operations.
        if event.get("ph") != "X" or (event.get("pid"), event.get("tid")) not in xla_threads or "::" in event["name"]:
            continue
        key = (re.sub(r"\.\d+$", "", event["name"]), "XLA")  # fft.22 -> fft
        totals[key] = totals.get(key, 0.0) + float(event.get("dur", 0.0))
    return _ranked(totals, count)


def _ranked(totals, count):
    """[(name, type): microseconds] -> the `count` largest as top_operations entries."""
    busy = sum(totals.values()) or 1.0
    ranked = sorted(totals.items(), key=lambda item: -item[1])[:count]
    return [{"operation": name, "type": op_type, "self_ms": us / 1000.0, "share": us / busy}
            for (name, op_type), us in ranked if us > 0]


def _fold_op_name(name):
    """'gradient_tape/vit_x_1/block_3_attention_1/rope_3/MatMul_2' -> 'attention/rope/MatMul (backward)'."""
    backward = name.startswith("gradient_tape/")
    parts = name.split("/")[1:] if backward else name.split("/")
    if len(parts) > 1 and re.match(r"(vit|attention)_", parts[0]):
        parts = parts[1:]  # the model's own name
    parts = [re.sub(r"^block_\d+_", "", re.sub(r"_\d+$", "", part)) for part in parts]
    return "/".join(parts) + (" (backward)" if backward else "")


# === Child processes ===


def run_in_child(module, task, time_limit_s, memory_limit_bytes=DEFAULT_MEMORY_LIMIT, on_event=None, env=None):
    """Run `python -m module TASK_JSON` under a time and a memory limit.

    The child prints one `EVENT_PREFIX {json}` line per event; each is passed
    to `on_event` as a dict. The time limit counts from the last event, so a
    child doing several measurements has `time_limit_s` for each. The memory
    limit caps the child's resident set, polled every 50 ms: on a shared
    machine this stops a runaway measurement before the kernel's OOM killer
    picks a process, possibly someone else's.

    Returns: (status, detail). status is "ok" when the child exited normally,
    "timeout" or "oom" when it was stopped here (or killed by the kernel's
    OOM killer), "error" otherwise with the last line of its stderr.
    """
    env = {**os.environ, **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # so JAX's peak is what it used
    with tempfile.TemporaryFile("w+") as stderr:
        child = subprocess.Popen([sys.executable, "-m", module, json.dumps(task)], stdout=subprocess.PIPE,
                                 stderr=stderr, text=True, env=env, cwd=REPO)
        events = queue.Queue()
        reader = threading.Thread(target=_read_events, args=(child.stdout, events), daemon=True)
        reader.start()
        status, detail, finished = None, None, False
        deadline = time.monotonic() + time_limit_s
        while not finished:
            try:
                event = events.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                event = {}
            if event is None:
                finished = True
            elif event:
                deadline = time.monotonic() + time_limit_s
                if on_event:
                    on_event(event)
            elif time.monotonic() > deadline:
                status, detail = "timeout", f"no result within {time_limit_s:g} s"
            elif _proc_status_bytes("VmRSS", child.pid) > memory_limit_bytes:
                status, detail = "oom", f"resident memory over the {memory_limit_bytes / 2**30:g} GiB limit"
            if status:
                child.kill()
                break
        child.wait()
        reader.join(timeout=5)
        if status:
            return status, detail
        if child.returncode == -9:
            return "oom", "killed by SIGKILL (the kernel's OOM killer)"
        if child.returncode:
            stderr.seek(0)
            return "error", _last_error_line(stderr.read()) or f"exit status {child.returncode}"
    return "ok", None


def _read_events(stream, events):
    for line in stream:
        if line.startswith(EVENT_PREFIX):
            events.put(json.loads(line[len(EVENT_PREFIX):]))
    events.put(None)


def _last_error_line(text):
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"\w+(\.\w+)*(Error|Exception|Exhausted)\b", line)]
    return (errors or lines or [None])[-1]


def emit(event):
    """Send one event from a child to the parent (see `run_in_child`)."""
    print(EVENT_PREFIX + json.dumps(event), flush=True)


_progress_hook = None


def _progress(stage):
    """Tell a watching parent that a long measurement is still making progress."""
    if _progress_hook:
        _progress_hook(stage)


def failure(err):
    """(status, detail) of an exception raised by a measurement."""
    text = f"{type(err).__name__}: {err}"
    if isinstance(err, MemoryError) or re.search(r"RESOURCE_EXHAUSTED|ResourceExhausted|out of memory", text, re.I):
        return "oom", text.splitlines()[0][:300]
    return "error", text.splitlines()[0][:300]


# === Both measurements of a variant ===

PHASES = {"train": bench_variant, "latency": bench_latency}


def profile_variant(variant, dataset="mnist", size="reference", batch_size=32, burn_in=1, steps=3,
                    trace_steps=2, trace_dir=None, isolate=True, time_limit_s=900,
                    memory_limit_bytes=DEFAULT_MEMORY_LIMIT, **overrides):
    """`bench_variant` and `bench_latency` (batch 256) of one variant, merged into one record.

    With `isolate`, each runs in a child process under `time_limit_s` (per
    stage) and `memory_limit_bytes`; a stage that fails leaves its fields None
    and says why in `status` ({"train": "ok", "latency_batch256": "oom"})
    and `status_detail`. Returns the record (see `bench_variant`).
    """
    common = dict(variant=variant, dataset=dataset, size=size, **overrides)
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
    record.update(variant=variant, dataset=dataset, size=size, batch_size=batch_size,
                  status=status, status_detail={k: v for k, v in detail.items() if v})
    return record


# The fields every bench record has (None where a measurement failed).
BENCH_FIELDS = (
    "variant", "attention", "position", "dataset", "size", "tokens", "batch_size", "params",
    "train_step_ms", "train_images_per_s", "latency_ms_batch1", f"latency_ms_batch{_LATENCY_BATCH}",
    "train_flops_per_image", "inference_flops_per_image", "analytic_flops_per_image",
    "peak_memory_bytes", "inference_peak_memory_bytes", "trace_dir", "top_operations",
    "device", "backend",
)


def _child_main(task):
    """Entry of `python -m profiles.bench TASK_JSON`: one phase, one result event."""
    global _progress_hook
    _progress_hook = lambda stage: emit({"event": "progress", "stage": stage})
    emit({"event": "start", "phase": task["phase"]})
    try:
        result = PHASES[task["phase"]](**task["kwargs"])
        emit({"event": "result", "status": "ok", **result})
    except Exception as err:  # reported to the parent, which records it
        status, detail = failure(err)
        emit({"event": "result", "status": status, "detail": detail})


if __name__ == "__main__":
    _child_main(json.loads(sys.argv[1]))
