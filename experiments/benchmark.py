"""Run a profile's queue of (variant, dataset, seed) trainings; resumable, multi-seed.

    KERAS_BACKEND=jax python -m experiments.benchmark --profile small
    python -m experiments.benchmark --profile small --variants favor-rope relu-rope --seeds 0 1 2 3
    python -m experiments.benchmark --profile small --list       # the queue, what is finished, hours left
    python -m experiments.report --profile small                 # results/small/README.md

Every run goes through `training.train`, the code behind train.py, into its
own folder under results/<profile>/:

    runs/<dataset>/<variant>/seed<k>/                         the variant rows
    ablations/num_features/<dataset>/<variant>-m<M>/seed<k>/  random features m = M
    ablations/init_from/<dataset>/<variant>/seed<k>/          started from runs/<dataset>/softmax-absolute/seed<k>/best.keras
    ablations/normalize_qk/<dataset>/<variant>-qknorm-<on|off>/seed<k>/
                                                              q/k normalisation switched from the variant's default
    ablations/learning_rate/<dataset>/<variant>-lr<rate>/seed<k>/
                                                              peak learning rate <rate> instead of the profile's
    ablations/stabilizer/<dataset>/<variant>-stabilizer-<value>/seed<k>/
                                                              FAVOR+'s stabiliser <value> instead of the profile's

A run with metrics.json is finished and skipped; an unfinished one resumes from
its last finished epoch; a folder holding a run of other settings is refused
and the queue goes on. So a benchmark killed at any moment continues where it
stopped when started again, and sessions that each run part of the queue
(`--variants`, `--datasets`, `--seeds`, `--max-runs`, `--max-minutes`) add up to one
result, and `--workers N` trains N queued runs at once in N processes (each its
share of the accelerator's memory: runs at these sizes are far too small to fill
a GPU; keep 1 on a CPU). `--max-minutes T` suits a time-limited slot (a batch
job, a rented GPU hour): a run starts only if the time left covers its expected
time (the slowest first epoch, which compiles, then the slowest later epoch for
each epoch after it, of the finished runs of its own row with its XLA setting,
else of its own epochs so far, else of its variant's main-table row, else of
its dataset; runs made on this machine's device first, others' only where it
has made none), so the slot ends with finished folders only (a run with no
finished run of its dataset to judge from starts while any time is left, and
says it may not finish); `--archive FILE.tar.gz` then packs the finished run
folders (without checkpoints) for the trip home, where unpacking them into the
results folder adds them to the table.
`--keep-epochs K ...` keeps those epochs' weights in each run's epochs/ (train.py's
option; not archived). Each ablation run whose settings equal a variant row's (m =
the profile's m) is that row's folder, not a second copy.

The queue runs the main table first, dataset by dataset, all seeds of a row
before the next row, so that whole cells of the main table finish first; then
the extra rows (exp, linformer), then the init-from, num_features and
normalize_qk experiments and the setting ablations (learning_rate, stabilizer:
`setting_ablations.py`). At the end aggregate.json is written
(`aggregate.py`); the report is `python -m experiments.report`.

Exit status: 0 when every queued run is finished or was left as asked (for
lack of time under `--max-minutes`, or past `--max-runs`), 1 when some failed
or were skipped (a missing init-from checkpoint), 2 for bad arguments.
"""

import dataclasses
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from experiments.aggregate import BASELINE, write_aggregate as aggregate_cells
from experiments.benchmark_profiles import get_profile
from experiments.cli import SELECTION_OPTIONS, expand_variants, fail, interruptible, out_of_memory, parser
from experiments.forecast import DATASET, OWN_EPOCHS, VARIANT_ROW, elsewhere_text, epoch_seconds, expected_seconds, forecast
from experiments.metrics import read_metrics
from experiments.run_config import RunError, check_keep_epochs
from experiments.setting_ablations import SETTING_ABLATIONS
from performer_keras.options import check_choice

EXPERIMENTS = ("variants", "init_from", "num_features", "normalize_qk", *SETTING_ABLATIONS)
# The RunConfig field each ablation changes, recorded as its rows' "setting".
ABLATION_FIELDS = ("num_features", "normalize_qk", *SETTING_ABLATIONS)


