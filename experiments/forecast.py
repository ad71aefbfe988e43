"""How long the benchmark's queued runs will take, from the epochs of runs like them.

`timing` is one run's expected time, which `benchmark --max-minutes` checks
before it starts a run; `forecast` sums the queue's per part for `benchmark
--list` and the report's "Compute" section. Epoch times come from each run's
history.csv, the device from its metrics.json or, for an unfinished run, from
its provenance.json sessions.
"""

import itertools
import json
import statistics
from pathlib import Path

from experiments.aggregate import queue_part, ran_with_xla, read_sessions
from experiments.history import HistoryError, read_history
from experiments.metrics import read_metrics


def epoch_seconds(folder):
    """Each epoch's seconds in a run folder's history.csv, finished or not; [] without one or where it is damaged."""
    try:
        return [float(row["epoch_seconds"]) for row in read_history(Path(folder) / "history.csv")]
    except HistoryError:  # damaged by hand or disk: the report names it, the forecast leaves it out
        return []


def expected_seconds(job, root, statistic=max, device=None):
    """Seconds `job` still needs (`timing`); None without a run to judge from."""
    return timing(job, root, statistic, device)[0]


# Where a forecast took a run's epoch times from, best first (`timing`); the last two are other rows.
ROW, OWN_EPOCHS, VARIANT_ROW, DATASET = SOURCES = ("its row", "its own epochs", "its variant's row", "its dataset")


def timing(job, root, statistic=max, device=None):
    """(seconds `job` still needs, the `SOURCES` entry they come from), from the epochs of runs like it; (None, None)
    without any.

    The finished runs of the job's own cell are asked first, then the job's
    own run where it has trained two epochs or more (a resumed run: other
    rows' runs may be far off, m = 256 from m = 128's, say; timed only on the
    device its sessions recorded), then the variant's main-table
    row (an ablation of it costs about as much), then any finished run of the
    dataset, ablations included (on a device that has run only ablations,
    they are all it has to tell its speed); where the job sets jit_compile,
    only runs that ran with its setting count (`aggregate.ran_with_xla`: XLA
    changes an epoch's time by up to 1.6x on this project's CPU). With `device` (`latency.device_name()`),
    only runs whose metrics.json names that device count: one results tree
    holds a GPU's runs beside CPUs' runs whose epochs take tens of times
    longer. Epochs the run already has (a resumed run) are not counted again. A session's first epoch also compiles the
    step (on a GPU 4-7x a later epoch), so it is forecast from the first
    epochs and the rest from the later ones: `statistic` of each is the time,
    the slowest (the default) for a deadline that must not be overrun, the
    median for a forecast (a paused or crowded run's epochs inflate the
    slowest).
    """
    def like_job(folder):
        metrics = read_metrics(folder)
        if metrics is None or (device is not None and metrics.get("device") != device):
            return False
        try:
            if not isinstance(job.config.jit_compile, bool):
                return True
            config = json.loads((folder / "config.json").read_text())
        except (OSError, ValueError, AttributeError):
            return False
        return ran_with_xla(config, read_sessions(folder)) == job.config.jit_compile

    def times_of(runs):
        runs = [seconds for seconds in runs if seconds]
        if not runs:
            return None
        first = statistic([seconds[0] for seconds in runs])
        later = [epoch for seconds in runs for epoch in seconds[1:]]
        return first, statistic(later) if later else first

    def epoch_times_of(folders):
        return times_of(epoch_seconds(folder) for folder in folders if like_job(folder))

    done = epoch_seconds(job.folder(root))  # a resumed run's; a damaged history is refused until mended (`training`)

    def own_times():
        sessions = read_sessions(job.folder(root))
        # Sessions recorded before they named their device could have run anywhere.
        on_device = device is None or (sessions and all(session.get("device") == device for session in sessions))
        return times_of([done]) if len(done) >= 2 and on_device else None

    rows = Path(root) / "runs" / job.dataset
    # Globs are lazy: the whole tree is read only when the job's cell and row have no run to judge from.
    dataset_runs = itertools.chain(rows.glob("*/seed*"), Path(root).glob(f"ablations/*/{job.dataset}/*/seed*"))
    asked = (lambda: epoch_times_of(job.folder(root).parent.glob("seed*")), own_times,
             lambda: epoch_times_of((rows / job.variant).glob("seed*")), lambda: epoch_times_of(dataset_runs))
    for ask, source in zip(asked, SOURCES):
        times = ask()
        if times is not None:
            break
    else:
        return None, None
    first, later = times
    left = job.config.epochs - len(done)
    return (first + later * (left - 1) if left > 0 else 0.0), source


