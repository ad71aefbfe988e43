"""experiments.favor_floor: how much of FAVOR+'s attention is its epsilon floor, against brute force."""

import json

import keras
import numpy as np
import pytest

import performer_keras
from experiments import favor_floor, history
from performer_keras.kernel_attention import KernelAttention
from run_folders import tiny_run_folder


def brute_force_floor(layer, inputs):
    """Share of key and query features whose exp(w^T x' - |x'|^2/2 - M) < eps, M the maximum of what the layer's
    stabilizer names, and the floor's share of each query's attention weight, by loops."""
    q, k, _ = (np.asarray(x, "float64") for x in layer.heads(inputs))
    w = np.asarray(layer.features.projection, "float64")
    d, eps = q.shape[-1], layer.features.epsilon
    floored, mass = {"key": [], "query": []}, []
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            keys = k[b, h] * d**-0.25
            key_logits = keys @ w.T
            exponents = key_logits - 0.5 * np.sum(keys**2, axis=-1, keepdims=True)
            top = (key_logits if layer.features.stabilizer == "logits" else exponents).max()  # one M for all keys of (b, h)
            for j in range(keys.shape[0]):
                part = np.exp(key_logits[j] - 0.5 * keys[j] @ keys[j] - top)
                floored["key"].extend(part < eps)
                query = q[b, h, j] * d**-0.25
                logits = w @ query
                floored["query"].extend(np.exp(logits - 0.5 * query @ query - logits.max()) < eps)
            phi_q, phi_k = (np.asarray(x, "float64")[b, h] for x in layer.features(q.astype("float32"), k.astype("float32")))
            for i in range(q.shape[2]):
                weights = [phi_q[i] @ phi_k[j] for j in range(k.shape[2])]
                floor_weights = [phi_q[i] @ np.full(phi_k.shape[1], eps / np.sqrt(phi_k.shape[1])) for _ in weights]
                mass.append(sum(floor_weights) / sum(weights))
    return np.mean(floored["key"]), np.mean(floored["query"]), np.mean(mass)


def brute_force_entropy(weights):
    """Mean over rows of -sum p log p / log N of row-normalised (.., N, N) weights."""
    rows = np.reshape(weights, (-1, weights.shape[-1]))
    entropies = []
    for row in rows:
        p = row / row.sum()
        entropies.append(-sum(x * np.log(x) for x in p if x > 0) / np.log(len(p)))
    return np.mean(entropies)


@pytest.mark.parametrize("stabilizer", ["logits", "exponent"])
@pytest.mark.parametrize("key_scale", [1.0, 30.0])
def test_floor_and_entropies_match_brute_force(key_scale, stabilizer):
    keras.utils.set_random_seed(3)
    layer = KernelAttention(num_heads=2, kernel_name="favor", num_features=16, grid_size=(3, 4), seed=1,
                            stabilizer=stabilizer)
    inputs = np.random.default_rng(0).normal(size=(2, 13, 16)).astype("float32")
    layer(inputs)
    # Large keys push every other key's features under the floor: the collapse this tool looks for.
    layer.key.kernel.assign(layer.key.kernel * key_scale)
    row = favor_floor.layer_floor(layer, inputs)

    key_share, query_share, floor_mass = brute_force_floor(layer, inputs)
    assert row["floor_mass"] == pytest.approx(floor_mass, rel=1e-6)
    assert row["key_floor_share"] == pytest.approx(key_share, abs=1e-9)
    assert row["query_floor_share"] == pytest.approx(query_share, abs=1e-9)
    q, k, _ = (np.asarray(x, "float64") for x in layer.heads(inputs))
    phi_q, phi_k = (np.asarray(x, "float64") for x in layer.features(q.astype("float32"), k.astype("float32")))
    assert row["entropy_favor"] == pytest.approx(brute_force_entropy(phi_q @ np.swapaxes(phi_k, -1, -2)), rel=1e-9)
    logits = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    assert row["entropy_softmax"] == pytest.approx(brute_force_entropy(np.exp(logits - logits.max())), rel=1e-6)
    assert row["key_norm_sq"]["max"] == pytest.approx(((k**2).sum(-1) / np.sqrt(8)).max(), rel=1e-9)
    if key_scale == 1.0:
        assert key_share < 0.5 and floor_mass < 0.01
    elif stabilizer == "logits":
        assert key_share > 0.9 and floor_mass > 0.9 and row["entropy_favor"] > 0.99  # floored keys: a uniform average
    else:
        # As many features under the floor, but the keys of the largest exponents sit at 1, far above it: the floor
        # holds almost none of the weight.
        assert key_share > 0.9 and floor_mass < 0.05


