"""Inference latency per image, and the name of the device it was measured on."""

import os
import platform
import statistics
import time

import keras
import numpy as np

from performer_keras.options import check_positive

# Batch 1 is cheap and noisy, batch 256 is slow and steady.
LATENCY_REPEATS = {1: 30, 256: 5}
_WARMUP_CALLS = 2


def measure_latency(predict_fn, image_shape, dtype, batch_size, repeats):
    """Milliseconds per image of `predict_fn` on one batch: median of warm runs.

    The first calls trace and compile, so `_WARMUP_CALLS` calls run untimed;
    each timed call converts the result to numpy, which waits for
    asynchronous backends (JAX, GPUs) to finish.

    Args:
        predict_fn: images (batch_size, *image_shape) of `dtype` -> outputs.
        image_shape: (H, W, C). dtype: input dtype ("float32", "uint8").
        batch_size, repeats: the batch and the number of timed calls.

    Returns: float, median seconds per call * 1000 / batch_size.
    """
    check_positive("batch_size", batch_size)
    check_positive("repeats", repeats)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(batch_size, *image_shape)).astype(dtype)
    for _ in range(_WARMUP_CALLS):
        np.asarray(predict_fn(images))
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.asarray(predict_fn(images))
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds) * 1000.0 / batch_size


def device_name(backend=None):
    """The device the backend computes on, e.g. "cpu: Intel(R) Xeon(R) (2 cores)".

    The first accelerator if there is one ("gpu: NVIDIA H100 80GB HBM3"),
    else the CPU model from /proc/cpuinfo and the cores this process may use.
    """
    backend = backend or keras.backend.backend()
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        if device.platform != "cpu":
            return f"{device.platform}: {device.device_kind}"
    elif backend == "tensorflow":
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            details = tf.config.experimental.get_device_details(gpus[0])
            return f"gpu: {details.get('device_name', gpus[0].name)}"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"cpu: {_cpu_model()} ({cores} cores)"


def _cpu_model():
    return cpu_identity().get("model_name") or platform.processor() or platform.machine()


def cpu_identity(cpuinfo="/proc/cpuinfo"):
    """The first processor's model name, vendor, family, model and stepping from `cpuinfo`, the fields it has; {}
    where it cannot be read (not Linux).

    A virtual machine may show a bare "AMD EPYC" for every generation: two
    2-core machines of that name ran this project's square matmuls 5x apart
    (profiles/README.md, "How fast is this machine?"), so training sessions
    and profile records keep this beside `device_name`, which the report
    and forecast group by.
    """
    fields = {"model name": "model_name", "vendor_id": "vendor", "cpu family": "family", "model": "model",
              "stepping": "stepping"}
    identity = {}
    try:
        with open(cpuinfo) as file:
            for line in file:
                key, _, value = line.partition(":")
                if not line.strip():
                    break  # the first processor's block ends: the others repeat it
                if key.strip() in fields:
                    identity[fields[key.strip()]] = value.strip()
    except OSError:
        pass  # not Linux: the caller falls back to what platform knows
    return identity
