"""A new linear kernel through the registry alone: one FeatureMap class and one table entry.

The toy kernel below is the "linear transformer" feature map phi(x) = elu(x) + 1
(Katharopoulos et al. 2020, arXiv:2006.16236), defined here in the test, not
in the library. Registered, it must be a variant like any other: listed, built
by `create_model`, trained, saved and reloaded, counted by the analytic FLOPs,
searched by the tuner and styled in the figures, and its attention must equal
the brute-force N x N form.
"""

import warnings

import keras
import numpy as np
import pytest
from keras import ops

import performer_keras as pk
from performer_keras.registry import (KERNEL_TABLE, SELECTIVE_OPTIONS, Kernel, ignored_options, linear_kernels, list_variants,
                                      model_config, parse_variant, register_kernel)

from layer_test_case import run_layer_test, to_numpy


@keras.saving.register_keras_serializable(package="performer_keras_tests")
class EluFeatures(pk.FeatureMap):
    """phi(x) = elu(x) + 1: positive, deterministic, m = d."""

    def output_dim(self, input_dim):
        return input_dim

    def call(self, queries, keys, training=None):
        return tuple(ops.elu(ops.cast(x, "float32")) + 1.0 for x in (queries, keys))


@pytest.fixture
def elu_kernel():
    register_kernel("elu", Kernel(features=EluFeatures, colour="tab:olive"))
    yield "elu"
    del KERNEL_TABLE["elu"]