def test_kerple_gets_the_floor_shares_and_no_attention_figures():
    # Its weights carry the position's exp(b) too, so neither the floor's share of them nor their entropy is phi's.
    layer = KernelAttention(num_heads=2, kernel_name="favor", position="kerple", grid_size=(3, 4), num_features=8)
    inputs = np.random.default_rng(2).normal(size=(2, 13, 16)).astype("float32")
    layer(inputs)
    row = favor_floor.layer_floor(layer, inputs)
    assert row["floor_mass"] is row["entropy_favor"] is row["entropy_softmax"] is None
    assert row["key_floor_share"] == pytest.approx(brute_force_floor(layer, inputs)[0], abs=1e-9)


def test_heads_are_what_the_kernel_receives():
    """heads() normalises q and k to qk_norm sqrt(d) (learned scale at 0) and rotates them for rope."""
    layer = KernelAttention(num_heads=2, kernel_name="favor", position="rope", grid_size=(2, 3), normalize_qk=True,
                            qk_norm=0.5, num_features=8)
    inputs = np.random.default_rng(1).normal(size=(1, 7, 8)).astype("float32")
    layer(inputs)
    q, k, v = (np.asarray(x) for x in layer.heads(inputs))
    assert q.shape == k.shape == v.shape == (1, 2, 7, 4)
    np.testing.assert_allclose(np.linalg.norm(q, axis=-1), 0.5 * 2.0, rtol=1e-5)  # rotations keep norms
    plain = np.asarray(layer.query(inputs)).reshape(1, 7, 2, 4).transpose(0, 2, 1, 3)
    unit = plain / np.linalg.norm(plain, axis=-1, keepdims=True)
    np.testing.assert_allclose(q[:, :, 0], unit[:, :, 0], rtol=1e-5, atol=1e-6)  # CLS is not rotated
    assert not np.allclose(q[:, :, 1:], unit[:, :, 1:], atol=1e-3)  # grid tokens are


@pytest.fixture(scope="module")
def favor_run(tmp_path_factory):
    """A run folder with best.keras after epoch 2 of 3 and a backup of epoch 3."""
    run = tmp_path_factory.mktemp("favor-run")
    model = tiny_run_folder(run, "favor-absolute", {"variant": "favor-absolute", "dataset": "mnist"},
                            "epoch,accuracy,epoch_seconds,val_accuracy\n0,0.5,9,0.80\n1,0.7,9,0.90\n2,0.6,9,0.85\n")
    (run / "backup").mkdir()
    model.save_weights(run / "backup" / "epoch0003.weights.h5")
    return run


def test_main_writes_one_record_per_checkpoint(favor_run, monkeypatch):
    real_read, read = history.read_history, []
    monkeypatch.setattr(history, "read_history", lambda path, **kwargs: read.append(path) or real_read(path, **kwargs))
    assert favor_floor.main([str(favor_run), str(favor_run / "backup" / "epoch0003.weights.h5"), "--limit", "8"]) == 0
    assert len(read) == 2  # each checkpoint's history.csv once, before the measurement
    record = json.loads((favor_run / "favor_floor.json").read_text())
    assert record["command"].endswith(f"python -m experiments.favor_floor {favor_run} "
                                      f"{favor_run / 'backup' / 'epoch0003.weights.h5'} --limit 8")
    best, backup = record["checkpoints"]
    assert (best["epoch"], best["val_accuracy"], backup["epoch"], backup["val_accuracy"]) == (2, 0.90, 3, 0.85)
    assert best["dataset"] == "mnist" and best["examples"] == 8
    assert [row["layer"] for row in best["layers"]] == [f"block_{i}_attention" for i in range(len(best["layers"]))]
    assert best["layers"] == backup["layers"]  # the same weights
    assert best["stabilizer"] == "exponent"  # the model's own, the library's default

    # Measured under the other stabilizer: the same model, other features.
    assert favor_floor.main([str(favor_run), "--limit", "8", "--stabilizer", "logits", "--out", str(favor_run / "x")]) == 0
    other = json.loads((favor_run / "x" / "favor_floor.json").read_text())["checkpoints"][0]
    assert other["stabilizer"] == "logits" and other["layers"][0]["floor_mass"] != best["layers"][0]["floor_mass"]
    assert other["layers"][0]["key_norm_sq"] == best["layers"][0]["key_norm_sq"]

    # Weights under a name without an epoch number (this was a traceback): measured, their epoch unknown.
    named = favor_run / "backup" / "last.weights.h5"
    named.write_bytes((favor_run / "backup" / "epoch0003.weights.h5").read_bytes())
    assert favor_floor.main([str(named), "--limit", "8", "--out", str(favor_run / "y")]) == 0
    last = json.loads((favor_run / "y" / "favor_floor.json").read_text())["checkpoints"][0]
    assert (last["epoch"], last["val_accuracy"], last["layers"]) == (None, None, backup["layers"])
    named.unlink()


