"""Feature maps: the layer contract, FAVOR+ statistics, stabilisers, large logits, redraws."""

import numpy as np
import pytest
import keras

from performer_keras import ExpFeatures, FavorFeatures, KernelAttention, ReluFeatures, create_model
from performer_keras.random_features import draw_projection

from layer_test_case import run_layer_test, to_numpy

D = 16  # head dimension of the statistical tests




# === The shared layer contract. ===

QK = np.random.default_rng(0).normal(size=(2, 2, 10, 8)).astype("float32")  # (batch, heads, N, d)


@pytest.mark.parametrize(
    "layer_cls, kwargs, m, num_non_trainable",
    [
        pytest.param(FavorFeatures, dict(num_features=16, seed=1), 16, 1, id="favor"),  # projection
        pytest.param(FavorFeatures, dict(num_features=12, redraw_interval=2, orthogonal=False), 12, 2, id="favor-redraw"),
        pytest.param(FavorFeatures, dict(num_features=16, stabilizer="logits"), 16, 1, id="favor-logits"),
        pytest.param(ReluFeatures, dict(num_features=16, seed=1), 16, 1, id="relu"),
        pytest.param(ReluFeatures, dict(deterministic=True), 8, 0, id="relu-deterministic"),  # m = d
        pytest.param(ExpFeatures, dict(epsilon=1e-5), 8, 0, id="exp"),
    ],
)
def test_layer_contract(layer_cls, kwargs, m, num_non_trainable, tmp_path):
    run_layer_test(
        layer_cls,
        kwargs,
        (QK, QK[:, :, ::-1]),
        expected_output_shape=((2, 2, 10, m), (2, 2, 10, m)),
        expected_num_trainable_weights=0,
        expected_num_non_trainable_weights=num_non_trainable,
        tmp_path=tmp_path,
        # Documented: features are float32 whatever the policy.
        expected_output_dtype="float32",
    )


# === The random projection. ===


@pytest.mark.parametrize("layer_cls", [FavorFeatures, ReluFeatures])
def test_a_numpy_seed_draws_as_the_same_python_seed_and_a_seed_one_backend_cannot_take_is_refused(layer_cls):
    # Keras refused np.int64(3) ("must be an integer. Received: seed=3") and took -1 on TensorFlow only.
    inputs = (QK, QK)
    numpy_seeded, python_seeded = layer_cls(num_features=8, seed=np.int64(3)), layer_cls(num_features=8, seed=3)
    np.testing.assert_array_equal(to_numpy(numpy_seeded(*inputs)[0]), to_numpy(python_seeded(*inputs)[0]))
    assert type(numpy_seeded.get_config()["seed"]) is int
    with pytest.raises(ValueError, match=r"seed must be None or an integer from 0 to 4294967295, got -1"):
        layer_cls(seed=-1)


@pytest.mark.parametrize("layer_cls", [ExpFeatures, FavorFeatures, ReluFeatures])
@pytest.mark.parametrize("epsilon", [-1e-3, float("nan")])
def test_a_negative_or_non_finite_epsilon_is_refused(layer_cls, epsilon):
    # epsilon keeps every feature, hence the normaliser, positive; a negative one can divide by 0.
    with pytest.raises(ValueError, match="epsilon must be"):
        layer_cls(epsilon=epsilon)


def test_orthogonal_rows_are_standard_gaussian():
    # Every row must be N(0, I_d) for the estimator to be unbiased: uniform
    # direction and an independent chi(d) norm. Drawn with integer seeds, as a
    # user would; the first and last rows are where norm and direction
    # would be tied if both came from the same Gaussian sample.
    d, draws = 4, 1000
    rows = np.stack([to_numpy(draw_projection(d, d, True, seed)) for seed in range(draws)])  # (draws, d, d)
    second_moments = np.einsum("sri,srj->rij", rows, rows) / draws  # (row, d, d)
    # Standard errors: 0.045 on the diagonal, 0.032 off it; 0.2 is > 4 of them.
    np.testing.assert_allclose(second_moments, np.broadcast_to(np.eye(d), (d, d, d)), atol=0.2)
    # Rows within one block are exactly orthogonal.
    gram = np.einsum("sri,sti->srt", rows, rows)
    off_diagonal = gram * (1 - np.eye(d))
    assert np.max(np.abs(off_diagonal)) < 1e-4


