"""Engine benchmark: training images/s of the project's paths against a stock Keras ViT, per backend.

    python -m profiles.engine                              # -> profiles/results/<device>/engine.json
    python -m profiles.engine --baseline /tmp/old-checkout # also train.py's path of another commit
    python -m profiles.engine --num-features 16            # favor and relu at m = 16 -> engine-m16.json
    python -m profiles.engine --backends tensorflow --rounds 9   # -> engine-r9-tensorflow.json
    python -m profiles.engine --compare-huge-pages         # also with and without huge pages -> engine-huge-pages.json
    python -m profiles.engine --backends tensorflow --roofline  # also matmul rates -> engine-tensorflow-roofline.json

For size `small` on MNIST (`TASK`: 16,384 training images, train.py's
default batch of 128), one child process per backend (`engine_child.py`)
measures in alternating rounds, the first a warm-up:

* the project's softmax-, favor- and relu-absolute, bare ``model.fit`` on
  numpy arrays;
* ``stock``: the same ViT with Keras' ``MultiHeadAttention`` in place of
  every `KernelAttention`, fitted the same way;
* ``train_path``: train.py's own path (pipeline, augmentation, callbacks,
  writes) on the same images.

With ``--baseline PATH`` (a checkout of another commit, e.g. ``git worktree
add /tmp/old <commit>``), child processes alternate between that code and
this one, measuring train.py's path on the first of ``--backends``, each
checkout as its own commands run (one older than `experiments.huge_pages`
without huge pages, `baseline_environment`).
``--num-features M`` gives every model m = M random features (the `cpu`
profile's 16 against train.py's default 64, at head dimension 16 here) and
writes ``engine-m<M>.json``; ``--rounds R`` times R rounds instead of 3
(more, for ratios closer than the machine's noise), and ``--backends`` one
backend, each named in the file (`record_name`), so no run overwrites
another's record. The JSON keeps
every sample, the medians, and the ratios that issue 14 sets targets for
(``targets``): softmax over stock >= 1.0, favor and relu over softmax >= 0.9,
train path over bare fit >= 0.95, this train path over the baseline's >= 1.5.
Stop other work on the machine first: the ratios are only as clean as the
machine is quiet.

On an accelerator, ``--dataset``, ``--size``, ``--limit`` and ``--precision``
set the task (issue 14's GPU check: ``--backends jax --dataset cifar10 --size
reference --limit all --precision mixed_bfloat16``), and ``--worker-counts 2 4
8`` also times train.py's path in N processes at once, each with its share of
the device's memory, as ``benchmark --workers N`` trains: every timed round
starts together (a barrier), and the sum of the workers' medians is the
device's throughput with N runs at once, compared with one run's
(``workers_over_one``, target >= 2 at some N). Where an NVIDIA MPS daemon
serves the command (``CUDA_MPS_PIPE_DIRECTORY`` set, as ``PERFORMER_MPS=1
scripts/gpu_run.sh`` does), each N is timed twice, side by side: without
MPS (the children get no pipe directory, so they take turns on the GPU) and
with it (``"N+mps"`` in ``workers_over_one``); the one-run reference runs
without it. ``--compare-huge-pages`` then measures every subject again in
child processes alternating with and without glibc's huge pages for XLA's
buffers (`experiments.huge_pages`, which the project's commands turn on
themselves; ``huge_pages`` in the record, ``on_over_off`` per subject).
``--roofline`` also times, in the same rounds, float matmuls
(`profiles/matmul_rate.py`: large square ones, about the device's peak,
and the ViT's own forward shapes at the task's batch) and reads each
training subject's FLOPs per second (graph-counted FLOPs per image times
images/s) against both: how much faster a step could be if it ran at the
matmul rate of its own shapes. The record's name carries
every setting that differs from the default; it is written after every
stage, with ``"complete": false`` until the last, so a run cut short (a
time-limited slot) keeps what it measured.
"""

import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from experiments.cli import BACKENDS, command_line, fail, parser, start_backend

start_backend()  # before the imports below load Keras: why, in the docstring of profiles/__init__.py

from experiments import atomic, huge_pages
from experiments.benchmark import worker_memory
from profiles import bench
from profiles.__main__ import DEFAULT_OUT
from profiles.child import EVENT_PREFIX

REPO = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "engine_child.py"
VARIANTS = ("softmax-absolute", "favor-absolute", "relu-absolute")
TASK = dict(dataset="mnist", size="small", limit=16384, validation_size=256, batch_size=128, epochs=1, rounds=3,
            variants=list(VARIANTS))