@dataclasses.dataclass(frozen=True)
class Job:
    """One training run of the queue.

    `cell` is the folder of the table row the run belongs to (relative to the
    profile's results folder); the run's folder is cell/seed<seed>. `needs`
    is a checkpoint that must exist before the run can start (init_from).
    """

    experiment: str
    dataset: str
    variant: str
    label: str
    seed: int
    cell: str
    config: object  # RunConfig
    needs: Path | None = None

    def folder(self, root):
        return Path(root) / self.cell / f"seed{self.seed}"


def profile_root(results_dir, profile):
    return Path(results_dir) / profile.name


def variant_cell(dataset, variant):
    return f"runs/{dataset}/{variant}"


def plan(profile, results_dir="results", variants=None, datasets=None, seeds=None, epochs=None, experiments=EXPERIMENTS):
    """The queue of `profile`, optionally narrowed or extended.

    Args:
        profile: a `benchmark_profiles.Profile`.
        results_dir: the folder holding results/<profile>/; init_from paths
            in the configs are written under it as given.
        variants: only these rows (may name variants the profile lacks) and
            only the ablation runs of these variants; default all.
        datasets, seeds: replace the profile's (seeds may add new ones);
            `seeds` replaces the ablation seeds and `more_seeds` too.
        epochs: replace the profile's epochs on every dataset.
        experiments: any of `EXPERIMENTS`.

    Returns: a list of `Job` in queue order. A run shared by two
    experiments (num_features at the profile's m is the variant row) is listed
    under each; `unique_runs` keeps its first.
    """

    for experiment in experiments:
        check_choice("experiment", experiment, EXPERIMENTS)
    root = profile_root(results_dir, profile)
    datasets = tuple(datasets or profile.datasets)
    main_seeds = tuple(profile.seeds if seeds is None else seeds)
    ablation_seeds = tuple((profile.ablation_seeds or profile.seeds) if seeds is None else seeds)
    row_groups = [tuple(variants)] if variants else [profile.variants, profile.extra_variants]
    wanted = (lambda v: True) if variants is None else (lambda v: v in variants)
    jobs, configs = [], {}

    def add(job):
        if configs.setdefault(job.folder(root), job.config) != job.config:
            raise AssertionError(f"two runs of different settings planned in {job.folder(root)}")
        jobs.append(job)

    def row_job(variant, dataset, seed):
        config = profile.config(variant, dataset, seed, epochs)
        return Job("variants", dataset, variant, variant, seed, variant_cell(dataset, variant), config)

    def row_seeds(variant):
        return ablation_seeds if variant in profile.extra_variants else main_seeds

    if "variants" in experiments:
        for rows in row_groups:
            for dataset in datasets:
                for variant in rows:
                    for seed in row_seeds(variant):
                        add(row_job(variant, dataset, seed))
    if "init_from" in experiments:
        for dataset in (d for d in datasets if d in profile.init_from.get("datasets", ())):
            for variant in filter(wanted, profile.init_from["variants"]):
                for seed in ablation_seeds:
                    checkpoint = root / variant_cell(dataset, BASELINE) / f"seed{seed}" / "best.keras"
                    config = profile.config(variant, dataset, seed, epochs, init_from=str(checkpoint))
                    cell = f"ablations/init_from/{dataset}/{variant}"
                    add(Job("init_from", dataset, variant, variant, seed, cell, config, needs=checkpoint))
    if "num_features" in experiments:
        for dataset in (d for d in datasets if d in profile.num_features.get("datasets", ())):
            for variant in filter(wanted, profile.num_features["variants"]):
                for m in profile.num_features["values"]:
                    # At the profile's own m the run is the variant row, with the row's seeds.
                    shared = profile.config(variant, dataset, 0, epochs, num_features=m) == row_job(variant, dataset, 0).config
                    for seed in row_seeds(variant) if shared else ablation_seeds:
                        config = profile.config(variant, dataset, seed, epochs, num_features=m)
                        cell = variant_cell(dataset, variant) if shared else f"ablations/num_features/{dataset}/{variant}-m{m}"
                        add(Job("num_features", dataset, variant, f"{variant}-m{m}", seed, cell, config))
    if "normalize_qk" in experiments:
        for dataset in (d for d in datasets if d in profile.normalize_qk.get("datasets", ())):
            for variant in filter(wanted, profile.normalize_qk["variants"]):
                switched = not profile.config(variant, dataset, 0, epochs).normalizes_qk
                label = f"{variant}-qknorm-{'on' if switched else 'off'}"
                for seed in ablation_seeds:
                    config = profile.config(variant, dataset, seed, epochs, normalize_qk=switched)
                    add(Job("normalize_qk", dataset, variant, label, seed, f"ablations/normalize_qk/{dataset}/{label}", config))
    for field, ablation in SETTING_ABLATIONS.items():
        spec = getattr(profile, field) if field in experiments else {}
        for dataset in (d for d in datasets if d in spec.get("datasets", ())):
            for variant in filter(wanted, spec["variants"]):
                for value in spec["values"]:
                    label = ablation.label(variant, value)
                    for seed in ablation_seeds:
                        config = profile.config(variant, dataset, seed, epochs, **{field: value})
                        add(Job(field, dataset, variant, label, seed, f"ablations/{field}/{dataset}/{label}", config))
    if "variants" in experiments and seeds is None:
        for dataset in (d for d in datasets if d in profile.more_seeds):
            for variant in filter(wanted, profile.variants):
                for seed in profile.more_seeds[dataset]:
                    add(row_job(variant, dataset, seed))
    return jobs