# === FAVOR+ statistics. ===


def pairs(num_pairs=8, half_norm=0.7, seed=0):
    """Queries and keys with |q'| = |k'| = half_norm (x' = x d^-1/4) at angles from 25 to 120 degrees.

    exp(q^T k / sqrt(d)) then spans about 0.8 to 1.6, and |q' + k'|^2 <= 2,
    so the estimator's relative variance exp(|q' + k'|^2) - 1 per feature is
    moderate and a few thousand draws pin its mean down to about 1%.
    """
    rng = np.random.default_rng(seed)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
    u = unit(rng.normal(size=(num_pairs, D)))
    w = unit(rng.normal(size=(num_pairs, D)))
    w = unit(w - np.sum(w * u, axis=-1, keepdims=True) * u)  # orthogonal to u
    cos = np.linspace(0.9, -0.5, num_pairs)[:, None]
    scale = half_norm * D**0.25  # |q| such that |q'| = half_norm
    q = scale * u
    k = scale * (cos * u + np.sqrt(1 - cos**2) * w)
    return q, k


def favor_estimates(q, k, num_features, orthogonal, draws, seed):
    """(pairs, draws): phi(q)^T phi(k) exp(M_q + M_k) for `draws` independent projections.

    The orthogonal projection is a stack of independent d x d blocks, so one
    `draw_projection` of draws * m rows (m a multiple of d) is `draws`
    independent m-row projections back to back. Fed to the layer's
    feature_map in one call, every query's (and key's, with one key per
    batch entry) stabiliser M becomes its max over all draws' logits: still
    one constant per query, which the test multiplies back. epsilon=0 makes
    exp(M_q + M_k) phi(q)^T phi(k) exactly the unstabilised estimator
    m^-1 sum_l exp(w_l^T q' - |q'|^2/2) exp(w_l^T k' - |k'|^2/2).
    """
    projection = draw_projection(draws * num_features, D, orthogonal, seed)
    layer = FavorFeatures(num_features, epsilon=0.0, stabilizer="logits")  # the M multiplied back below
    queries, keys = q[:, None].astype("float32"), k[:, None].astype("float32")  # (pairs, N=1, d)
    layer.build(queries.shape, keys.shape)
    phi_q, phi_k = (to_numpy(phi)[:, 0] for phi in layer.feature_map(queries, keys, projection))
    logits = lambda x: (x * D**-0.25) @ to_numpy(projection).T  # (pairs, draws * m)
    stabiliser = logits(q).max(axis=-1) + logits(k).max(axis=-1)
    products = (phi_q * phi_k).reshape(len(q), draws, num_features)
    return products.sum(axis=-1) * np.exp(stabiliser)[:, None]


def softmax_kernel(q, k):
    return np.exp(np.sum(q * k, axis=-1) / np.sqrt(D))


@pytest.mark.parametrize("orthogonal", [True, False])
def test_favor_is_unbiased(orthogonal):
    q, k = pairs()
    relative = favor_estimates(q, k, 16, orthogonal, draws=4000, seed=11) / softmax_kernel(q, k)[:, None] - 1
    # Per-draw relative std is about 0.4, so the mean of 4000 is good to about 0.006.
    np.testing.assert_allclose(relative.mean(axis=1), 0.0, atol=0.05)