def forecast_basis(device, on_device, finished, this_machine=False):
    """The forecast's rule in words, naming the device it forecasts for (`forecast`)."""
    basis = ("each queued run at the median first epoch (which compiles) and median later epoch of the finished "
             "runs of its row with its XLA setting, else of its own epochs so far (two or more), else of its "
             "variant's main-table row, else of its dataset")
    if device is None:
        return basis
    return (f"{basis}, run on {device}{' (this machine)' if this_machine else ''}, the device of {on_device} of the "
            f"{finished} finished runs (any device's where it has none)")


def forecast_part(job, profile):
    """The part of the queue a job belongs to in the forecast: (dataset, `aggregate.queue_part`)."""
    return job.dataset, queue_part(job.experiment, job.variant, job.seed, profile.seeds)


def forecast(jobs, root, profile, machine=None):
    """Minutes of training epochs each queued run of `jobs` (distinct runs: `benchmark.unique_runs`) needs, and their
    sums per part of the queue.

    Returns {"basis", "runs", "hours", "without_forecast", "parts": [{"dataset",
    "part", "runs", "hours", "without_forecast"}], "minutes": {folder: minutes
    or None}, "sources": {folder: the `SOURCES` entry its minutes come from, or
    None}, "elsewhere": [folder]}, parts in queue order; `timing`
    at the median epochs, so it holds for the machine and load the finished
    runs had. One results tree holds a GPU's runs beside CPUs' runs whose
    epochs take tens of times longer, so every run is forecast for one device:
    `machine` (`--list` passes the device it runs on) where any finished run
    of `jobs` ran on it, else the one most of them ran on (what aggregate.json
    holds, a function of the results alone); from that device's runs where it
    has any like the job, else from every device's: those runs are listed in
    "elsewhere", a time the device itself may be far from.
    """
    runs = [(job, read_metrics(job.folder(root))) for job in jobs]
    finished = [metrics for _, metrics in runs if metrics is not None]
    devices = [metrics.get("device") for metrics in finished]
    device, on_device = max(((name, devices.count(name)) for name in set(devices) - {None}),
                            key=lambda pair: (pair[1], pair[0]), default=(None, 0))
    this_machine = machine is not None and machine in devices
    if this_machine:
        device, on_device = machine, devices.count(machine)
    minutes, sources, parts, elsewhere = {}, {}, {}, []
    for job, metrics in runs:
        if metrics is not None:
            continue
        folder = str(job.folder(root).relative_to(root))
        seconds, source = timing(job, root, statistics.median, device=device)
        if seconds is None and device is not None:
            seconds, source = timing(job, root, statistics.median)
            if seconds is not None:
                elsewhere.append(folder)
        minutes[folder] = None if seconds is None else seconds / 60
        sources[folder] = source
        part = parts.setdefault(forecast_part(job, profile), {"runs": 0, "hours": 0.0, "without_forecast": 0})
        part["runs"] += 1
        if seconds is None:
            part["without_forecast"] += 1
        else:
            part["hours"] += seconds / 3600
    return {
        "basis": forecast_basis(device, on_device, len(devices), this_machine),
        "runs": len(minutes),
        "hours": sum(part["hours"] for part in parts.values()),
        "without_forecast": sum(part["without_forecast"] for part in parts.values()),
        "parts": [{"dataset": dataset, "part": name, **part} for (dataset, name), part in parts.items()],
        "minutes": minutes,
        "sources": sources,
        "elsewhere": elsewhere,
    }


def elsewhere_text(forecast):
    """"; N of them, H of those hours, from other devices' runs ..." of a `forecast`, "" when it has none such."""
    if not forecast["elsewhere"]:
        return ""
    hours = sum(forecast["minutes"][folder] for folder in forecast["elsewhere"]) / 60
    return (f"; {len(forecast['elsewhere'])} of them, {hours:.1f} of those hours, from other devices' runs, as that "
            f"device has finished none like them")