def unique_runs(jobs, root):
    """`jobs` without the repeats of a run folder, first kept."""
    runs = {}
    for job in jobs:
        runs.setdefault(job.folder(root), job)
    return list(runs.values())


def cells(jobs):
    """The table rows of `jobs` for `aggregate.aggregate`, in queue order.

    A run shared by two experiments (num_features at the profile's m is the
    variant row) appears in both rows.
    """
    rows = {}
    for job in jobs:
        key = (job.experiment, job.dataset, job.label)
        row = rows.setdefault(key, {
            "experiment": job.experiment, "dataset": job.dataset, "variant": job.variant, "label": job.label,
            "directory": job.cell, "seeds": [],
            "setting": {job.experiment: getattr(job.config, job.experiment)} if job.experiment in ABLATION_FIELDS
            else {"init_from": BASELINE} if job.experiment == "init_from" else {},
        })
        row["seeds"].append(job.seed)
    return list(rows.values())


def all_jobs(profile, results_dir, selected=()):
    """The profile's whole queue plus the `selected` jobs it lacks (rows added on the command line)."""
    jobs = plan(profile, results_dir)
    known = {(job.experiment, job.cell, job.seed) for job in jobs}
    return jobs + [job for job in selected if (job.experiment, job.cell, job.seed) not in known]


def is_finished(job, root):
    return read_metrics(job.folder(root)) is not None


def list_queue(jobs, root, profile, log=print, machine=None):
    """Print each run's state, the queued runs' forecast minutes (`forecast`, for `machine` where it ran any) and their sum."""
    left = forecast(jobs, root, profile, machine)
    for job in jobs:
        folder = job.folder(root)
        if is_finished(job, root):
            log(f"finished  {folder}")
            continue
        key = str(folder.relative_to(root))
        minutes = left["minutes"][key]
        source, elsewhere = left["sources"][key], key in left["elsewhere"]
        # A row's own runs time it best; another row's (m = 256 from m = 128's, say) may be far off.
        if source == OWN_EPOCHS:
            other = ", from its own epochs so far" + (", on another device" if elsewhere else "")
        else:
            others = [what for what, other in (("rows'", source in (VARIANT_ROW, DATASET)), ("devices'", elsewhere)) if other]
            other = f", from other {' and other '.join(others)} runs" if others else ""
        done = len(epoch_seconds(folder))  # a resumed run's, from its history
        what = [f"{done} of {job.config.epochs} epochs done"] if done else []
        if minutes is not None:  # a GPU's runs can take seconds: "about 0 min" read as no time at all
            what.append(f"{'under 1' if minutes < 1 else f'about {minutes:.0f}'} min{other}")
        log(f"queued    {folder}" + (f"  ({'; '.join(what)})" if what else ""))
    finished = len(jobs) - left["runs"]
    line = f"{finished} of {len(jobs)} runs finished"
    if not left["runs"]:
        line += "; the queue is complete"
    elif left["runs"] == left["without_forecast"]:
        line += f"; no finished run to forecast the {left['runs']} queued runs from"
    else:
        line += (f"; the {left['runs'] - left['without_forecast']} queued runs with a forecast need about "
                 f"{left['hours']:.1f} hours of training epochs ({left['basis']})")
        line += elsewhere_text(left)
        if left["without_forecast"]:
            line += f"; {left['without_forecast']} have no finished run to forecast from"
    log(line)


