"""Tests of the bundled datasets, the splits and the training and evaluation pipelines.

The full datasets are loaded once per session (CIFAR-10 is decoded once and
then read from the cache); pipelines run on small `limit`ed splits so the whole
file stays fast. tensorflow-datasets is monkeypatched, never reached.
"""

import shutil
import time
import types

import keras
import numpy as np
import pytest

from experiments import augment as augment_module
from experiments import data, pipelines
from experiments.run_config import AUGMENTATIONS


@pytest.fixture(scope="session")
def mnist():
    return data.load_dataset("mnist")


@pytest.fixture(scope="session")
def cifar10():
    return data.load_dataset("cifar10")


@pytest.fixture(scope="session")
def small_mnist():
    return data.load_dataset("mnist", limit=200)


@pytest.fixture(scope="session")
def small_cifar10():
    return data.load_dataset("cifar10", limit=200)


def _batches(dataset):
    return [(keras.ops.convert_to_numpy(x), keras.ops.convert_to_numpy(y)) for x, y in dataset]


def _assert_same_batches(first, second):
    assert len(first) == len(second)
    for (x1, y1), (x2, y2) in zip(first, second):
        np.testing.assert_array_equal(y1, y2)
        np.testing.assert_array_equal(x1, x2)


# === Files and splits ===


@pytest.mark.parametrize(
    "name, sizes, shape",
    [("mnist", (55000, 5000, 10000), (28, 28, 1)), ("cifar10", (45000, 5000, 10000), (32, 32, 3))],
)
def test_split_sizes_shapes_and_dtypes(name, sizes, shape, request):
    splits = request.getfixturevalue(name)
    assert splits.name == name
    assert splits.image_shape == shape
    assert splits.num_classes == len(splits.label_names) == 10
    for (images, labels), size in zip((splits.train, splits.validation, splits.test), sizes):
        assert images.shape == (size, *shape) and images.dtype == np.uint8
        assert labels.shape == (size,) and labels.dtype == np.int32
        assert labels.min() == 0 and labels.max() == 9


def test_mnist_file_order_matches_readme():
    _, y_train, _, y_test, label_names = data._read_bundled("mnist", data.DATA_DIR)
    assert list(y_train[:10]) == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
    assert list(y_test[:10]) == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    assert label_names == tuple("0123456789")


@pytest.mark.parametrize("name", data.BUNDLED)
def test_validation_is_drawn_from_train(name, request):
    splits = request.getfixturevalue(name)
    _, y_train, _, y_test, _ = data._read_bundled(name, data.DATA_DIR)
    both = np.concatenate([splits.train[1], splits.validation[1]])
    np.testing.assert_array_equal(np.bincount(both), np.bincount(y_train))
    np.testing.assert_array_equal(np.bincount(splits.test[1]), np.bincount(y_test))


def test_mnist_channel_statistics(mnist):
    np.testing.assert_allclose(mnist.mean, [0.1307 * 255], rtol=0.01)
    np.testing.assert_allclose(mnist.std, [0.3081 * 255], rtol=0.01)
    np.testing.assert_allclose(mnist.mean, [mnist.train[0].mean()], rtol=1e-9)


def test_cifar10_classes_statistics_and_cache(cifar10):
    assert cifar10.label_names == (
        "airplane", "automobile", "bird", "cat", "deer",
        "dog", "frog", "horse", "ship", "truck",
    )  # fmt: skip
    np.testing.assert_array_equal(np.bincount(cifar10.test[1]), [1000] * 10)
    # The README's statistics of this JPEG copy, which the decoder must reproduce.
    np.testing.assert_allclose(cifar10.mean, np.array([0.4913, 0.4827, 0.4471]) * 255, rtol=0.005)
    np.testing.assert_allclose(cifar10.std, np.array([0.2456, 0.2432, 0.2615]) * 255, rtol=0.01)
    assert list(data.CACHE_DIR.glob("cifar10-12fc5d91bf6b428a.npy"))


def test_split_is_the_same_for_every_call(small_mnist):
    again = data.load_dataset("mnist", limit=200)
    for first, second in zip(
        (small_mnist.train, small_mnist.validation, small_mnist.test),
        (again.train, again.validation, again.test),
    ):
        np.testing.assert_array_equal(first[0], second[0])
        np.testing.assert_array_equal(first[1], second[1])
    other_seed = data.load_dataset("mnist", limit=200, split_seed=7)
    assert not np.array_equal(other_seed.validation[1], small_mnist.validation[1])


