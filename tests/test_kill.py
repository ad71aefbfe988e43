"""SIGKILL at chosen instants, inside every file write of a run: the same command always resumes.

Each kill stops a real train.py process at a write named by
`atomic.PAUSE_VARIABLE` (after the temporary file is complete, before its
rename, which is the instant a half-written file would be left behind by an
in-place writer) and the rerun, the same command in-process, must exit 0 with
the metrics and the history of an uninterrupted run.
"""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import train
from experiments import atomic
from experiments.latency import cpu_identity

REPO = Path(__file__).resolve().parent.parent
EPOCHS = 5
# Without XLA: what is tested is the files, and 48 processes each skip a compilation (about a
# fifth of a run here). test_train.py resumes a run killed under XLA, train.py's default.
ARGS = ["--variant", "favor-absolute", "--size", "tiny", "--limit", "400", "--batch-size", "32",
        "--epochs", str(EPOCHS), "--redraw-interval", "5", "--no-jit-compile", "--keep-epochs", "2"]
KEPT = "epoch0002.weights.h5"
# Every write of a run, in order: 2 at the start, 3 per epoch (epoch 2's backup is then copied into
# epochs/, the second write of its name), best.keras, 3 at the end.
MOMENTS = (
    ["config.json:1", "provenance.json:1"]
    + [moment for k in range(1, EPOCHS + 1)
       for moment in (f"history.csv:{k}", f"epoch{k:04d}.weights.h5:1", *[f"{KEPT}:2"] * (k == 2), f"state.json:{k}")]
    + ["best.keras:1", "throughput.json:1", "metrics.json:1", "confusion_matrix.png:1"]
)

pytestmark = pytest.mark.slow


def run_in_process(out):
    assert train.main([*ARGS, "--out", str(out)]) == 0