def run_queue(jobs, root, verbose=0, max_runs=None, log=print, deadline=None, device=None, keep_epochs=()):
    """Train every unfinished job in order; returns {"finished", "trained", "failed", "skipped", "no_time", "over_max_runs"} lists.

    A run that fails (another run's folder, bad data, divergence) is reported
    and the queue goes on; a missing init_from checkpoint skips the run.
    `max_runs` stops after that many trainings (finished runs do not count;
    the rest are "over_max_runs", left as asked, not skipped);
    `deadline` (a `time.monotonic()` instant) starts no run whose
    `expected_seconds` exceed the time left, forecast from the runs made on
    `device` (default: this process's, `latency.device_name()`) where there
    are any and from every device's otherwise; a run without a forecast (no
    finished run of its dataset) starts while any time is left, and says so.
    `keep_epochs` keeps those epochs' weights in each run's epochs/ (`training.train`).
    """
    import keras

    # Training loads the backend and TensorFlow's data pipeline: only when a queue runs.
    from experiments.data import DataError
    from experiments.latency import device_name
    from experiments.models import EvaluationError
    from experiments.training import TrainingDiverged, train

    if deadline is not None and device is None:
        device = device_name()

    outcome = {"finished": [], "trained": [], "failed": [], "skipped": [], "no_time": [], "over_max_runs": []}
    for index, job in enumerate(jobs, 1):
        folder = job.folder(root)
        tag = f"[{index}/{len(jobs)}] {folder}"
        if is_finished(job, root):
            outcome["finished"].append(str(folder))
            continue
        if max_runs is not None and len(outcome["trained"]) + len(outcome["failed"]) >= max_runs:
            outcome["over_max_runs"].append(str(folder))
            continue
        if deadline is not None:
            needed = expected_seconds(job, root, device=device)
            if needed is None:
                needed = expected_seconds(job, root)
            if deadline - time.monotonic() <= (needed or 0.0):
                outcome["no_time"].append(str(folder))
                continue
            if needed is None:
                log(f"{tag}: no finished run of {job.dataset} to forecast its time from: it starts while any time "
                    f"is left and may not finish in it")
        if job.needs is not None and not job.needs.is_file():
            log(f"{tag}: skipped, needs {job.needs} (the softmax-absolute run's checkpoint, which is not "
                f"committed: move its run folder aside and run the benchmark again to remake it)")
            outcome["skipped"].append(str(folder))
            continue
        log(f"{tag}: training")
        started = time.perf_counter()
        try:
            metrics = train(job.config, folder, verbose=verbose, keep_epochs=keep_epochs)
        except (RunError, DataError, TrainingDiverged, EvaluationError) as error:  # one run's fault: the queue goes on
            log(f"{tag}: failed: {error}")
            outcome["failed"].append(str(folder))
            continue
        except Exception as error:
            # A run too large for the device fails alone: the queue's other runs may fit.
            what = out_of_memory(error)
            if what is None:
                raise
            log(f"{tag}: failed: out of memory ({what})")
            outcome["failed"].append(str(folder))
            continue
        finally:
            # Free the run's graphs and compiled functions: one process trains hundreds of models.
            keras.backend.clear_session(free_memory=True)
        outcome["trained"].append(str(folder))
        log(f"{tag}: test accuracy {metrics['test_accuracy']:.4f} in {time.perf_counter() - started:.0f} s")
    return outcome


def commands(profile, results_dir):
    """The commands that remake results/<profile>/ (printed above every table)."""
    prefix = f"KERAS_BACKEND={profile.backend} " if profile.backend else ""
    where = "" if str(results_dir) == "results" else f" --results-dir {results_dir}"
    return {
        "benchmark": f"{prefix}python -m experiments.benchmark --profile {profile.name}{where}",
        "report": f"python -m experiments.report --profile {profile.name}{where}",
    }


