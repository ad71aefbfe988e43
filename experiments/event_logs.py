"""TensorBoard event files written without TensorFlow: epoch curves, test metrics and HParams.

Keras' TensorBoard callback and ``tf.summary`` need TensorFlow, which a JAX
GPU machine does not have (installed beside a CUDA JAX it is the classic
clash of CUDA libraries). The ``tensorboard`` package writes the same files in
pure Python: `RecordWriter` frames each record (length and masked CRC32C),
``scalar_pb`` and the HParams plugin's ``*_pb`` functions build the summaries
as tf.summary would. This module uses them on both backends, so every run's
logs look alike and `tensorboard --logdir` shows curves, test metrics and
the HParams table whichever backend trained. (``tensorboard.plugins.hparams.api``
imports TensorFlow, so only its ``summary_v2`` module is used.)

Each writer appends to a new file named like TensorFlow's, so a resumed run
adds a file beside the earlier ones and TensorBoard reads them as one run; a
record cut short by a kill is the file's last and TensorBoard skips it.
"""

import itertools
import os
import socket
import time
from pathlib import Path

import keras
from tensorboard.compat.proto import event_pb2
from tensorboard.plugins.hparams import summary_v2 as hparams_summary
from tensorboard.plugins.scalar.summary_v2 import scalar_pb
from tensorboard.summary.writer.record_writer import RecordWriter

_FILE_NUMBERS = itertools.count()


class EventWriter:
    """Appends events to a fresh ``events.out.tfevents.*`` file in ``log_dir``; a context manager."""

    def __init__(self, log_dir):
        log_dir = Path(log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{time.time():.6f}.{socket.gethostname()}.{os.getpid()}.{next(_FILE_NUMBERS)}.v2"
        self._records = RecordWriter(open(log_dir / name, "wb"))
        self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

    def scalars(self, values, step):
        """One scalar per ``tag: value`` at ``step``, as ``tf.summary.scalar`` writes them."""
        for tag, value in values.items():
            self.summary(scalar_pb(tag, float(value)), step)

    def summary(self, summary, step=0):
        self._write(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

    def _write(self, event):
        self._records.write(event.SerializeToString())
        self._records.flush()

    def close(self):
        self._records.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


def write_scalars(log_dir, values, step):
    """``values`` (tag: number) at ``step`` in a new event file of ``log_dir``."""
    with EventWriter(log_dir) as writer:
        writer.scalars(values, step)


def write_hparams(log_dir, values, metrics, trial_id):
    """The experiment's columns (hyperparameter names, metric (tag, group) pairs) and this trial's values."""
    with EventWriter(log_dir) as writer:
        writer.summary(hparams_summary.hparams_config_pb(
            hparams=[hparams_summary.HParam(name) for name in values],
            metrics=[hparams_summary.Metric(tag, group=group, display_name=f"{group} {tag.removeprefix('epoch_')}")
                     for tag, group in metrics],
        ))
        writer.summary(hparams_summary.hparams_pb(values, trial_id=trial_id))


class EpochScalars(keras.callbacks.Callback):
    """The epoch logs as TensorBoard curves, laid out as Keras' TensorBoard callback lays them out.

    ``logs/train`` gets ``epoch_<name>`` of every training value and
    ``logs/validation`` ``epoch_<name>`` of every ``val_<name>``. Only epoch
    ends are touched, so Keras keeps dispatching batches asynchronously.
    """

    def __init__(self, log_dir):
        super().__init__()
        self.log_dir = Path(log_dir)
        self._writers = {}

    def on_epoch_end(self, epoch, logs=None):
        groups = {"train": {}, "validation": {}}
        for key, value in (logs or {}).items():
            group, name = ("validation", key[4:]) if key.startswith("val_") else ("train", key)
            groups[group][f"epoch_{name}"] = value
        for group, values in groups.items():
            if values:
                if group not in self._writers:
                    self._writers[group] = EventWriter(self.log_dir / group)
                self._writers[group].scalars(values, epoch)

    def on_train_end(self, logs=None):
        for writer in self._writers.values():
            writer.close()
        self._writers = {}
