"""experiments.rebuild_logs: a run's logs rebuilt from its folder equal the logs its training wrote."""

import json
import shutil

import pytest

import train
from experiments import rebuild_logs

TINY = ["--size", "tiny", "--limit", "400", "--batch-size", "32", "--epochs", "2"]


def scalars(log_dir):
    """{tag: [(step, value)]} of every scalar in the event files of `log_dir`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    events = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    events.Reload()
    return {tag: [(event.step, float(make_ndarray(event.tensor_proto))) for event in events.Tensors(tag)]
            for tag in events.Tags()["tensors"] if not tag.startswith("_hparams_")}


def hparams(log_dir):
    """(the run's hyperparameters, the experiment's metric columns) from the HParams summaries in `log_dir`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    events.Reload()
    values, columns = {}, set()
    for content in events.PluginTagToContent("hparams").values():
        data = plugin_data_pb2.HParamsPluginData.FromString(content)
        if data.HasField("session_start_info"):
            values = {key: getattr(value, value.WhichOneof("kind"))
                      for key, value in data.session_start_info.hparams.items()}
        if data.HasField("experiment"):
            columns = {(m.name.tag, m.name.group) for m in data.experiment.metric_infos}
    return values, columns


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished tiny run whose training wrote its own logs."""
    out = tmp_path_factory.mktemp("trained") / "seed0"
    assert train.main([*TINY, "--out", str(out)]) == 0
    return out


def without_logs(run, folder):
    shutil.copytree(run, folder, ignore=shutil.ignore_patterns("logs", "best.keras", "backup"))
    return folder


def test_the_rebuilt_logs_equal_the_ones_training_wrote(trained, tmp_path):
    copy = without_logs(trained, tmp_path / "seed0")
    assert rebuild_logs.main([str(copy)]) == 0
    for group in ("train", "validation", "test"):
        written, rebuilt = scalars(trained / "logs" / group), scalars(copy / "logs" / group)
        assert written and rebuilt.keys() == written.keys(), group
        for tag, points in written.items():
            assert [step for step, _ in rebuilt[tag]] == [step for step, _ in points], (group, tag)
            assert [value for _, value in rebuilt[tag]] == pytest.approx([value for _, value in points], rel=1e-6)
    assert scalars(copy / "logs" / "test")["test_accuracy"] == [(2, pytest.approx(
        json.loads((trained / "metrics.json").read_text())["test_accuracy"]))]
    assert hparams(copy / "logs") == hparams(trained / "logs")
    assert "rebuild_logs" in (copy / "logs" / rebuild_logs.REBUILT_NOTE).read_text()
    assert not (copy / "logs.partial").exists()


def test_a_kill_midway_leaves_nothing_that_blocks_the_next_try(trained, tmp_path):
    copy = without_logs(trained, tmp_path / "seed0")
    (copy / "logs.partial" / "train").mkdir(parents=True)
    (copy / "logs.partial" / "train" / "events.out.tfevents.cut").write_bytes(b"\x00" * 5)
    assert rebuild_logs.main([str(copy)]) == 0
    assert not (copy / "logs.partial").exists()
    assert "events.out.tfevents.cut" not in {path.name for path in (copy / "logs" / "train").iterdir()}
    assert scalars(copy / "logs" / "train") == scalars(trained / "logs" / "train")


def test_bad_folders_are_refused_in_one_line_before_anything_is_written(trained, tmp_path, capsys):
    good = without_logs(trained, tmp_path / "good")
    unfinished = without_logs(trained, tmp_path / "unfinished")
    (unfinished / "metrics.json").unlink()
    no_epochs = without_logs(trained, tmp_path / "no_epochs")
    header = (no_epochs / "history.csv").read_text().splitlines()[0]
    (no_epochs / "history.csv").write_text(header + "\n")
    damaged = without_logs(trained, tmp_path / "damaged")  # a cell that was no number ended in a traceback
    with open(damaged / "history.csv", "a") as f:
        f.write("x" + header.count(",") * ",1" + "\n")
    # Each of these ended in a traceback once the checks had passed (JSONDecodeError, 'list' object is not a
    # mapping, an unexpected keyword argument, an unknown variant).
    records = {"metrics.json": "{", "config.json": "[1]"}
    records_damaged = {name: without_logs(trained, tmp_path / name) for name in records}
    for name, text in records.items():
        (records_damaged[name] / name).write_text(text)
    unknown_key, unknown_variant = (without_logs(trained, tmp_path / name) for name in ("unknown_key", "unknown_variant"))
    recorded = json.loads((trained / "config.json").read_text())
    (unknown_key / "config.json").write_text(json.dumps({**recorded, "colour": "red"}))
    (unknown_variant / "config.json").write_text(json.dumps({**recorded, "variant": "favor-nowhere"}))
    lacking = without_logs(trained, tmp_path / "lacking")  # an empty object would have been a run of the defaults
    (lacking / "config.json").write_text(json.dumps({k: v for k, v in recorded.items() if k != "learning_rate"}))
    cases = [([str(trained)], "exists; only a run without logs is rebuilt"),
             ([str(good), str(unfinished)], "is not a finished run folder (no metrics.json)"),
             ([str(no_epochs)], "history.csv has no epochs"),
             ([str(good), str(damaged)], "is no epoch's row"),
             ([str(good), str(records_damaged["metrics.json"])], "metrics.json is not valid JSON"),
             ([str(records_damaged["config.json"])], "config.json holds a JSON list, not an object"),
             ([str(unknown_key)], "config.json describes no run (unknown keys ['colour'])"),
             ([str(unknown_variant)], "config.json describes no run (Unknown"),
             ([str(lacking)], "config.json describes no run (lacks ['learning_rate'])"),
             ([str(tmp_path / "missing")], "is not a finished run folder (no config.json, history.csv, metrics.json)")]
    for argv, said in cases:
        capsys.readouterr()
        assert rebuild_logs.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], err
    assert not (good / "logs").exists()  # checked with its bad neighbour, so not written
    with pytest.raises(SystemExit) as exit:
        rebuild_logs.main([])
    assert exit.value.code == 2