def report_header(profile, results_dir, jobs=None):
    """What aggregate.json says about the profile besides the runs; `jobs` (default its whole queue) are forecast."""
    jobs = all_jobs(profile, results_dir) if jobs is None else jobs
    root = profile_root(results_dir, profile)
    return dict(profile=profile.name, doc=profile.doc, commands=commands(profile, results_dir),
                settings=profile.settings, epochs=profile.epochs, seeds=list(profile.seeds),
                more_seeds={dataset: list(seeds) for dataset, seeds in profile.more_seeds.items()},
                pipeline_check=profile.pipeline_check,
                ablation_seeds=list(profile.ablation_seeds or profile.seeds),
                forecast=forecast(unique_runs(jobs, root), root, profile))


def write_aggregate(profile, results_dir, selected=()):
    """Aggregate the profile's whole queue (plus `selected`) into results/<profile>/aggregate.json."""
    jobs = all_jobs(profile, results_dir, selected)
    return aggregate_cells(profile_root(results_dir, profile), cells(jobs), **report_header(profile, results_dir, jobs))


def selected_jobs(args, profile):
    """The jobs that `experiments.cli.SELECTION_OPTIONS` select from `profile`'s queue.

    A selection of no run is a RunError that says what each ablation it names
    covers: an empty queue would otherwise read as a finished one.
    """
    jobs = plan(profile, args.results_dir, expand_variants(args.variants), args.datasets, args.seeds, args.epochs,
                args.experiments or EXPERIMENTS)
    if not jobs:
        covers = [ablation_coverage(profile, name) for name in args.experiments or () if name != "variants"]
        raise RunError("; ".join([f"the selection holds no run of profile {profile.name!r}", *covers]))
    return jobs


def ablation_coverage(profile, experiment):
    """Which variants and datasets `profile`'s `experiment` (an ablation) runs, in words."""
    spec = getattr(profile, experiment)
    if not spec:
        return f"it has no {experiment} experiment"
    return f"its {experiment} experiment runs {', '.join(spec['variants'])} on {', '.join(spec['datasets'])}"


def pack_finished(jobs, root, archive):
    """Write the finished run folders of `jobs` into the .tar.gz `archive` (atomically); returns their number.

    Paths inside are relative to the profile's folder, so extracting the
    archive there adds the runs; checkpoints (`best.keras`, backups and the
    epochs `--keep-epochs` kept) stay behind, as in the committed results.
    """
    from experiments.atomic import replacing
    from experiments.checkpoints import KEPT_DIR

    finished = [job.folder(root) for job in jobs if is_finished(job, root)]
    with replacing(archive) as tmp, tarfile.open(tmp, "w:gz") as tar:
        # An archive written into a run folder would otherwise hold itself being written, or its previous copy.
        itself = {Path(tmp).resolve(), Path(archive).resolve()}
        for folder in finished:
            for path in sorted(folder.rglob("*")):
                parts = path.relative_to(folder).parts
                if path.is_file() and path.name != "best.keras" and not {"backup", KEPT_DIR} & set(parts) \
                        and path.resolve() not in itself:
                    tar.add(path, arcname=str(path.relative_to(root)))
    return len(finished)


def worker_memory(workers):
    """The environment that gives one of `workers` processes its share of the accelerator's memory."""
    return {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "TF_FORCE_GPU_ALLOW_GROWTH": "true",
            "XLA_PYTHON_CLIENT_MEM_FRACTION": f"{0.9 / workers:.3f}"}


def run_workers(argv, workers, max_runs=None):
    """Run the queue in `workers` processes at once (`--shard k/workers` each); the worst exit status.

    Each worker gets its share of the accelerator's memory and trains every
    `workers`-th queued run, so no two touch one folder; each resumes and
    skips finished runs exactly as a single process does. Lines of the
    workers' logs interleave, each whole. `max_runs` is for all of them
    together: each worker gets its share (`worker_max_runs`).
    """
    argv = drop_options(argv, ("--workers", "--archive", "--max-runs"))
    env = dict(os.environ, **worker_memory(workers))
    processes = [subprocess.Popen([sys.executable, "-m", "experiments.benchmark", *argv, "--shard", f"{k}/{workers}",
                                   *([] if max_runs is None else ["--max-runs", str(worker_max_runs(max_runs, workers, k))])],
                                  env=env) for k in range(workers)]
    return max(process.wait() for process in processes)