# Keras warns of the other model's layers it finds no weights for before it refuses the file ("other-weights").
@pytest.mark.filterwarnings("ignore:Skipping nested container:UserWarning")
@pytest.mark.parametrize("case, message", [
    ("missing", "does not exist"),
    ("loose-weights", "is not in a folder (backup/, epochs/) of a run folder with best.keras"),
    ("softmax", "has no FAVOR+ attention layer"),
    ("bare-keras", "is not in a run folder; give --out"),
    ("bare-keras-out", "no run config.json to take the dataset from; give --dataset"),
    ("stabilizer", "Unknown stabilizer 'max'; expected one of ('logits', 'exponent')"),
    ("damaged-history", "history.csv, line 3, is no epoch's row"),  # refused before it is measured, not after
    ("config-list", "config.json holds a JSON list, not an object"),  # these two were tracebacks
    ("config-without-dataset", "config.json names no dataset; give --dataset"),
    # These three were tracebacks: a model of other images, a damaged best.keras, another model's weights.
    ("other-images", "takes inputs of shape (14, 14, 1), but mnist's images have (28, 28, 1)"),
    ("damaged-keras", "best.keras does not load: "),
    ("other-weights", "epoch0001.weights.h5 does not load: "),
])
def test_bad_checkpoints_fail_in_one_line(favor_run, tmp_path, capsys, case, message):
    softmax = tmp_path / "softmax"
    softmax.mkdir()
    performer_keras.create_model("softmax-absolute", size="tiny", image_shape=(28, 28, 1), num_classes=10).save(
        softmax / "best.keras")
    (softmax / "config.json").write_text(json.dumps({"dataset": "mnist"}))
    loose = tmp_path / "epoch0001.weights.h5"
    loose.write_bytes((favor_run / "backup" / "epoch0003.weights.h5").read_bytes())
    bare = tmp_path / "model.keras"
    bare.write_bytes((favor_run / "best.keras").read_bytes())
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for name in ("best.keras", "config.json"):
        (damaged / name).write_bytes((favor_run / name).read_bytes())
    listed, undescribed = tmp_path / "listed", tmp_path / "undescribed"
    for folder, config in ((listed, "[1]"), (undescribed, "{}")):
        folder.mkdir()
        (folder / "best.keras").write_bytes((favor_run / "best.keras").read_bytes())
        (folder / "config.json").write_text(config)
    (damaged / "history.csv").write_text("epoch,accuracy,epoch_seconds,val_accuracy\n0,0.5,9,0.80\n1,0.7,x,0.90\n")
    small, broken = tmp_path / "small", tmp_path / "broken"
    small.mkdir()
    performer_keras.create_model("favor-absolute", size="tiny", image_shape=(14, 14, 1), num_classes=10).save(
        small / "best.keras")
    (small / "config.json").write_text(json.dumps({"dataset": "mnist"}))
    (small / "backup").mkdir()
    (small / "backup" / "epoch0001.weights.h5").write_bytes((favor_run / "backup" / "epoch0003.weights.h5").read_bytes())
    broken.mkdir()
    (broken / "best.keras").write_bytes((favor_run / "best.keras").read_bytes()[:1000])
    (broken / "config.json").write_text(json.dumps({"dataset": "mnist"}))
    argv = {"missing": [str(tmp_path / "nothing")], "loose-weights": [str(favor_run), str(loose)],
            "softmax": [str(softmax)], "bare-keras": [str(bare)],
            "bare-keras-out": [str(bare), "--out", str(tmp_path / "out")],
            "stabilizer": [str(favor_run), "--stabilizer", "max", "--out", str(tmp_path / "out")],
            "damaged-history": [str(damaged), "--out", str(tmp_path / "out")],
            "config-list": [str(listed), "--out", str(tmp_path / "out")],
            "config-without-dataset": [str(undescribed), "--out", str(tmp_path / "out")],
            "other-images": [str(small), "--out", str(tmp_path / "out")],
            "damaged-keras": [str(broken), "--out", str(tmp_path / "out")],
            "other-weights": [str(small / "backup" / "epoch0001.weights.h5"), "--out", str(tmp_path / "out")]}[case]
    assert favor_floor.main([*argv, "--limit", "4"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m experiments.favor_floor: error:") and message in lines[0]
    assert not (tmp_path / "out").exists()