def test_limit_takes_the_first_examples_of_each_split(mnist, small_mnist):
    for full, limited in zip(
        (mnist.train, mnist.validation, mnist.test),
        (small_mnist.train, small_mnist.validation, small_mnist.test),
    ):
        np.testing.assert_array_equal(limited[0], full[0][:200])
        np.testing.assert_array_equal(limited[1], full[1][:200])
    np.testing.assert_allclose(small_mnist.mean, [small_mnist.train[0].mean()], rtol=1e-9)
    np.testing.assert_allclose(small_mnist.std, [small_mnist.train[0].std()], rtol=1e-9)
    with pytest.raises(ValueError, match="limit"):
        data.load_dataset("mnist", limit=0)


def test_damaged_file_fails_with_one_line(tmp_path):
    copy = tmp_path / "mnist.npz"
    shutil.copyfile(data.DATA_DIR / "mnist.npz", copy)
    raw = bytearray(copy.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    copy.write_bytes(bytes(raw))
    with pytest.raises(data.DataError, match="damaged") as error:
        data.load_dataset("mnist", data_dir=tmp_path)
    assert "\n" not in str(error.value) and "mnist.npz" in str(error.value)


def test_missing_file_fails_with_one_line(tmp_path):
    with pytest.raises(data.DataError, match="missing") as error:
        data.load_dataset("cifar10", data_dir=tmp_path)
    assert "\n" not in str(error.value) and "git checkout" in str(error.value)


def test_unloadable_dataset_names_the_offline_alternatives(monkeypatch):
    import tensorflow_datasets as tfds

    def fail(*args, **kwargs):
        raise RuntimeError("Dataset nope not found.\nAvailable datasets:\n - mnist ...")

    monkeypatch.setattr(tfds, "load", fail)
    with pytest.raises(data.DataError) as error:
        data.load_dataset("nope")
    message = str(error.value)
    assert "\n" not in message
    assert "tensorflow-datasets" in message and "not found" in message
    assert "'mnist'" in message and "'cifar10'" in message


def test_a_tfds_name_without_local_copy_fails_in_seconds_offline(monkeypatch):
    import tensorflow_datasets as tfds
    monkeypatch.setattr(data, "network_reachable", lambda: False)
    monkeypatch.setattr(tfds, "load", lambda *args, **kwargs: pytest.fail("tfds.load would retry for minutes"))
    start = time.perf_counter()
    with pytest.raises(data.DataError) as error:
        data.load_dataset("fashion_mnist")  # a real tfds name, never downloaded on a test machine
    assert time.perf_counter() - start < 30
    message = str(error.value)
    assert "\n" not in message and "not in the tensorflow-datasets cache" in message and "'mnist'" in message


def test_tfds_dataset_is_split_like_the_bundled_ones(monkeypatch):
    import tensorflow_datasets as tfds
    import tensorflow as tf

    rng = np.random.default_rng(0)

    def fake_load(name, split, as_supervised, batch_size, with_info):
        assert split == ["train", "test"] and as_supervised and batch_size == -1
        make = lambda n: (  # noqa: E731
            tf.constant(rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8)),
            tf.constant(rng.integers(0, 2, n), tf.int64),
        )
        info = types.SimpleNamespace(
            supervised_keys=("image", "label"),
            features={"label": types.SimpleNamespace(names=["cat", "dog"])},
        )
        return (make(1000), make(300)), info

    monkeypatch.setattr(tfds, "load", fake_load)
    monkeypatch.setattr(data, "_check_tfds_reachable", lambda tfds, name, offline: None)
    splits = data.load_dataset("fake_rgb")
    # 5,000 validation examples would be half the data: capped at 10%.
    assert [len(s[1]) for s in (splits.train, splits.validation, splits.test)] == [900, 100, 300]
    assert splits.label_names == ("cat", "dog") and splits.train[1].dtype == np.int32


# === Pipelines (on whichever backend runs the tests) ===


def test_steps_and_batch_counts(small_mnist):
    images, labels = small_mnist.train
    assert data.steps_per_epoch(200, 64) == 3  # floor: the last 8 examples wait
    pipeline = pipelines.train_batches(images, labels, 64, seed=0, kind="none", start_epoch=1, epochs=4)
    if keras.backend.backend() == "tensorflow":  # Keras runs an epoch of a dataset without steps_per_epoch by its length
        assert int(pipeline.cardinality()) == 3 * 3
    batches = _batches(pipeline)
    assert len(batches) == 3 * 3
    evaluation = _batches(pipelines.eval_batches(images, labels, 64))
    assert [len(y) for _, y in evaluation] == [64, 64, 64, 8]
    np.testing.assert_array_equal(np.concatenate([x for x, _ in evaluation]), images)
    assert evaluation[0][0].dtype == np.float32
    with pytest.raises(ValueError, match="batch_size"):
        data.steps_per_epoch(10, 64)