def killed_at(moment, out):
    """Start train.py into `out`, SIGKILL it at `moment`'s write; True if it got there."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO), **{atomic.PAUSE_VARIABLE: moment})
    process = subprocess.Popen([sys.executable, str(REPO / "train.py"), *ARGS, "--out", str(out)],
                               env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    try:
        while time.time() < deadline and process.poll() is None:
            if atomic.paused_under(out):
                return True
            time.sleep(0.05)
        return False
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()


def history(out):
    with open(out / "history.csv", newline="") as f:
        return [(int(row["epoch"]), float(row["val_accuracy"])) for row in csv.DictReader(f)]


def result(out):
    metrics = json.loads((out / "metrics.json").read_text())
    return metrics["confusion_matrix"], metrics["log_likelihood"], history(out)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    run_in_process(out)
    return result(out)


@pytest.fixture(scope="module")
def killed_in_epoch_3(tmp_path_factory):
    """A run killed inside epoch 3's history write: the backup holds epochs 2 and 1, the history epochs 0 and 1.

    The tests that damage such a folder in their own ways each take a copy: one
    kill (a process start and two epochs) serves them all.
    """
    out = tmp_path_factory.mktemp("killed") / "run"
    assert killed_at("history.csv:3", out)
    return out


def killed_copy(killed, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(killed, out)
    return out


def assert_same(out, uninterrupted):
    confusion, log_likelihood, rows = result(out)
    assert confusion == uninterrupted[0]
    assert log_likelihood == pytest.approx(uninterrupted[1], rel=1e-5)
    assert [epoch for epoch, _ in rows] == list(range(EPOCHS))
    assert [acc for _, acc in rows] == pytest.approx([acc for _, acc in uninterrupted[2]], abs=1e-6)
    assert not (out / "backup").exists()
    assert [path.name for path in (out / "epochs").iterdir()] == [KEPT]
    assert json.loads((out / "throughput.json").read_text())["training_images_per_second"] > 0


def test_there_are_at_least_20_moments_and_the_readme_counts_them():
    assert len(MOMENTS) >= 20
    assert f"inside each of its {len(MOMENTS)} file writes" in (REPO / "README.md").read_text()


@pytest.mark.parametrize("moment", MOMENTS)
def test_killed_inside_a_write_resumes_to_the_same_result(tmp_path, moment, uninterrupted):
    out = tmp_path / "run"
    assert killed_at(moment, out), f"the run never reached {moment}"
    assert not (out / "metrics.json").exists()  # the run's last write: the run is unfinished
    run_in_process(out)
    assert_same(out, uninterrupted)
    assert not list(out.rglob(".tmp-*")), "a temporary file was left behind"


def test_a_truncated_newest_backup_falls_back_with_one_line(tmp_path, capsys, uninterrupted, killed_in_epoch_3):
    out = killed_copy(killed_in_epoch_3, tmp_path)
    states = json.loads((out / "backup" / "state.json").read_text())["states"]
    assert [s["epoch"] for s in states] == [2, 1]
    newest = out / "backup" / states[0]["weights"]
    newest.write_bytes(newest.read_bytes()[:300])
    capsys.readouterr()
    run_in_process(out)
    lines = [line for line in capsys.readouterr().err.splitlines() if "does not load" in line]
    assert len(lines) == 1 and "falling back to epoch 1" in lines[0], lines
    assert_same(out, uninterrupted)


@pytest.mark.parametrize("text", ['{"states": [', '[1, 2]', '{"states": [{"epoch": "2"}]}'])
def test_an_unreadable_state_file_gives_way_to_the_weights_files_with_one_line(tmp_path, capsys, uninterrupted, text,
                                                                                 killed_in_epoch_3):
    # Before, it read as "no backup": training began again at epoch 0 and rotated both intact backups away.
    out = killed_copy(killed_in_epoch_3, tmp_path)
    (out / "backup" / "state.json").write_text(text)
    capsys.readouterr()
    run_in_process(out)
    lines = [line for line in capsys.readouterr().err.splitlines() if "unreadable" in line]
    assert len(lines) == 1 and lines[0].endswith("epoch0002.weights.h5, epoch0001.weights.h5"), lines
    sessions = json.loads((out / "provenance.json").read_text())["sessions"]
    assert [session["start_epoch"] for session in sessions] == [0, 2]  # resumed, not trained again
    assert_same(out, uninterrupted)
    # Each session names the device as metrics.json does: an unfinished run's epochs forecast its own time on it.
    assert {session["device"] for session in sessions} == {json.loads((out / "metrics.json").read_text())["device"]}
    assert all(session["cpu"] == cpu_identity() for session in sessions)  # which machine of that name


def test_a_damaged_provenance_is_refused_in_one_line_before_any_write_and_the_run_resumes_without_it(
        tmp_path, capsys, uninterrupted, killed_in_epoch_3):
    # Before, a traceback (a JSONDecodeError) on every rerun: the run could not be resumed.
    out = killed_copy(killed_in_epoch_3, tmp_path)
    (out / "provenance.json").write_text("{")
    before = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}
    capsys.readouterr()
    assert train.main([*ARGS, "--out", str(out)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"train.py: error: {out / 'provenance.json'} is not valid JSON (Expecting property name enclosed in double "
        "quotes: line 1 column 2 (char 1)): the record of which code trained this run's epochs; mend it or remove "
        "it (a new one then lists this session alone)"]
    assert {path: path.read_bytes() for path in out.rglob("*") if path.is_file()} == before
    (out / "provenance.json").unlink()
    run_in_process(out)
    assert [s["start_epoch"] for s in json.loads((out / "provenance.json").read_text())["sessions"]] == [2]
    assert_same(out, uninterrupted)


@pytest.mark.parametrize("damage, error", [
    ("a row that does not read", "history.csv, line 4, is no epoch's row"),
    ("no file", "history.csv has no row with epoch 0, 1 (0-based), of the 2 epochs the backup has seen"),
])
def test_a_damaged_history_is_refused_in_one_line_before_any_write_and_removing_the_backup_trains_again(
        tmp_path, capsys, uninterrupted, damage, error, killed_in_epoch_3):
    # Before, a row that does not read ended every rerun in a traceback; missing rows were resumed over, and
    # the finished run, short of rows, counted as unfinished and trained again from the start.
    out = killed_copy(killed_in_epoch_3, tmp_path)
    if damage == "no file":
        (out / "history.csv").unlink()
    else:
        with open(out / "history.csv", "a") as f:
            f.write("x,1,2\n")
    before = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}
    capsys.readouterr()
    assert train.main([*ARGS, "--out", str(out)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"train.py: error: {out}/{error}: mend it, or remove {out / 'backup'} to train the run again from the start"]
    assert {path: path.read_bytes() for path in out.rglob("*") if path.is_file()} == before
    shutil.rmtree(out / "backup")
    run_in_process(out)
    assert [s["start_epoch"] for s in json.loads((out / "provenance.json").read_text())["sessions"]] == [0, 0]
    assert_same(out, uninterrupted)


def test_ctrl_c_exits_130_in_one_line_and_the_same_command_resumes(tmp_path, uninterrupted):
    # A real process, TensorFlow's start-up log left to the tool to silence (no TF_CPP_MIN_LOG_LEVEL).
    out = tmp_path / "run"
    env = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(PYTHONPATH=str(REPO), **{atomic.PAUSE_VARIABLE: "history.csv:2"})
    # A shell without job control starts a background job (`nohup .ci/run &`) with SIGINT
    # ignored, and the child would inherit that: give it a terminal's default, as Ctrl-C meets.
    process = subprocess.Popen([sys.executable, str(REPO / "train.py"), *ARGS, "--out", str(out)], env=env,
                               cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 240
    try:
        while time.time() < deadline and process.poll() is None and not atomic.paused_under(out):
            time.sleep(0.05)
        assert process.poll() is None, "the run ended before its second epoch was written"
        assert atomic.paused_under(out), "the run did not reach its second epoch's write in 240 s"
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()  # nothing once it has exited; a child that ignored Ctrl-C must not outlive the test
        process.wait()
    assert process.returncode == 130, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines == ["train.py: interrupted; run the same command again to resume"], stderr
    run_in_process(out)
    assert_same(out, uninterrupted)