def test_a_registered_feature_map_is_a_variant_like_any_other(elu_kernel, tmp_path):
    from experiments.figures import kernel_colour
    from experiments.flops import analytic_attention_flops
    from experiments.run_config import RunConfig
    from tuning.search_spaces import kernel_space

    assert "elu" in linear_kernels() and "elu-rope" in list_variants(extra=True)
    assert "elu-rope" not in list_variants()  # not a row of the main table
    assert RunConfig(variant="elu-kerple").attention == "elu"
    assert set(kernel_space("elu")) == {"learning_rate", "weight_decay"}
    assert kernel_colour("elu") == "tab:olive"
    # No projection, m = d = 8: 8 N D^2 + 4 N d D + 2 N d H.
    assert analytic_attention_flops(50, 16, 2, "elu") == 8 * 50 * 16**2 + 4 * 50 * 8 * 16 + 2 * 50 * 8 * 2

    keras.utils.set_random_seed(0)
    model = pk.create_model("elu-rope", size="tiny")
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (64, 28, 28, 1)).astype("float32"), rng.integers(0, 10, 64)
    history = model.fit(images, labels, batch_size=32, epochs=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    model.save(tmp_path / "elu.keras")
    reloaded = keras.saving.load_model(tmp_path / "elu.keras", custom_objects=pk.custom_objects())
    np.testing.assert_allclose(reloaded.predict(images[:4], verbose=0), model.predict(images[:4], verbose=0), atol=1e-6)


def test_a_registered_feature_map_computes_the_brute_force_attention(elu_kernel):
    heads, width, tokens = 2, 8, 10
    layer = pk.KernelAttention(heads, elu_kernel)
    x = np.random.default_rng(1).normal(size=(2, tokens, width)).astype("float32")
    run_layer_test(pk.KernelAttention, dict(num_heads=heads, kernel_name=elu_kernel), x,
                   expected_output_shape=(2, tokens, width), expected_num_trainable_weights=8)
    outputs = to_numpy(layer(x))

    def project(dense):
        y = x @ to_numpy(dense.kernel) + to_numpy(dense.bias)
        return y.reshape(2, tokens, heads, -1).transpose(0, 2, 1, 3)  # (batch, heads, N, d)

    def phi(y):
        return np.where(y > 0, y, np.expm1(y)) + 1.0

    q, k, v = (project(d) for d in (layer.query, layer.key, layer.value))
    weights = phi(q) @ phi(k).transpose(0, 1, 3, 2)  # (batch, heads, N, N), never formed by the layer
    attended = (weights / weights.sum(-1, keepdims=True)) @ v
    merged = attended.transpose(0, 2, 1, 3).reshape(2, tokens, width)
    expected = merged @ to_numpy(layer.output_dense.kernel) + to_numpy(layer.output_dense.bias)
    np.testing.assert_allclose(outputs, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "name, kernel, message",
    [
        ("favor", lambda: Kernel(features=EluFeatures), "exists"),
        ("elu-2", lambda: Kernel(features=EluFeatures), "without '-'"),
        # Each of these was taken, then failed when a model was built: Keras refused "/" in the model's name, a
        # feature map that was no FeatureMap, an unknown "module:Class" and unknown options with their own errors.
        ("e/lu", lambda: Kernel(features=EluFeatures), r"letters, digits and '_'.*got 'e/lu'"),
        ("elu", lambda: dict(features=EluFeatures), "takes a Kernel"),
        ("elu", lambda: Kernel(features=dict), r"kernel 'elu': features must be a FeatureMap subclass, got <class 'dict'>"),
        ("elu", lambda: Kernel(features="nope:Nope"), r"kernel 'elu': features 'nope:Nope' names no class of performer_keras"),
        ("elu", lambda: Kernel(features=EluFeatures, options=("temperature",)),
         r"kernel 'elu': options \['temperature'\] are not arguments of EluFeatures"),
        ("favor2", lambda: Kernel(features="favor_features:FavorFeatures", options=("epsilon",)),
         r"kernel 'favor2': options \['epsilon'\] are not arguments of KernelAttention"),
    ],
)
def test_register_kernel_refuses_what_would_break_the_table(name, kernel, message):
    with pytest.raises(ValueError, match=message):
        register_kernel(name, kernel())
    assert {"elu", "e/lu", "favor2"}.isdisjoint(KERNEL_TABLE)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(features=EluFeatures, rotation_order="sideways"), "Unknown rotation_order"),
        # Read letter by letter: "'KernelAttention' object has no attribute 'n'" when built.
        (dict(features=EluFeatures, options="num_features"), r"Kernel options must be a tuple of option names, got 'num_features'"),
        # The tuner failed with a KeyError on an option the feature map does not take.
        (dict(features=EluFeatures, searched=("num_features",)), r"searched=\('num_features',\) must be among its options=\(\)"),
        (dict(random=True), "give features= too"),
        (dict(features=EluFeatures, main="yes"), "main must be True or False, got 'yes'"),
    ],
)
def test_a_kernel_entry_that_contradicts_itself_is_refused_when_made(fields, message):
    with pytest.raises(ValueError, match=message):
        Kernel(**fields)


class _WideFeatures(EluFeatures):
    def call(self, queries, keys, training=None):  # 2d features where output_dim says d
        return tuple(ops.concatenate([x, x], axis=-1) for x in super().call(queries, keys))


class _OneFeatures(EluFeatures):
    def call(self, queries, keys, training=None):
        return super().call(queries, keys)[0]


class _HalfFeatures(EluFeatures):
    def call(self, queries, keys, training=None):
        return tuple(ops.cast(x, "float16") for x in super().call(queries, keys))


@pytest.mark.parametrize("features, message", [
    # Trained without a word, with shapes and FLOP counts that its output_dim contradicts.
    (_WideFeatures, r"_WideFeatures's phi\(queries\): the features axis \(its output_dim\) must be 8, got 16"),
    (_OneFeatures, r"_OneFeatures.call must return \(phi\(queries\), phi\(keys\)\), got "),  # "too many values to unpack"
    (_HalfFeatures, r"_HalfFeatures must return float32 features, got float16 for the queries"),  # a backend's matmul error
])
@pytest.mark.parametrize("position", ["absolute", "kerple"])
def test_a_feature_map_that_breaks_its_contract_is_named_at_the_first_call(features, message, position):
    register_kernel("broken", Kernel(features=features))
    try:
        with pytest.raises(ValueError, match=message):
            pk.create_model(f"broken-{position}", size="tiny")(np.zeros((1, 28, 28, 1), "float32"))
    finally:
        del KERNEL_TABLE["broken"]


