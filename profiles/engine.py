"""Engine benchmark: training images/s of the project's paths against a stock Keras ViT, per backend.

    python -m profiles.engine                              # -> profiles/results/<device>/engine.json
    python -m profiles.engine --baseline /tmp/old-checkout # also train.py's path of another commit
    python -m profiles.engine --num-features 16            # favor and relu at m = 16 -> engine-m16.json
    python -m profiles.engine --backends tensorflow --rounds 9   # -> engine-r9-tensorflow.json

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
this one, measuring train.py's path on the default backend.
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
"""

import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

from experiments.cli import BACKENDS, parser, start_backend

start_backend()  # before the imports below load Keras: why, in the docstring of profiles/__init__.py

from experiments import atomic
from profiles import bench
from profiles.__main__ import DEFAULT_OUT
from profiles.child import EVENT_PREFIX

REPO = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "engine_child.py"
VARIANTS = ("softmax-absolute", "favor-absolute", "relu-absolute")
TASK = dict(dataset="mnist", size="small", limit=16384, validation_size=256, batch_size=128, epochs=1, rounds=3,
            variants=list(VARIANTS))
SUBJECTS = ["stock", *(f"fit:{variant}" for variant in VARIANTS), "train_path"]
BASELINE_ROUNDS = 2
TARGETS = {"softmax_over_stock": 1.0, "favor_over_softmax": 0.9, "relu_over_softmax": 0.9,
           "train_path_over_fit": 0.95, "train_path_over_baseline": 1.5}


def run_child(task, backend, code=REPO, log=print):
    """Events of one child process measuring `task` with the code at `code` first on the path."""
    env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=str(code), TF_CPP_MIN_LOG_LEVEL="3",
               XLA_PYTHON_CLIENT_PREALLOCATE="false")
    done = subprocess.run([sys.executable, str(CHILD), json.dumps(dict(task, code=str(code)))], cwd=code, env=env,
                          capture_output=True, text=True)
    events = [json.loads(line[len(EVENT_PREFIX):]) for line in done.stdout.splitlines() if line.startswith(EVENT_PREFIX)]
    if done.returncode or not events or events[-1]["event"] != "done":
        raise RuntimeError(f"engine child ({backend}, {code}) failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    if events[0]["experiments_from"] != str(Path(code).resolve()):
        raise RuntimeError(f"engine child meant to measure {code} imported {events[0]['experiments_from']}")
    for event in events:
        if event["event"] == "sample" and not event["warmup"]:
            log(f"{backend} {Path(code).name}: {event['subject']} {event['images_per_second']:.0f} images/s")
    return events


def medians(events):
    samples = {}
    for event in events:
        if event["event"] == "sample" and not event["warmup"]:
            samples.setdefault(event["subject"], []).append(event["images_per_second"])
    return {subject: statistics.median(values) for subject, values in samples.items()}, samples


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
    for _ in range(BASELINE_ROUNDS):
        for name, code in (("this", REPO), ("baseline", Path(baseline).resolve())):
            samples[name] += medians(run_child(task, backend, code, log))[1]["train_path"]
    this, base = statistics.median(samples["this"]), statistics.median(samples["baseline"])
    return {"baseline_code": str(Path(baseline).resolve()), "backend": backend, "samples": samples,
            "this_images_per_second": this, "baseline_images_per_second": base, "train_path_over_baseline": this / base}


def record_name(num_features, rounds, backends):
    """engine.json, with every setting that differs from the default in the name: engine-m16-r9-tensorflow.json."""
    parts = ["engine"]
    if num_features:
        parts.append(f"m{num_features}")
    if rounds != TASK["rounds"]:
        parts.append(f"r{rounds}")
    if tuple(backends) != BACKENDS:
        parts += backends
    return "-".join(parts) + ".json"


def main(argv=None):
    args = parser("python -m profiles.engine", __doc__, "out", "baseline", "backends", "num-features",
                  "rounds").parse_args(argv)
    backends = args.backends or list(BACKENDS)
    task = dict(TASK, rounds=args.rounds or TASK["rounds"])
    if args.num_features:
        task["num_features"] = args.num_features
    per_backend = {}
    for backend in backends:
        events = run_child(dict(task, subjects=SUBJECTS), backend)
        median, samples = medians(events)
        setup = next(event for event in events if event["event"] == "setup")
        per_backend[backend] = {"params": setup["params"], "train_images": setup["train_images"],
                                "images_per_second": median, "samples": samples, "ratios": ratios(median)}
    record = {
        "command": "python -m profiles.engine " + shlex.join(sys.argv[1:] if argv is None else argv),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": bench.device_name(),
        "task": task,
        "targets": TARGETS,
        "backends": per_backend,
    }
    if args.baseline:
        record["baseline"] = baseline_comparison(args.baseline, backends[0], task)
    path = Path(args.out or DEFAULT_OUT) / bench.device_slug() / record_name(args.num_features, task["rounds"], backends)
    atomic.write_json(path, record, indent=1, sort_keys=False)
    summary = {backend: {k: round(v, 3) for k, v in entry["ratios"].items()} for backend, entry in per_backend.items()}
    print(json.dumps({"ratios": summary, "file": str(path)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
