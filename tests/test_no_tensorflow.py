"""The JAX path on a machine without TensorFlow: train, kill, resume, evaluate, benchmark, report and the KERPLE profiles,
and scripts/gpu_run.sh, which stops in one line where JAX sees no GPU; and a JAX run on a machine
that has TensorFlow, which imports it only to export a SavedModel.

Each command runs in a real process (the point is what it imports) with
``KERAS_BACKEND=jax`` and, but for that last test, ``sys.modules["tensorflow"] = None``, so any
``import tensorflow`` fails there, as on a GPU machine with a CUDA JAX and no
TensorFlow.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments import atomic

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
# Block TensorFlow, then run a script (path) or a module (-m name) with the rest of argv.
DRIVER = (
    "import runpy, sys; sys.modules['tensorflow'] = None; args = sys.argv[1:]; "
    "sys.argv = args[1:] if args[0] == '-m' else args; "
    "runpy.run_module(args[1], run_name='__main__', alter_sys=True) if args[0] == '-m' "
    "else runpy.run_path(args[0], run_name='__main__')"
)
TRAIN = ["train.py", "--variant", "favor-rope", "--size", "tiny", "--limit", "300", "--batch-size", "32",
         "--epochs", "3", "--num-features", "8"]


def environment(**extra):
    return dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO), **extra)


def run(*args, expect=0, **extra):
    done = subprocess.run([sys.executable, "-c", DRIVER, *map(str, args)], cwd=REPO, env=environment(**extra),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == expect, done.stderr[-3000:]
    return done


def metrics(out):
    return json.loads((Path(out) / "metrics.json").read_text())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("no_tf") / "run"
    run(*TRAIN, "--out", out)
    return out


def test_training_writes_a_complete_run_folder_with_tensorboard_logs(uninterrupted):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert metrics(uninterrupted)["backend"] == "jax"
    assert {"config.json", "history.csv", "best.keras", "metrics.json", "throughput.json"} <= {
        p.name for p in uninterrupted.iterdir()}
    tags = {}
    for group in ("train", "validation", "test"):
        events = EventAccumulator(str(uninterrupted / "logs" / group), size_guidance={"tensors": 0})
        events.Reload()
        tags[group] = set(events.Tags()["tensors"])
    assert {"epoch_accuracy", "epoch_loss", "epoch_learning_rate"} <= tags["train"]
    assert {"epoch_accuracy", "epoch_loss"} <= tags["validation"] and "test_accuracy" in tags["test"]


def test_a_killed_run_resumes_to_identical_metrics(uninterrupted, tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, "-c", DRIVER, *TRAIN, "--out", str(out)]
    # Paused after epoch 2's backup is complete and before it is renamed into place, then killed.
    process = subprocess.Popen(command, cwd=REPO, env=environment(**{atomic.PAUSE_VARIABLE: "state.json:2"}),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None and not atomic.paused_under(out):
        time.sleep(0.05)
    paused = atomic.paused_under(out)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert paused and not (out / "metrics.json").exists()
    run(*TRAIN, "--out", out)
    resumed, whole = metrics(out), metrics(uninterrupted)
    assert resumed["confusion_matrix"] == whole["confusion_matrix"]
    assert resumed["log_likelihood"] == pytest.approx(whole["log_likelihood"], rel=1e-5)
    assert (out / "history.csv").read_text().count("\n") == 4  # header and three epochs
    sessions = json.loads((out / "provenance.json").read_text())["sessions"]
    assert [s["start_epoch"] for s in sessions] == [0, 1] and {s["keras_backend"] for s in sessions} == {"jax"}
    assert all(s["jit_compile"] for s in sessions)  # Keras' "auto" compiles on JAX, and provenance says so


def test_evaluate_a_checkpoint_and_refuse_export_in_one_line(uninterrupted, tmp_path):
    done = run("evaluate.py", uninterrupted / "best.keras", "--dataset", "mnist", "--limit", "200",
               "--out", tmp_path / "eval")
    assert "test_accuracy" in done.stdout and (tmp_path / "eval" / "metrics.json").is_file()
    refused = run(*TRAIN, "--out", tmp_path / "other", "--export", tmp_path / "export", expect=2)
    assert refused.stderr.count("\n") == 1 and "needs TensorFlow" in refused.stderr
    assert not (tmp_path / "other").exists() and not (tmp_path / "export").exists()


def test_with_tensorflow_installed_a_jax_run_imports_it_only_to_export(uninterrupted, tmp_path):
    # Keras imports TensorFlow wherever it is installed (to seed it, and in every model.save) unless told
    # otherwise (`experiments.cli.keep_keras_from_importing_tensorflow`): TensorFlow is not blocked here.
    # A SavedModel from JAX goes through jax2tf, whose endpoint gets JAX arrays, not tf.Tensors.
    run_options = [*TRAIN[1:], "--epochs", "1", "--out", str(tmp_path / "run")]
    program = (
        "import sys, train, evaluate; "
        f"assert train.main({run_options!r}) == 0; "
        f"assert evaluate.main([{str(uninterrupted)!r}, '--limit', '100', '--out', {str(tmp_path / 'eval')!r}]) == 0; "
        "print('imported:', sorted(m for m in sys.modules if m.split('.')[0] == 'tensorflow')[:3]); "
        f"assert train.main([*{run_options!r}, '--export', {str(tmp_path / 'run' / 'export')!r}]) == 0"
    )
    done = subprocess.run([sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=environment())
    assert done.returncode == 0, done.stderr[-3000:]
    assert "imported: []" in done.stdout.splitlines()
    assert (tmp_path / "eval" / "metrics.json").is_file() and (tmp_path / "run" / "export" / "saved_model.pb").is_file()
    agreement = json.loads((tmp_path / "run" / "export_agreement.json").read_text())
    assert agreement["max_abs_difference"] <= 1e-4 and agreement["saved_model_accuracy"] == agreement["keras_accuracy"]


def test_with_tensorflow_installed_a_jax_tool_that_imports_it_still_fails_in_one_line(tmp_path):
    # TensorFlow's C++ start-up log (several lines) is dropped when a JAX tool imports it late, for a SavedModel.
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "saved_model.pb").write_bytes(b"")
    as_a_user_runs_it = {name: value for name, value in environment().items() if name != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "evaluate.py", str(tmp_path / "damaged"), "--dataset", "mnist"], cwd=REPO,
                          capture_output=True, text=True, timeout=600, env=as_a_user_runs_it)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "as a SavedModel" in done.stderr


def test_benchmark_and_report_run_without_tensorflow(tmp_path):
    run("-m", "experiments.benchmark", "--profile", "tiny", "--results-dir", tmp_path)
    run("-m", "experiments.report", "--profile", "tiny", "--results-dir", tmp_path)
    report = (tmp_path / "tiny" / "README.md").read_text()
    assert "softmax-absolute" in report and "saliency maps need the TensorFlow backend" in report
    # `--list` asks which machine it forecasts for (`latency.device_name`) with TensorFlow blocked.
    listed = run("-m", "experiments.benchmark", "--profile", "tiny", "--results-dir", tmp_path, "--list").stdout
    assert listed.splitlines()[-1].endswith("the queue is complete")


def test_the_kerple_profiles_run_without_tensorflow(tmp_path):
    # What a GPU session would run to time KERPLE's paths at the reference heads (profiles/README.md).
    run("-m", "profiles.kerple_paths", "--shapes", "reference", "--tokens", "16", "--rounds", "1", "--out", tmp_path)
    (paths,) = tmp_path.glob("*/jax/kerple_paths.json")
    record = json.loads(paths.read_text())
    point = record["shapes"]["reference"]["points"][0]
    assert record["xla"] is True
    assert all(point[f"{name}_train_ms"] > 0 for name in ("dense", "fft", "dft", "softmax"))
    run("-m", "profiles", "softmax-kerple", "favor-kerple", "--skip-bench", "--scopes", "layer", "--tokens", "16",
        "--scaling-steps", "1", "--in-process", "--out", tmp_path / "sweep")
    (sweep,) = (tmp_path / "sweep").glob("*/jax/scaling/layer-favor-kerple.json")
    assert json.loads(sweep.read_text())["points"][0]["train"]["toeplitz_path"] == "dense"


def test_compiled_programs_are_cached_where_the_readme_says(uninterrupted):
    from experiments.data import CACHE_DIR

    assert any((CACHE_DIR / "jax").iterdir())


def test_data_parallel_over_two_devices_matches_one_device(tmp_path):
    # Two virtual CPU devices; the same global batch of 32 on one device and split over both.
    program = (
        "import json, sys; sys.modules['tensorflow'] = None; import keras, train; "
        "assert len(keras.distribution.list_devices()) == 2; "
        f"args = {TRAIN[1:]!r}; "
        f"assert train.main([*args, '--out', {str(tmp_path / 'one')!r}]) == 0; "
        f"assert train.main([*args, '--distribute', 'data', '--out', {str(tmp_path / 'two')!r}]) == 0"
    )
    done = subprocess.run([sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=environment(XLA_FLAGS="--xla_force_host_platform_device_count=2"))
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert two["log_likelihood"] == pytest.approx(one["log_likelihood"], rel=1e-4)
    assert two["test_accuracy"] == pytest.approx(one["test_accuracy"], abs=2 / one["test_examples"])


def test_gpu_run_stops_in_one_line_where_jax_sees_no_gpu(tmp_path):
    # This CPU is such a machine: scripts/gpu_run.sh must stop before it installs or runs anything. So must a
    # machine without JAX, whose import error would otherwise come before the line (a python3 that says so).
    without_jax = tmp_path / "bin"
    without_jax.mkdir()
    (without_jax / "python3").write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named jax' >&2\nexit 1\n")
    (without_jax / "python3").chmod(0o755)
    wheels = wheel_folder(tmp_path)
    for first in (Path(sys.executable).parent, without_jax):  # this environment's python3 has a CPU JAX
        site = tmp_path / "site"
        done = subprocess.run(["bash", "scripts/gpu_run.sh", str(wheels)], cwd=REPO, capture_output=True, text=True,
                              env=environment(PATH=os.pathsep.join([str(first), os.environ["PATH"]]),
                                              PERFORMER_SITE=str(site)))
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().splitlines() == [
            "gpu_run.sh: JAX sees no GPU here; install a CUDA JAX first (README: Training on a GPU)"]
        assert not site.exists()


def wheel_folder(tmp_path):
    """A folder holding a (fake) wheel, which gpu_run.sh looks for before anything else."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "keras-3.15.1-py3-none-any.whl").write_bytes(b"")
    return wheels


