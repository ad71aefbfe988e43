"""Peak memory of a measurement, by the best counter the device has."""

import contextlib
import ctypes
import gc

import keras


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
            self._start = proc_status_bytes("VmRSS")
        return self

    def __exit__(self, *exc):
        if self.method == "tf-gpu-peak":
            import tensorflow as tf

            self.bytes = int(tf.config.experimental.get_memory_info(self._device)["peak"])
        elif self.method == "jax-device-peak":
            self.bytes = int(self._device.memory_stats()["peak_bytes_in_use"])
        elif self.method == "rss-hwm":
            self.bytes = proc_status_bytes("VmHWM") - self._start
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


def proc_status_bytes(field, pid="self"):
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