def test_a_table_entry_whose_features_are_not_a_feature_map_is_refused_when_built():
    KERNEL_TABLE["bogus"] = Kernel(features=dict)  # as a library kernel is added: an entry, not register_kernel
    try:
        with pytest.raises(ValueError, match="FeatureMap subclass"):
            pk.KernelAttention(2, "bogus")(np.zeros((1, 4, 8), "float32"))
    finally:
        del KERNEL_TABLE["bogus"]


def test_configs_saved_with_the_old_kernel_argument_still_load():
    config = pk.KernelAttention(2, "favor", num_features=8).get_config()
    assert config["kernel_name"] == "favor" and "kernel" not in config
    config["kernel"] = config.pop("kernel_name")  # as in a .keras file written before 0.3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        layer = pk.KernelAttention.from_config(config)
    assert layer.kernel_name == "favor"
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)


@pytest.mark.parametrize("name, match", [
    # A bare kernel read as a position of None ("Unknown position None"), which named neither the form nor the kernels.
    ("softmax", r"variant 'softmax' must be <kernel>-<position> such as 'favor-rope'; kernels \('softmax', 'favor'"),
    ("", r"variant '' must be <kernel>-<position>"),
    ("favor-", r"Unknown position ''; expected one of \('absolute', 'rope', 'string', 'kerple'\)"),
    ("-rope", r"Unknown attention ''"),
    ("favor-rope-x", r"Unknown position 'rope-x'"),
])
def test_parse_variant_names_the_form_it_wants(name, match):
    with pytest.raises(ValueError, match=match):
        parse_variant(name)
    assert parse_variant("favor-rope") == ("favor", "rope")


def test_model_config_refuses_heads_that_do_not_divide_the_width():
    assert model_config("tiny", width=32, heads=4)["width"] == 32
    with pytest.raises(ValueError, match="width 30 is not divisible by heads 4"):
        model_config("tiny", width=30, heads=4)
    with pytest.raises(ValueError, match="width 30 is not divisible by heads 4"):
        pk.create_model("softmax-absolute", size="tiny", width=30, heads=4)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(patch_size=0), "patch_size must be an integer >= 1"),
        (dict(depth=0), "depth must be an integer >= 1"),
        (dict(num_classes=1), "num_classes must be an integer >= 2, got 1"),
        (dict(num_classes=0), "num_classes must be an integer >= 2, got 0"),
        (dict(num_classes=2.0), r"num_classes must be an integer >= 2, got 2\.0"),
        (dict(image_shape=(8, 8)), r"image_shape must be \(height, width, channels\), three integers >= 1, got \(8, 8\)"),
        (dict(image_shape=(8, 8, 0)), r"image_shape must be \(height, width, channels\)"),
        (dict(absolute_position="no"), "absolute_position must be True or False, got 'no'"),  # truthy to bool()
        (dict(dropout=1.5), "dropout must be < 1, got 1.5"),
        (dict(dropout="0.1"), "dropout must be a finite number, got '0.1'"),
        # Python's "got multiple values for argument 'num_heads'" (a TypeError) named neither `heads` nor why;
        # `kernel` replaced `attention` with a DeprecationWarning.
        (dict(num_heads=4), r"build_vit sets num_heads \(from heads\) of every KernelAttention itself"),
        (dict(grid_size=(3, 3), kernel="favor"), r"sets kernel \(from attention\), grid_size \(from image_shape and patch_size\)"),
        (dict(num_prefix_tokens=0), r"num_prefix_tokens \(from the one class token\)"),
        (dict(mean="12", std=[1.0]), r"mean must be a list of finite numbers, one per channel, got '12'"),
    ],
)
def test_build_vit_refuses_bad_arguments_with_a_value_error_that_names_them(kwargs, match):
    arguments = dict(image_shape=(8, 8, 1), num_classes=3, width=8, depth=1, heads=2, mlp_dim=8, patch_size=4)
    with pytest.raises(ValueError, match=match):
        pk.build_vit(**{**arguments, **kwargs})