def test_favor_error_falls_like_inverse_sqrt_num_features():
    q, k = pairs()
    exact = softmax_kernel(q, k)[:, None]

    def rms_relative_error(m, seed):
        return np.sqrt(np.mean((favor_estimates(q, k, m, True, draws=300, seed=seed) / exact - 1) ** 2))

    # 1/sqrt(m) predicts a ratio of sqrt(16/256) = 0.25 (orthogonality helps a bit more).
    ratio = rms_relative_error(256, seed=21) / rms_relative_error(16, seed=22)
    assert ratio < 0.5, f"error ratio m=256 / m=16 is {ratio:.3f}"


@pytest.mark.parametrize("num_features", [D, 2 * D])
def test_orthogonal_features_have_lower_error(num_features):
    q, k = pairs()
    exact = softmax_kernel(q, k)[:, None]
    mse = {
        orthogonal: np.mean((favor_estimates(q, k, num_features, orthogonal, 4000, seed=31) - exact) ** 2)
        for orthogonal in (True, False)
    }
    # Measured ratio about 0.75 with these pairs; 0.9 leaves room for sampling noise.
    assert mse[True] < 0.9 * mse[False], mse


# === Stabilisers cancel in attention. ===


def attention_weights(phi_q, phi_k):
    """A_ij = phi(q_i)^T phi(k_j) / sum_j phi(q_i)^T phi(k_j)."""
    scores = phi_q @ np.swapaxes(phi_k, -1, -2)
    return scores / scores.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("kind", ["favor", "exp"])
def test_stabilisers_cancel_in_attention(kind):
    # Keys of very different norms have very different maxima, so a per-key
    # stabiliser (instead of one per (batch, head)) would reweight the keys.
    rng = np.random.default_rng(5)
    q = rng.normal(size=(2, 2, 10, 8)) * 0.8
    k = rng.normal(size=(2, 2, 10, 8)) * np.linspace(0.2, 1.5, 10)[:, None]
    x_scale = 8**-0.25
    if kind == "favor":
        m = 32
        layer = FavorFeatures(num_features=m, epsilon=0.0, seed=4, stabilizer="logits")
        phi_q, phi_k = (to_numpy(phi) for phi in layer(q.astype("float32"), k.astype("float32")))
        projection = to_numpy(layer.projection)
        half_norm = lambda x: 0.5 * np.sum((x * x_scale) ** 2, axis=-1, keepdims=True)
        unstabilised = lambda x: np.exp((x * x_scale) @ projection.T - half_norm(x)) / np.sqrt(m)
        # exp(W x' - M): the features with the |x'|^2/2 and m^-1/2 factors taken out.
        exp_logits_minus_m = lambda phi, x: phi * np.sqrt(m) * np.exp(half_norm(x))
    else:
        layer = ExpFeatures(epsilon=0.0)
        phi_q, phi_k = (to_numpy(phi) for phi in layer(q.astype("float32"), k.astype("float32")))
        unstabilised = lambda x: np.exp(x * x_scale)
        exp_logits_minus_m = lambda phi, x: phi

    expected = attention_weights(unstabilised(q), unstabilised(k))
    np.testing.assert_allclose(attention_weights(phi_q, phi_k), expected, rtol=1e-5, atol=1e-7)

    # The stabilisers are really there, and have the documented scope:
    # every query's own largest feature is exp(0) ...
    query_max = exp_logits_minus_m(phi_q, q).max(axis=-1)  # (batch, heads, N)
    np.testing.assert_allclose(query_max, 1.0, rtol=1e-5)
    # ... but only one key per (batch, head) reaches exp(0): M is shared by all keys.
    key_max = exp_logits_minus_m(phi_k, k).max(axis=-1)  # (batch, heads, N)
    np.testing.assert_allclose(key_max.max(axis=-1), 1.0, rtol=1e-5)
    assert np.all(np.sort(key_max, axis=-1)[..., -2] < 0.99), "keys seem to have their own stabilisers"


