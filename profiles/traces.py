"""Profiler traces of training steps (TensorBoard's Profile tab) and their most expensive operations."""

import json
import os
import re
from pathlib import Path

import keras


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
    events on those threads instead (`_xla_cpu_operations`). TensorFlow on
    a CPU traces neither for a step compiled with XLA: its statistics hold the
    whole step as one operation ("__inference_one_step_on_data"), and only a
    step without XLA shows TensorFlow's own operations.

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