# A value of each selective option other than KernelAttention's default.
OTHER_VALUES = {"num_features": 8, "orthogonal": False, "redraw_interval": 3, "deterministic": True, "rope_mixed": True,
                "qk_norm": 1.0, "learn_qk_norm": False, "linformer_dim": 5, "stabilizer": "logits"}


def attention_behaviour(kernel, position, **options):
    """The output of a small KernelAttention at its initial weights (with a linear kernel's features of q and k:
    FAVOR+'s stabilizer moves the output by less than float32 resolves where q and k are short), and its
    weights' names and shapes."""
    keras.utils.set_random_seed(0)
    layer = pk.KernelAttention(2, kernel, position, grid_size=(2, 3), seed=1, **{"num_features": 16, **options})
    tokens = np.random.default_rng(0).normal(size=(2, 7, 8)).astype("float32")
    outputs = [to_numpy(layer(tokens)).ravel()]
    if layer.spec.linear:
        outputs += [to_numpy(phi).ravel() for phi in layer.features(*layer.heads(tokens)[:2])]
    return np.concatenate(outputs), sorted((w.path.partition("/")[2], tuple(w.shape)) for w in layer.weights)


# Every variant at its defaults, and the settings that change what the others read.
SETTINGS = [(variant, {}) for variant in list_variants(extra=True)] + [
    ("relu-absolute", {"deterministic": True}), ("relu-rope", {"deterministic": True}),
    ("softmax-absolute", {"normalize_qk": True}), ("favor-string", {"normalize_qk": True}),
    ("favor-kerple", {"normalize_qk": False}),
]


@pytest.mark.parametrize("variant, settings", SETTINGS, ids=[f"{v}{''.join(f'-{k}' for k in s)}" for v, s in SETTINGS])
def test_an_option_is_called_ignored_exactly_where_setting_it_changes_nothing(variant, settings):
    # The brute-force check of `ignored_options`: build the layer with each option moved off its default and
    # see whether its output or its weights moved.
    kernel, position = parse_variant(variant)
    output, weights = attention_behaviour(kernel, position, **settings)
    ignored = ignored_options(kernel, position, **settings)
    for option in (option for option in SELECTIVE_OPTIONS if option not in settings):
        if option == "rotation_order":  # the other order; softmax has only "before"
            default = KERNEL_TABLE[kernel].rotation_order
            value = "before" if default == "after" or not KERNEL_TABLE[kernel].linear else "after"
        else:
            value = OTHER_VALUES[option]
        changed_output, changed_weights = attention_behaviour(kernel, position, **{**settings, option: value})
        changes = changed_weights != weights or not np.allclose(changed_output, output, rtol=0, atol=1e-6)
        assert changes == (option not in ignored), (option, value)


def test_every_selective_option_is_read_by_some_variant_and_says_by_which():
    read_somewhere = set()
    for variant in list_variants(extra=True):
        read_somewhere |= set(SELECTIVE_OPTIONS) - set(ignored_options(*parse_variant(variant)))
    assert read_somewhere == set(SELECTIVE_OPTIONS)
    ignored = ignored_options("softmax", "absolute")
    assert ignored["num_features"] == "favor, relu without deterministic" and ignored["deterministic"] == "relu"
    assert ignored["rope_mixed"] == "rope" and ignored["linformer_dim"] == "linformer" and ignored["stabilizer"] == "favor"
    assert "qk_norm" not in ignored_options("softmax", "absolute", normalize_qk=True)
    assert "qk_norm" in ignored_options("softmax", "kerple", normalize_qk=False)