@pytest.mark.parametrize("command, line", [
    (["scripts/gpu_run.sh"], "gpu_run.sh: usage: scripts/gpu_run.sh WHEELS_DIR [benchmark options]"),
    (["scripts/gpu_run.sh", "{tmp}"], "gpu_run.sh: {tmp} holds no .whl files; scripts/gpu_wheels.sh makes them "
                                      "(README: Training on a GPU)"),
    (["scripts/gpu_wheels.sh"], "gpu_wheels.sh: usage: scripts/gpu_wheels.sh DIR [PYTHON_VERSION]"),
    (["scripts/gpu_wheels.sh", "{tmp}/a_file"], "gpu_wheels.sh: {tmp}/a_file is a file; give a folder"),
    (["scripts/gpu_check.sh", "{tmp}", "{tmp}/out"],
     "gpu_check.sh: usage: scripts/gpu_check.sh WHEELS_DIR OUT_DIR SECONDS [benchmark options]"),
])
def test_the_gpu_scripts_refuse_bad_arguments_in_one_line(tmp_path, command, line):
    (tmp_path / "a_file").write_text("")
    done = subprocess.run(["bash", *[part.replace("{tmp}", str(tmp_path)) for part in command]], cwd=REPO,
                          capture_output=True, text=True, env=environment())
    assert (done.returncode, done.stderr.strip().splitlines()) == (2, [line.replace("{tmp}", str(tmp_path))])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a_file"]


@pytest.mark.parametrize("mps, line", [
    ("2", "gpu_run.sh: PERFORMER_MPS must be 0 or 1, not '2'"),
    ("1", "gpu_run.sh: PERFORMER_MPS=1 needs nvidia-cuda-mps-control, which is not on PATH"),
])
def test_gpu_run_refuses_a_bad_mps_setting_in_one_line_before_anything_runs(tmp_path, mps, line):
    site = tmp_path / "site"
    path = os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"])  # no NVIDIA tools on this CPU
    done = subprocess.run(["bash", "scripts/gpu_run.sh", str(wheel_folder(tmp_path))], cwd=REPO, capture_output=True,
                          text=True, env=environment(PATH=path, PERFORMER_SITE=str(site), PERFORMER_MPS=mps))
    assert (done.returncode, done.stderr.strip().splitlines()) == (2, [line])
    assert not site.exists()