def test_the_exponent_stabilizer_keeps_long_keys_above_the_floor():
    # One long key per (batch, head): the logits' maximum then exceeds the exponent's by about its |k'|^2/2,
    # and "logits" pushes the other keys' features under epsilon, where phi(k) = eps m^-1/2 whatever k is.
    rng = np.random.default_rng(6)
    q, k = rng.normal(size=(2, 2, 10, 8)), rng.normal(size=(2, 2, 10, 8))
    k[..., 0, :] *= 6.0
    m, eps = 32, 1e-6
    features = {name: [to_numpy(phi) for phi in FavorFeatures(num_features=m, stabilizer=name, seed=4)(
        q.astype("float32"), k.astype("float32"))] for name in ("logits", "exponent")}
    # Queries: the same features up to each query's own factor exp(|q'|^2/2), epsilon aside.
    exp_parts = {name: phi_q * np.sqrt(m) - eps for name, (phi_q, _) in features.items()}
    np.testing.assert_allclose(exp_parts["exponent"], exp_parts["logits"] * np.exp(0.5 * np.sum(q**2, -1, keepdims=True) / np.sqrt(8)),
                               rtol=1e-4, atol=1e-5)
    floored = {name: np.mean(phi_k[..., 1:, :] < 2 * eps / np.sqrt(m)) for name, (_, phi_k) in features.items()}
    assert floored["logits"] > 0.9 and floored["exponent"] < 0.2, floored
    # "exponent": each query's largest feature, and that of one key per (batch, head), at exp(0), none above.
    np.testing.assert_allclose(exp_parts["exponent"].max(axis=-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose((features["exponent"][1] * np.sqrt(m) - eps).max(axis=(-2, -1)), 1.0, rtol=1e-6)
    # Brute force, float64: FAVOR+'s attention without the floor (epsilon 0, nothing stabilised). "exponent"
    # computes it; under "logits" the floor takes over and the weights become another attention.
    layer = FavorFeatures(num_features=m, seed=4)
    layer(q.astype("float32"), k.astype("float32"))
    projection, scale = to_numpy(layer.projection).astype("float64"), 8**-0.25
    exact = attention_weights(*(np.exp((x * scale) @ projection.T - 0.5 * np.sum((x * scale) ** 2, -1, keepdims=True))
                                for x in (q, k)))
    assert np.abs(attention_weights(*features["exponent"]) - exact).max() < 1e-3
    assert np.abs(attention_weights(*features["logits"]) - exact).max() > 0.1


def test_the_default_stabilizer_is_the_exponent_and_a_config_saved_without_one_keeps_the_performer_s():
    assert FavorFeatures().stabilizer == KernelAttention(2, "favor").stabilizer == "exponent"
    assert create_model("favor-absolute", size="tiny").get_layer("block_0_attention").stabilizer == "exponent"
    q, k = (np.random.default_rng(7).normal(size=(1, 2, 10, 8)).astype("float32") for _ in range(2))
    saved = FavorFeatures(num_features=16, seed=3, stabilizer="logits")
    config = saved.get_config()
    del config["stabilizer"]
    loaded = FavorFeatures.from_config(config)
    assert loaded.stabilizer == "logits"
    # The keys' features tell the two apart: their M differs by about the longest key's |k'|^2/2.
    expected = saved(q, k)
    loaded(q, k)
    loaded.set_weights(saved.get_weights())
    for got, want in zip(loaded(q, k), expected):
        np.testing.assert_allclose(to_numpy(got), to_numpy(want), rtol=1e-6)


def test_an_unknown_stabilizer_is_refused():
    with pytest.raises(ValueError, match=r"Unknown stabilizer 'max'; expected one of \('logits', 'exponent'\)"):
        FavorFeatures(stabilizer="max")
    with pytest.raises(ValueError, match="Unknown stabilizer"):
        KernelAttention(2, "favor", stabilizer="max")


# === Logits of magnitude 50. ===

GRID, TOKENS, WIDTH, HEADS = (7, 7), 50, 16, 2
POSITIONS = ("absolute", "rope", "string", "kerple")


def max_scaled_logit(layer, x):
    """max |q_i^T k_j| / sqrt(d) over batch, heads and token pairs, from the layer's Dense weights."""
    def heads(dense):
        y = x @ to_numpy(dense.kernel) + to_numpy(dense.bias)
        return y.reshape(x.shape[0], x.shape[1], HEADS, -1).transpose(0, 2, 1, 3)

    q, k = heads(layer.query), heads(layer.key)
    return np.max(np.abs(q @ np.swapaxes(k, -1, -2))) / np.sqrt(q.shape[-1])


@pytest.mark.parametrize("kernel", ["softmax", "favor", "relu", "exp", "linformer"])
def test_logits_of_magnitude_50_train_finitely(kernel):
    x = np.random.default_rng(0).normal(size=(2, TOKENS, WIDTH)).astype("float32")
    inputs = keras.Input((TOKENS, WIDTH))
    layers, pooled = [], []
    for position in POSITIONS:
        if kernel == "linformer" and position == "kerple":
            continue  # not a valid combination
        layer = KernelAttention(HEADS, kernel, position, grid_size=GRID, num_features=16, seed=0)
        layers.append(layer)
        pooled.append(keras.layers.GlobalAveragePooling1D()(layer(inputs)))
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Concatenate()(pooled)))
    for layer in layers:
        # Scale W_q and W_k (biases are 0) so that max |q^T k| / sqrt(d) = 50.
        factor = np.sqrt(50.0 / max_scaled_logit(layer, x))
        for dense in (layer.query, layer.key):
            dense.kernel.assign(dense.kernel * factor)
        assert max_scaled_logit(layer, x) > 49.0  # the set-up reaches the regime it claims to test

    outputs = to_numpy(model(x))
    assert np.all(np.isfinite(outputs))
    model.compile(optimizer=keras.optimizers.SGD(1e-3), loss="mse")
    loss = model.train_on_batch(x, np.ones((2, 2), "float32"))
    assert np.isfinite(loss), loss
    # A non-finite gradient would have made its weight non-finite.
    for layer in layers:
        bad = [w.path for w in layer.weights if not np.all(np.isfinite(to_numpy(w)))]
        assert not bad, f"non-finite after one step: {bad}"


