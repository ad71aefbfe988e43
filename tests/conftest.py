"""Shared pytest set-up for every test module: the number of workers, a fixed global seed and a frozen heap per module."""

import gc
import os

import pytest


# Each worker holds TensorFlow and its tests' models, and some tests start train.py, the
# benchmark or the tuner beside it: with two workers one worker reached 4.9 GiB and the
# suite's processes 10.7 GiB at once (2-core Xeon, 2026-11-27), so a many-core machine with
# ordinary memory would not hold a worker per core.
MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pytest.ini): a worker per core this process may use, at most MAX_WORKERS."""
    # sched_getaffinity (the cores a container or taskset allows) is Linux's; elsewhere all of them.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(cores, MAX_WORKERS)


@pytest.fixture(autouse=True)
def fixed_global_seed():
    """Layers built with seed=None and Keras initializers draw the same numbers every run."""
    # Imported here: the xdist controller loads this file too and runs no test, and Keras
    # would start TensorFlow there for nothing (its start-up lines printed after the summary).
    import keras

    keras.utils.set_random_seed(1234)
    yield


@pytest.fixture(autouse=True, scope="module")
def frozen_heap():
    """Each module's tests collect garbage among their own objects only.

    Each worker process builds hundreds of models, and a full collection walks every live
    object: in-process profiles call `gc.collect()` before each memory reading. Freezing what
    earlier modules left (collected once here) took the profiles fixture from 188 s to 42 s and
    the whole suite, then run in one process, from 29:56 to 26:46 (idle 2-core CPU, 2026-11-26).
    """
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()