SUBJECTS = ["stock", *(f"fit:{variant}" for variant in VARIANTS), "train_path"]
# Timed in the same rounds with --roofline: matmul rates to read the training subjects' FLOPs per second against.
ROOFLINE_SUBJECTS = ["matmul:square", "matmul:vit"]
BASELINE_ROUNDS = 2
TARGETS = {"softmax_over_stock": 1.0, "favor_over_softmax": 0.9, "relu_over_softmax": 0.9,
           "train_path_over_fit": 0.95, "train_path_over_baseline": 1.5, "workers_over_one": 2.0}
# Set (to the daemon's pipe folder) where an NVIDIA MPS daemon serves this process's children.
MPS_PIPE = "CUDA_MPS_PIPE_DIRECTORY"
# Settings of the task a command line may change, in the order a record's name lists them.
TASK_OPTIONS = ("dataset", "size", "limit", "precision")


def run_child(task, backend, code=REPO, log=print, env=None):
    """Events of one child process measuring `task` with the code at `code` first on the path.

    `env` is added to the environment; a None value removes that variable.
    """
    # The caller's path stays behind `code`: on a GPU box it holds the Keras installed beside JAX (gpu_run.sh).
    path = os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": path, "TF_CPP_MIN_LOG_LEVEL": "3",
           "XLA_PYTHON_CLIENT_PREALLOCATE": "false", **(env or {})}
    env = {name: value for name, value in env.items() if value is not None}
    done = subprocess.run([sys.executable, str(CHILD), json.dumps(dict(task, code=str(code)))], cwd=code, env=env,
                          capture_output=True, text=True)
    events = [json.loads(line[len(EVENT_PREFIX):]) for line in done.stdout.splitlines() if line.startswith(EVENT_PREFIX)]
    if done.returncode or not events or events[-1]["event"] != "done":
        raise RuntimeError(f"engine child ({backend}, {code}) failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    if events[0]["experiments_from"] != str(Path(code).resolve()):
        raise RuntimeError(f"engine child meant to measure {code} imported {events[0]['experiments_from']}")
    for event in events:
        if event["event"] == "sample" and not event["warmup"]:
            rate = (f"{event['images_per_second']:.0f} images/s" if "images_per_second" in event
                    else f"{event['gflops_per_second']:.0f} GFLOP/s")
            log(f"{backend} {Path(code).name}: {event['subject']} {rate}")
    return events


def medians(events, field="images_per_second"):
    """({subject: median}, {subject: samples}) of the timed samples that measure `field`."""
    samples = {}
    for event in events:
        if event["event"] == "sample" and not event["warmup"] and field in event:
            samples.setdefault(event["subject"], []).append(event[field])
    return {subject: statistics.median(values) for subject, values in samples.items()}, samples


def roofline(events, median, task):
    """Each training subject's FLOPs per second against the matmul rates timed beside it (`--roofline`).

    train.py's path trains the task's first variant, so it has that model's
    FLOPs per image. A share of 1 against ``matmul:vit`` would mean a step
    spent all its time in matmuls at the rate its own shapes reach.
    """
    ceilings, samples = medians(events, "gflops_per_second")
    per_image = next(event for event in events if event["event"] == "flops")["train_flops_per_image"]
    per_image = dict(per_image, train_path=per_image[f"fit:{task['variants'][0]}"])
    achieved = {subject: median[subject] * flops / 1e9 for subject, flops in per_image.items()}
    return {"ceiling_gflops_per_second": ceilings, "ceiling_samples": samples, "train_flops_per_image": per_image,
            "train_gflops_per_second": achieved,
            "share_of_ceiling": {name: {subject: rate / ceiling for subject, rate in achieved.items()}
                                 for name, ceiling in ceilings.items()}}


def ratios(median):
    fit = lambda variant: median[f"fit:{variant}"]  # noqa: E731
    return {
        "softmax_over_stock": fit("softmax-absolute") / median["stock"],
        "favor_over_softmax": fit("favor-absolute") / fit("softmax-absolute"),
        "relu_over_softmax": fit("relu-absolute") / fit("softmax-absolute"),
        "train_path_over_fit": median["train_path"] / fit("softmax-absolute"),
    }


def baseline_comparison(baseline, backend, task=TASK, log=print):
    """train.py's path here and at `baseline`, child processes alternating `BASELINE_ROUNDS` times."""
    task = dict(task, subjects=["train_path"], rounds=1)
    samples = {"this": [], "baseline": []}
    envs = {"this": None, "baseline": baseline_environment(baseline)}
    for _ in range(BASELINE_ROUNDS):
        for name, code in (("this", REPO), ("baseline", Path(baseline).resolve())):
            samples[name] += medians(run_child(task, backend, code, log, env=envs[name]))[1]["train_path"]
    this, base = statistics.median(samples["this"]), statistics.median(samples["baseline"])
    return {"baseline_code": str(Path(baseline).resolve()), "backend": backend, "samples": samples,
            "this_images_per_second": this, "baseline_images_per_second": base, "train_path_over_baseline": this / base}


def baseline_environment(baseline):
    """What a baseline child's environment changes: its commands as they ran when started from a shell.

    A checkout with `experiments.huge_pages` turns huge pages on itself, so it
    inherits this process's; an older one ran without them.
    """
    if (Path(baseline) / "experiments" / "huge_pages.py").exists():
        return None
    return huge_pages_variables(huge_pages.without_tunable)


def concurrent_train_path(task, backend, workers, log=print, mps=None):
    """train.py's path in `workers` child processes at once: each one's median images/s, and their sum.

    Each child has its share of the device's memory
    (`benchmark.worker_memory`, as `benchmark --workers` gives) and waits at a barrier (files in a shared folder) before
    every timed round, so the workers' rounds overlap however long each
    one's compilation took. `mps` False keeps the children off an MPS daemon
    (`MPS_PIPE` removed), True or None leaves the environment as it is.
    """
    memory = dict(worker_memory(workers), **({MPS_PIPE: None} if mps is False else {}))
    with tempfile.TemporaryDirectory() as folder, ThreadPoolExecutor(workers) as pool:
        tasks = [dict(task, subjects=["train_path"], barrier=dict(folder=folder, index=k, count=workers))
                 for k in range(workers)]
        runs = list(pool.map(lambda one: run_child(one, backend, log=lambda line: None, env=memory), tasks))
    per_worker = [statistics.median(medians(events)[1]["train_path"]) for events in runs]
    log(f"{backend} {workers} workers{' under MPS' if mps else ''}: "
        + " + ".join(f"{speed:.0f}" for speed in per_worker) + f" = {sum(per_worker):.0f} images/s")
    entry = {"workers": workers, "per_worker_images_per_second": per_worker, "images_per_second": sum(per_worker)}
    return entry if mps is None else dict(entry, mps=mps)


def huge_pages_variables(environment):
    """The two variables `experiments.huge_pages` reads, as `environment(os.environ)` sets them (None: unset)."""
    changed = environment(dict(os.environ))
    return {name: changed.get(name) for name in (huge_pages.TUNABLES_VARIABLE, huge_pages.OPT_OUT_VARIABLE)}


def huge_pages_comparison(backend, task, log=print):
    """Every subject with and without huge pages (`experiments.huge_pages`), child processes alternating.

    `BASELINE_ROUNDS` children each; the medians are over every timed round
    of an arm's children.
    """
    arms = {"on": huge_pages.with_tunable, "off": huge_pages.without_tunable}
    samples = {arm: {} for arm in arms}
    for _ in range(BASELINE_ROUNDS):
        for arm, environment in arms.items():
            events = run_child(dict(task, subjects=SUBJECTS), backend, log=lambda line: None,
                               env=huge_pages_variables(environment))
            for subject, values in medians(events)[1].items():
                samples[arm].setdefault(subject, []).extend(values)
    median = {arm: {subject: statistics.median(values) for subject, values in per_arm.items()}
              for arm, per_arm in samples.items()}
    on_over_off = {subject: median["on"][subject] / median["off"][subject] for subject in median["on"]}
    log(f"{backend} huge pages on over off: " + ", ".join(f"{k} {v:.2f}" for k, v in on_over_off.items()))
    return {"samples": samples, "images_per_second": median, "on_over_off": on_over_off}


def record_name(task, backends, worker_counts=(), compare_huge_pages=False):
    """engine.json, every setting that differs from `TASK` in the name: engine-m16-r9-tensorflow.json."""
    parts = ["engine"]
    if task.get("num_features"):
        parts.append(f"m{task['num_features']}")
    if task["rounds"] != TASK["rounds"]:
        parts.append(f"r{task['rounds']}")
    for name in TASK_OPTIONS:
        value = task.get(name, "float32")  # only precision is absent from TASK: float32, train.py's default
        if value != TASK.get(name, "float32"):
            parts.append(f"limit{value or '-all'}" if name == "limit" else str(value))
    if tuple(backends) != BACKENDS:
        parts += backends
    if worker_counts:
        parts.append("w" + "-".join(map(str, worker_counts)) + ("-mps" if task.get("mps") else ""))
    if compare_huge_pages:
        parts.append("huge-pages")
    if task.get("roofline"):
        parts.append("roofline")
    return "-".join(parts) + ".json"


def check_task(task):
    """ValueError (one line) if the children could not train `task`: found here, not in a child's traceback."""
    from experiments import data
    from experiments.run_config import RunConfig

    extra = {name: task[name] for name in ("num_features", "precision") if name in task}
    config = RunConfig(variant=task["variants"][0], dataset=task["dataset"], size=task["size"],
                       batch_size=task["batch_size"], limit=task["limit"], **extra)
    images = data.load_dataset(task["dataset"], limit=task["limit"], validation_size=task["validation_size"]).train[0]
    config.check_data(images.shape[1:], len(images))


def main(argv=None):
    args = parser("python -m profiles.engine", __doc__, "out", "baseline", "backends", "num-features",
                  "rounds", *TASK_OPTIONS, "worker-counts", "compare-huge-pages", "roofline").parse_args(argv)
    backends = args.backends or list(BACKENDS)
    task = dict(TASK, rounds=args.rounds or TASK["rounds"])
    if args.num_features:
        task["num_features"] = args.num_features
    if args.roofline:
        task["roofline"] = True
    subjects = SUBJECTS + (ROOFLINE_SUBJECTS if args.roofline else [])
    for name in TASK_OPTIONS:
        if getattr(args, name) is not None:
            task[name] = None if getattr(args, name) == "all" else getattr(args, name)
    try:
        if 1 in (args.worker_counts or ()):  # it would time one run twice, a slot's minutes for nothing
            raise ValueError("--worker-counts 1: every record times one run already; give counts of 2 or more")
        check_task(task)
    except ValueError as error:
        return fail("python -m profiles.engine", error)
    # Under an MPS daemon, every worker count is timed without and with it; one run, without it.
    under_mps = bool(args.worker_counts and os.environ.get(MPS_PIPE))
    arms = (False, True) if under_mps else (None,)
    if under_mps:
        task["mps"] = True
    single = {MPS_PIPE: None} if under_mps else None
    per_backend = {}
    record = {
        "command": command_line("profiles.engine", argv),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": bench.device_name(),
        "cpu": bench.cpu_identity(),
        # Whether the children below ran with huge pages for XLA's buffers (`experiments.huge_pages`).
        "huge_pages": huge_pages.has_tunable(os.environ),
        "task": task,
        "targets": TARGETS,
        "complete": False,
        "backends": per_backend,
    }
    path = Path(args.out or DEFAULT_OUT) / bench.device_slug() / record_name(task, backends, args.worker_counts or (),
                                                                          args.compare_huge_pages)

    def save():
        # After every stage, so a time-limited slot that ends midway keeps what was measured.
        atomic.write_json(path, record, indent=1, sort_keys=False)

    for backend in backends:
        events = run_child(dict(task, subjects=subjects), backend, env=single)
        median, samples = medians(events)
        setup = next(event for event in events if event["event"] == "setup")
        per_backend[backend] = {"params": setup["params"], "dtype_policies": setup["dtype_policies"],
                                "train_images": setup["train_images"],
                                "images_per_second": median, "samples": samples, "ratios": ratios(median)}
        if args.roofline:
            per_backend[backend]["roofline"] = roofline(events, median, task)
        save()
        for workers in args.worker_counts or ():
            for mps in arms:
                entry = concurrent_train_path(task, backend, workers, mps=mps)
                per_backend[backend].setdefault("concurrent", []).append(entry)
                per_backend[backend]["ratios"].setdefault("workers_over_one", {})[f"{workers}{'+mps' if mps else ''}"] = (
                    entry["images_per_second"] / median["train_path"])
                save()
    if args.baseline:
        record["baseline"] = baseline_comparison(args.baseline, backends[0], task)
        save()
    if args.compare_huge_pages:
        record["huge_pages_comparison"] = {}
        for backend in backends:
            record["huge_pages_comparison"][backend] = huge_pages_comparison(backend, task)
            save()
    record["complete"] = True
    save()
    summary = {backend: {k: round(v, 3) if isinstance(v, float) else {n: round(r, 3) for n, r in v.items()}
                         for k, v in entry["ratios"].items()} for backend, entry in per_backend.items()}
    print(json.dumps({"ratios": summary, "file": str(path)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