def test_an_epoch_s_order_is_drawn_when_the_epoch_starts_not_all_epochs_up_front(small_mnist, monkeypatch):
    images, labels = small_mnist.train
    drawn = []

    def counted(seed, epoch, num_examples):
        drawn.append(epoch)
        return data.epoch_order(seed, epoch, num_examples)

    monkeypatch.setattr(pipelines, "epoch_order", counted)
    # Orders for 100,000 epochs up front would be 100,000 permutations before the first batch.
    batches = iter(pipelines.train_batches(images, labels, 8, seed=0, kind="none", start_epoch=3, epochs=100_000))
    first = next(batches)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(first[1]), labels[data.epoch_order(0, 3, len(labels))[:8]])
    # The TensorFlow pipeline prefetches, so it may have begun an epoch or two ahead.
    assert drawn[0] == 3 and len(drawn) < 10, drawn


@pytest.mark.parametrize(
    "name, augment", [("small_mnist", "rotate"), ("small_cifar10", "crop_flip")]
)
def test_resumed_epoch_equals_uninterrupted_epoch(name, augment, request):
    images, labels = request.getfixturevalue(name).train
    steps = data.steps_per_epoch(len(labels), 32)
    uninterrupted = _batches(pipelines.train_batches(images, labels, 32, 5, augment, epochs=3))
    resumed = _batches(pipelines.train_batches(images, labels, 32, 5, augment, start_epoch=2, epochs=3))
    _assert_same_batches(uninterrupted[2 * steps :], resumed)
    assert not np.array_equal(uninterrupted[0][1], uninterrupted[steps][1])  # epochs differ
    other_seed = _batches(pipelines.train_batches(images, labels, 32, 6, augment, epochs=1))
    assert not np.array_equal(other_seed[0][0], uninterrupted[0][0])


@pytest.mark.parametrize("augment", AUGMENTATIONS)
def test_batch_j_of_epoch_k_is_the_documented_examples_augmented(augment, small_cifar10):
    images, labels = small_cifar10.train
    batches = _batches(pipelines.train_batches(images, labels, 50, seed=3, kind=augment, epochs=2))
    x, y = batches[5]  # epoch 1 (4 steps of 50 per epoch), step 1
    index = data.epoch_order(3, 1, len(labels))[50:100]
    assert x.shape == (50, 32, 32, 3) and x.dtype == np.float32 and y.dtype == np.int32
    np.testing.assert_array_equal(y, labels[index])
    expected = keras.ops.convert_to_numpy(augment_module.augment(images[index], index, 1, 3, augment))
    np.testing.assert_allclose(x, expected, rtol=1e-5, atol=1e-3)  # graph and eager round differently
    assert 0.0 <= x.min() and x.max() <= 255.0 + 1e-3  # bilinear weights sum to 1 up to rounding
    assert np.array_equal(x, images[index]) == (augment == "none")


def test_augmentation_choices():
    assert data.augmentation_for("mnist") == "rotate"
    assert data.augmentation_for("fashion_mnist") == "rotate"
    assert data.augmentation_for("cifar10") == "crop_flip"
    assert data.augmentation_for("cifar100") == "crop_flip"
    with pytest.raises(ValueError, match="Unknown augmentation 'mixup'"):
        pipelines.train_batches(np.zeros((4, 8, 8, 1), np.uint8), np.zeros(4), 2, 0, "mixup")


def test_epoch_order_depends_on_seed_and_epoch_alone():
    first = data.epoch_order(7, 3, 1000)
    np.testing.assert_array_equal(first, data.epoch_order(7, 3, 1000))
    np.testing.assert_array_equal(np.sort(first), np.arange(1000))
    assert not np.array_equal(first, data.epoch_order(7, 4, 1000))
    assert not np.array_equal(first, data.epoch_order(8, 3, 1000))


def test_pipeline_throughput_is_positive(small_mnist):
    assert pipelines.pipeline_throughput(*small_mnist.train, 32, "rotate", batches=3) > 0