def worker_max_runs(max_runs, workers, k):
    """Worker k's share of `max_runs` trainings: the first max_runs % workers workers take one more."""
    return max_runs // workers + (k < max_runs % workers)


def drop_options(argv, names):
    """`argv` without the options `names` and their values (``--name value`` or ``--name=value``)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in names:
            skip = True
        elif not arg.startswith(tuple(f"{name}=" for name in names)):
            kept.append(arg)
    return kept


# What only training reads: `--list` refuses them rather than print a queue as if they changed it.
RUN_ONLY = ("max-runs", "max-minutes", "workers", "archive", "keep-epochs", "verbose")


def main(argv=None):
    cli = parser("benchmark", __doc__, *SELECTION_OPTIONS, *RUN_ONLY, "shard", "list")
    args = cli.parse_args(argv)
    # Given where it differs from its default: argparse keeps no other trace.
    unread = [name for name, dest in ((name, name.replace("-", "_")) for name in RUN_ONLY)
              if getattr(args, dest) != cli.get_default(dest)]
    if args.list and unread:
        return fail("benchmark", f"--{unread[0]} changes nothing with --list, which only prints the queue and its "
                                 "forecast; run without --list to train")
    # A run's settings are its profile's; what the command line sets is how many share the device.
    return interruptible("benchmark", lambda: run(args, sys.argv[1:] if argv is None else list(argv)),
                         remedy="lower --workers")


def run(args, argv=()):
    try:
        if args.workers > 1 and args.shard:
            raise RunError("--workers and --shard exclude each other: --workers starts the shards itself")
        profile = get_profile(args.profile)
        selected = selected_jobs(args, profile)
        for job in selected:
            check_keep_epochs(args.keep_epochs, job.config.epochs, f"a {job.dataset} run of profile {profile.name!r}")
        # Keras (and its backend) load only once the selection is known to be good.
        import keras

        backend = keras.backend.backend()
        if profile.backend and backend != profile.backend and not args.list:
            raise RunError(
                f"profile {profile.name!r} runs on the {profile.backend} backend, this process on {backend}: "
                f"run {commands(profile, args.results_dir)['benchmark']}"
            )
    except (RunError, ValueError) as error:
        return fail("benchmark", error)
    root = profile_root(args.results_dir, profile)
    jobs = unique_runs(selected, root)
    if args.shard:
        index, count = args.shard
        jobs = jobs[index::count]
    if args.list:
        from experiments.latency import device_name

        list_queue(jobs, root, profile, machine=device_name())
        return 0
    if args.workers > 1:
        status = run_workers(argv, args.workers, args.max_runs)
        write_aggregate(profile, args.results_dir, selected)
        if args.archive:
            print(f"archive: {args.archive} holds {pack_finished(jobs, root, args.archive)} finished run folders")
        return status
    print(f"benchmark {profile.name}: {len(jobs)} runs, {sum(is_finished(job, root) for job in jobs)} finished; backend {backend}",
          flush=True)
    deadline = None if args.max_minutes is None else time.monotonic() + 60 * args.max_minutes
    outcome = run_queue(jobs, root, verbose=2 if args.verbose else 0, max_runs=args.max_runs,
                        log=lambda line: print(line, flush=True), deadline=deadline, keep_epochs=args.keep_epochs)
    aggregated = write_aggregate(profile, args.results_dir, selected)
    print(f"trained {len(outcome['trained'])}, failed {len(outcome['failed'])}, skipped {len(outcome['skipped'])}, "
          f"left for lack of time {len(outcome['no_time'])}, left by --max-runs {len(outcome['over_max_runs'])}; "
          f"{aggregated['runs']['finished']} of {aggregated['runs']['planned']} runs of the profile finished")
    if args.archive:
        print(f"archive: {args.archive} holds {pack_finished(jobs, root, args.archive)} finished run folders")
    print(f"aggregate: {root / 'aggregate.json'}; report: {commands(profile, args.results_dir)['report']}")
    return 1 if outcome["failed"] or outcome["skipped"] else 0


if __name__ == "__main__":
    sys.exit(main())