# === Redraws. ===


@pytest.mark.parametrize("kernel", ["favor", "relu"])
def test_redraw_every_two_training_steps_never_at_inference(kernel):
    x = np.random.default_rng(0).normal(size=(2, TOKENS, WIDTH)).astype("float32")
    y = np.zeros((2, 2), "float32")
    inputs = keras.Input((TOKENS, WIDTH))
    redrawn = KernelAttention(HEADS, kernel, num_features=16, redraw_interval=2, seed=0, name="redrawn")
    fixed = KernelAttention(HEADS, kernel, num_features=16, redraw_interval=0, seed=0, name="fixed")
    pooled = [keras.layers.GlobalAveragePooling1D()(layer(inputs)) for layer in (redrawn, fixed)]
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Concatenate()(pooled)))
    model.compile(optimizer="sgd", loss="mse")

    def projections():
        return to_numpy(redrawn.features.projection), to_numpy(fixed.features.projection)

    start, start_fixed = projections()
    history = []
    for _ in range(4):
        model.train_on_batch(x, y)
        history.append(projections())
    (after_1, _), (after_2, _), (after_3, _), (after_4, _) = history
    np.testing.assert_array_equal(after_1, start)  # step 1: not due yet
    assert not np.allclose(after_2, start)  # step 2: redrawn
    np.testing.assert_array_equal(after_3, after_2)
    assert not np.allclose(after_4, after_2)  # step 4: redrawn again
    for _, fixed_projection in history:
        np.testing.assert_array_equal(fixed_projection, start_fixed)  # interval 0: never

    # Inference never redraws, however often it runs.
    for _ in range(3):
        model.predict(x, verbose=0)
        model(x, training=False)
    after_inference, fixed_after_inference = projections()
    np.testing.assert_array_equal(after_inference, after_4)
    np.testing.assert_array_equal(fixed_after_inference, start_fixed)
