"""Multi-head attention with a pluggable kernel and position encoding."""

import math
import warnings

import keras
from keras import ops

from performer_keras.batch_broadcast import over_batch
from performer_keras.grid import grid_positions
from performer_keras.options import (DEFAULT_STABILIZER, ROTATION_ORDERS, STABILIZER_BEFORE_OPTION, STABILIZERS,
                                     check_axis, check_bool, check_choice, check_finite, check_float_dtype, check_grid_size,
                                     check_grid_tokens, check_non_negative, check_positive, check_rank, check_seed)
from performer_keras.registry import (DEFAULT_QK_NORM, KERNEL_TABLE, KERNELS, POSITION_TABLE, POSITIONS, QK_NORM_BEFORE_OPTION,
                                      compatible, feature_map, normalizes_qk, positions_of, resolve)
from performer_keras.toeplitz_bias_2d import padded_fft_shape


def split_heads(x, num_heads):
    """(batch, tokens, width) -> (batch, heads, tokens, head_dim)."""
    batch, tokens, width = ops.shape(x)
    x = ops.reshape(x, (-1, tokens, num_heads, width // num_heads))
    return ops.transpose(x, (0, 2, 1, 3))


def merge_heads(x):
    """(batch, heads, tokens, head_dim) -> (batch, tokens, width)."""
    batch, heads, tokens, head_dim = ops.shape(x)
    return ops.reshape(ops.transpose(x, (0, 2, 1, 3)), (-1, tokens, heads * head_dim))


TOEPLITZ_PATHS = ("auto", "dense", "fft", "dft")
# "auto" takes the path that a cost model predicts faster for the layer's N, m and d
# (`toeplitz_costs`, `auto_toeplitz_path`): the smallest of the dense path's count and the FFT
# and DFT paths' counts, each times its backend's factor (FFT_COST_FACTORS,
# DFT_COST_FACTORS). No token count alone can choose: the
# FFT path correlates m (d + 1) channels, the dense path multiplies by m + d, so at m = 16,
# d = 16 the FFT path trained faster from a few thousand tokens on a 2-core CPU and at
# m = 64, d = 32 not up to 16,385. Besides its matmuls the dense path passes over its N^2
# weights several times, forward and backward (the position weights, the row sums, their
# gradients): memory-bound work that DENSE_ELEMENTWISE_COST counts as that many
# multiply-adds per weight. Without it (or with 16) no one factor fits JAX's two shapes (the
# elementwise passes weigh more at m + d = 32 than at 96); from about 24 on one does, and 64
# leaves the first profiles' FFT points (profiles/results/cpu-epyc-2core) an interval whose
# ends are 1.33 (JAX) and 1.87 (TensorFlow) times apart. The DFT path too does more than its
# matmuls: per patch and channel it writes the products phi(k) (x) [v, 1], transposes the
# spectra to the row operators and back, and contracts with phi(q), again in the backward
# pass: DFT_ELEMENTWISE_COST multiply-adds per patch and channel, beside the 4 (H + W) of its
# matmuls, so it weighs less on larger grids. Without it no DFT factor fits TensorFlow's
# points timed without XLA: the DFT path lost to the dense path on a 32 x 32 grid at m = 16,
# d = 16 and beat it on 64 x 128 and 128 x 128 grids at m = 64, d = 32 (the family-23 EPYC,
# where the model of the time, factor included, counted it 2.1 and 1.4 times dearer). With
# the dense term at 64 and paths within 5% of each other's time tied
# (`profiles.kerple_paths.TIE`), those points ask for more than 50, JAX's allow less than 850
# and TensorFlow's timed with XLA less than 500: a third EPYC's DFT path beat the dense path at
# m = 16 on a 32 x 32 grid by 10%, where every machine's lost to it at m = 64 on 64 x 128, and
# a heavier term weighs the small grid's DFT count too much (600, chosen before that machine,
# fits no factor). Of the terms in steps of 50, 200 gives the worst of the three sets the widest
# margin, 1.10 (tests/test_committed_results.py checks both). Each factor
# (the FFT path's multiply-adds run that many times slower than the dense path's:
# memory-bound transforms against compute-bound products) is fitted to every committed
# profiles/results/**/<backend>/kerple_paths.json timed with XLA, as train.py trains on both
# backends, all machines': `profiles.kerple_paths.joint_factors`, the factors that make
# "auto" take the fastest path it timed at every point, by the widest margin (`python -m
# profiles.kerple_paths --fit-only`; a test checks these against it). XLA moves the paths
# apart unevenly, so TensorFlow's files timed without it fit nothing. No point timed with XLA
# bounds TensorFlow's FFT factor from above (the DFT path beat the FFT path at every one):
# its value is the middle of what the points and `FACTOR_RANGE` leave, and keeps the FFT
# path off square grids up to 1,000 x 1,000. A backend without files takes TensorFlow's.
DENSE_ELEMENTWISE_COST = 64
DFT_ELEMENTWISE_COST = 200
FFT_COST_FACTORS = {"tensorflow": 389.7, "jax": 23.5}
DFT_COST_FACTORS = {"tensorflow": 0.71, "jax": 1.12}
# Up to this many float32 weights per example (heads x N^2; 512 MiB) the dense path forms
# them in one piece (4,097 tokens with 4 heads, the `cpu` profile's, as `kerple_paths` has
# measured the path since 2026-11-25). Above, it forms them in blocks of grid rows of at most
# DENSE_BLOCK_ELEMENTS each (one grid row at least), recomputed in the backward pass
# (`keras.remat`): memory O(block x N) instead of O(N^2), for one more forward pass of the
# products. The blocks are the iterations of one loop (`ops.map`), not separate calls from a
# Python loop, which XLA on JAX scheduled together: it asked 35 GB at 16,385 tokens
# (reference shape; profiles/results/cpu-epyc-2core/jax/kerple_paths.json at commit 511aec2),
# and TensorFlow reached 22 GB there with blocks of 2**27.
DENSE_ONE_PIECE_ELEMENTS = 2**27
DENSE_BLOCK_ELEMENTS = 2**25
# The FFT path correlates m (d + 1) channels per head over a padded grid of about 4N
# points, several such tensors at once forward and more kept for the backward pass
# (16,385 tokens at m = 64, d = 32: 1.1 GB each per example). Above this many float32
# elements per example (128 MiB) it correlates the features in chunks, each recomputed in
# the backward pass (`keras.remat`), so training holds a few chunks' spectra at a time.
# The chunks are the iterations of one loop that adds up their outputs (`sum_in_a_loop`),
# as the dense path's blocks are: as separate calls from a Python loop XLA on JAX planned
# them together (37.4 MB for a training step in 16 chunks against 47.5 MB in one piece,
# 32 x 32 grid, m = 16; `test_the_looped_paths_hold_one_chunk_at_a_time_under_xla_on_jax`).
# Small chunks, because TensorFlow may run independent chunks at once: with 2**27 (three
# chunks at 16,385 tokens) that training step still reached the 8 GiB limit in a sweep run
# before 2**25 was committed (2026-11-25); no committed file keeps that reading.
FFT_CHUNK_ELEMENTS = 2**25
# The DFT path's spectra are half the FFT path's (2HW points a channel against about 4HW), and
# its chunks cost it more than their one extra forward pass: on TensorFlow it trained 17-33%
# faster in one piece at the three committed kerple_paths points this threshold moved (35M-78M
# elements per example; profiles/README.md, "The DFT path"). So, as the dense path does, it runs
# in one piece up to this many elements per example (512 MiB) and in chunks of
# FFT_CHUNK_ELEMENTS only above.
DFT_ONE_PIECE_ELEMENTS = 2**27


def loop_chunks(count, elements_per_item, budget):
    """(size, whole, rest): `count` items in `whole` chunks of `size` items, the largest within `budget` elements
    (one item at least), then a last chunk of the `rest` (0 when `size` divides `count`)."""
    size = min(count, max(1, budget // elements_per_item))
    return (size, *divmod(count, size))


def sum_in_a_loop(count, term, total):
    """`total` plus term(i) for i in range(count), one term after another in one loop that training can differentiate.

    Each backend differentiates a different loop: JAX reverse-differentiates
    `fori_loop` with static bounds (a scan) but not `while_loop`, and TensorFlow
    under XLA (train.py's default) differentiates `while_loop` only with
    `maximum_iterations`, which its `fori_loop` and `scan` do not set.
    """
    if keras.backend.backend() == "tensorflow":
        return ops.while_loop(lambda i, total: i < count, lambda i, total: (i + 1, total + term(i)), (0, total),
                              maximum_iterations=count)[1]
    return ops.fori_loop(0, count, lambda i, total: total + term(i), total)


def toeplitz_costs(tokens, grid_size, num_features, head_dim):
    """{path: multiply-adds per head and example} of kernelized kerple's three exact paths on an (H, W) grid.

    Dense: the N x N products phi(Q) phi(K)^T (m each) and W V (d each),
    plus `DENSE_ELEMENTWISE_COST` per weight for its elementwise passes.
    FFT: m (d + 1) channels, each through a 2D transform and its inverse on
    the P x Q padded grid (`padded_fft_shape`), counted as P Q log2(P Q).
    DFT: the same channels through matmuls, 4 H W (H + W) each: the (2W, W)
    DFT of each of the H rows and its inverse, 2 W^2 H each, and a (2H, 2H)
    row operator for each of the W frequencies, 4 W H^2; plus
    `DFT_ELEMENTWISE_COST` per patch and channel for its other passes.
    """
    height, width = grid_size
    rows, cols = padded_fft_shape(grid_size)
    channels = num_features * (head_dim + 1)
    return {
        "dense": tokens**2 * (num_features + head_dim + DENSE_ELEMENTWISE_COST),
        "fft": channels * rows * cols * math.log2(rows * cols),
        "dft": channels * height * width * (4 * (height + width) + DFT_ELEMENTWISE_COST),
    }


def fft_cost_factor(backend=None):
    """`FFT_COST_FACTORS` of `backend` (default: Keras'), TensorFlow's for a backend without its own."""
    return FFT_COST_FACTORS.get(backend or keras.backend.backend(), FFT_COST_FACTORS["tensorflow"])


def dft_cost_factor(backend=None):
    """`DFT_COST_FACTORS` of `backend` (default: Keras'), TensorFlow's for a backend without its own."""
    return DFT_COST_FACTORS.get(backend or keras.backend.backend(), DFT_COST_FACTORS["tensorflow"])


def auto_toeplitz_path(costs, backend=None):
    """The path of `costs` (`toeplitz_costs`, or some of its paths) whose count times the backend's factor is the smallest (the first on a tie)."""
    factors = {"dense": 1.0, "fft": fft_cost_factor(backend), "dft": dft_cost_factor(backend)}
    return min(costs, key=lambda path: factors[path] * costs[path])


def weighted_average(phi_q, keys, v, position_weights=None):
    """sum_j w_ij v_j / sum_j w_ij with w_ij = phi(q_i)^T phi(k_j), times `position_weights` (.., N_q, N) if given.

    `keys` is phi(K) transposed, (batch, heads, m, N). The normaliser is the
    weights' row sum: a product with [v, 1] instead has the odd width d + 1,
    which XLA's CPU matmuls run far slower.
    """
    weights = ops.matmul(phi_q, keys)  # (batch, heads, N_q, N)
    if position_weights is not None:
        weights = weights * position_weights
    return ops.matmul(weights, v) / ops.sum(weights, axis=-1, keepdims=True)  # (batch, heads, N_q, d)


def softmax_attend(q, keys, v, bias=None):
    """softmax(q keys / sqrt(d) + bias) v, the scale applied to q and the division to the (.., N_q, d) output.

    `keys` is k transposed, (.., d, N); `bias` float32, broadcast over the
    batch (`over_batch`). Scaling q and normalising the output rather than
    the N_q x N logits and weights is less work, and XLA on a CPU would fill
    tensors of that size with the scale and the row sums every step to apply
    them there. The shift by the row maximum keeps exp finite; softmax does
    not depend on it, so it gets no gradient.
    """
    logits = ops.cast(ops.matmul(q * ops.cast(q.shape[-1] ** -0.5, q.dtype), keys), "float32")  # (.., N_q, N)
    if bias is not None:
        logits = logits + over_batch(bias, logits.shape[0])
    weights = ops.exp(logits - ops.stop_gradient(ops.max(logits, axis=-1, keepdims=True)))
    outputs = ops.matmul(ops.cast(weights, v.dtype), v)
    return ops.cast(outputs, "float32") / ops.sum(weights, axis=-1, keepdims=True)


@keras.saving.register_keras_serializable(package="performer_keras")
class KernelAttention(keras.layers.Layer):
    """Multi-head self-attention: one layer, any kernel x position.

    Tokens are `num_prefix_tokens` prefix tokens (CLS) followed by an H x W
    grid of patches in row-major order. With q, k, v of shape
    (batch, heads, N, d):

    kernel_name (one row of `registry.KERNEL_TABLE`):
        softmax    A = softmax(q k^T / sqrt(d) + B) v                   O(N^2 d)
        favor      A = phi(q) (phi(k)^T v) / phi(q) (phi(k)^T 1)         O(N m d)
                   with FAVOR+ positive random features (`FavorFeatures`)
        relu       the same with phi = ReLU random features (`ReluFeatures`)
        exp        the same with deterministic exponential features (`ExpFeatures`)
        (any registered linear kernel: the same with its `FeatureMap`)
        linformer  softmax(q (E k)^T / sqrt(d)) (F v), learned E, F of shape
                   (linformer_dim, N) (Wang et al., arXiv:2006.04768)    O(N k d)
    Linear kernels never form an N x N matrix and compute in float32.

    position (one row of `registry.POSITION_TABLE`; the learned absolute
    embedding lives in the ViT, so `absolute` adds nothing here):
        rope    2D rotary embedding (`RotaryEmbedding2D`) of q and k, or of
                phi(q), phi(k) in the numerator only (`rotation_order`)
        string  Circulant-STRING rotations (`CirculantString`), same orders
        kerple  2D Toeplitz RPE (`ToeplitzBias2D`, Luo et al. 2021): additive
                logit bias B for softmax; weights exp(b[p_j - p_i]) phi(q_i)^T
                phi(k_j) in numerator and normaliser for linear kernels, by
                one of two exact algorithms (`toeplitz_path`): dense, the
                N x N weights exp(B) * (phi(Q) phi(K)^T) times V over their
                row sums, in O(N^2 (m + d)) time and O(N^2) memory (in
                blocks of grid rows above `DENSE_ONE_PIECE_ELEMENTS`:
                O(block N)), or FFT, a 2D cross-correlation of
                phi(k_j) (x) [v_j, 1] in O(N log N m d) time and O(N m d)
                memory. q and k are l2-normalised first by default
                (`normalize_qk`), the paper's source of stability.
    Prefix (CLS) tokens have no grid position: they are not rotated (as if
    at the origin) and take Toeplitz bias 0 with every token.

    Args:
        num_heads: number of heads; the input width must divide by it.
        kernel_name: one of `KERNELS` (the argument was `kernel` before 0.3,
            a name Keras reserves for weights; saved configs that use it load
            with a DeprecationWarning).
        position: one of `POSITIONS`.
        grid_size: (H, W) of the patch grid; required for rope, string,
            kerple.
        num_prefix_tokens: tokens before the grid (1 for CLS).
        num_features: m for favor and relu.
        orthogonal: orthogonal (default) or i.i.d. random features.
        redraw_interval: redraw random features every K training steps
            (0 = never).
        deterministic: relu only: phi(x) = ReLU(x), no projection.
        rotation_order: "before" rotates q, k before the feature map, "after"
            rotates the features; None takes the kernel's
            (`registry.Kernel.rotation_order`).
        rope_mixed: learned mixed RoPE frequencies (RoPE-Mixed).
        normalize_qk: l2-normalise q and k, with any position; None takes the
            position's (`registry.Position.normalize_qk`: True for kerple only).
        qk_norm: with normalize_qk, the norm of q and k in units of sqrt(d),
            so |q^T k| / sqrt(d) <= qk_norm^2 sqrt(d). `DEFAULT_QK_NORM`
            (0.25) keeps FAVOR+ an accurate estimate of softmax (its error
            falls as 1/sqrt(m)); Luo et al.'s 1.0 does not.
        learn_qk_norm: with normalize_qk, learn each head's norm (default),
            starting at qk_norm: norm = qk_norm exp(w_h) with a weight w_h = 0
            at first (weight decay pulls it back towards qk_norm). At a fixed
            0.25 the logits span only +-qk_norm^2 sqrt(d), too flat for
            softmax to attend by content (an 8-epoch CIFAR-10 pilot fell
            behind; README); learning lets each head sharpen where that pays,
            FAVOR+ at the price of its estimator's variance.
        linformer_dim: k, the projected sequence length for linformer.
        fused: softmax only: `ops.dot_product_attention` (flash attention
            where the backend has it) instead of the explicit matmuls.
        toeplitz_path: kerple with a linear kernel: "dense", "fft", "dft"
            (`ToeplitzBias2D`'s matmul form of the FFT path: O(N (H + W))
            per channel), or "auto" (default): the one `toeplitz_costs` and
            the backend's measured factors predict faster for this grid, m
            and d (`auto_toeplitz_path`; where it switches: README, "KERPLE's
            three paths"). `toeplitz_path_used` says which one the layer runs.
            Above `FFT_CHUNK_ELEMENTS` per example the FFT path takes the
            features in chunks, one after another in one loop, recomputed in
            the backward pass: less training memory for one more forward
            pass of the correlation; the DFT path does so above
            `DFT_ONE_PIECE_ELEMENTS`, in chunks of `FFT_CHUNK_ELEMENTS`.
        seed: seed of the random features.
        stabilizer: favor only: what FAVOR+'s stabiliser is the maximum of,
            "exponent" (the default), which keeps the largest features at 1
            and long keys from pushing the others under FAVOR+'s epsilon
            floor, or "logits" (Choromanski et al.'s, with which every
            `reference` FAVOR+ run without q/k normalisation collapsed on
            MNIST; `favor_features.positive_exp`).

    Call arguments:
        inputs: (batch, N, width).
        training: enables feature redraws.
        positions: optional (H*W, 2) patch coordinates of the rotations
            (rope, string; default: the grid). Any other position rejects it
            (ValueError): kerple's bias is defined on the grid's offsets.

    Returns: (batch, N, width).
    """

    def __init__(
        self,
        num_heads,
        kernel_name="softmax",
        position="absolute",
        grid_size=None,
        num_prefix_tokens=1,
        num_features=64,
        orthogonal=True,
        redraw_interval=0,
        deterministic=False,
        rotation_order=None,
        rope_mixed=False,
        normalize_qk=None,
        qk_norm=DEFAULT_QK_NORM,
        learn_qk_norm=True,
        linformer_dim=32,
        fused=False,
        seed=None,
        toeplitz_path="auto",
        stabilizer=DEFAULT_STABILIZER,
        **kwargs,
    ):
        if "kernel" in kwargs:
            warnings.warn("KernelAttention(kernel=...) is now kernel_name=...", DeprecationWarning, stacklevel=2)
            kernel_name = kwargs.pop("kernel")
        super().__init__(**kwargs)
        check_float_dtype(self)
        self.num_heads = check_positive("num_heads", num_heads)
        self.kernel_name = check_choice("kernel", kernel_name, KERNELS)
        self.position = check_choice("position", position, POSITIONS)
        self.grid_size = None if grid_size is None else check_grid_size("grid_size", grid_size)
        self.num_prefix_tokens = check_non_negative("num_prefix_tokens", num_prefix_tokens)
        self.num_features = check_positive("num_features", num_features)
        self.orthogonal = check_bool("orthogonal", orthogonal)
        self.redraw_interval = check_non_negative("redraw_interval", redraw_interval)
        self.deterministic = check_bool("deterministic", deterministic)
        self.rotation_order = rotation_order
        self.rope_mixed = check_bool("rope_mixed", rope_mixed)
        self.normalize_qk = check_bool("normalize_qk", normalize_qk, allow_none=True)
        self.qk_norm = check_finite("qk_norm", qk_norm, low=0.0, low_open=True)
        self.learn_qk_norm = check_bool("learn_qk_norm", learn_qk_norm)
        self.linformer_dim = check_positive("linformer_dim", linformer_dim)
        self.fused = check_bool("fused", fused)
        self.seed = check_seed("seed", seed, allow_none=True)
        self.toeplitz_path = check_choice("toeplitz_path", toeplitz_path, TOEPLITZ_PATHS)
        self.stabilizer = check_choice("stabilizer", stabilizer, STABILIZERS)
        self._validate()

    def _validate(self):
        if self.rotation_order is not None:
            check_choice("rotation_order", self.rotation_order, ROTATION_ORDERS)
            if self.rotation_order == "after" and not self.spec.linear:
                raise ValueError(
                    f"rotation_order='after' rotates random features, which kernel "
                    f"{self.kernel_name!r} does not have; expected one of {(None, 'before')}"
                )
        if self.fused and self.kernel_name != "softmax":
            raise ValueError(f"fused=True runs softmax through ops.dot_product_attention; kernel {self.kernel_name!r} "
                             f"has no fused form")
        if self.position_spec.kind != "embedding" and self.grid_size is None:
            raise ValueError(f"position {self.position!r} needs grid_size=(rows, cols) of the patch grid")
        if not compatible(self.kernel_name, self.position):
            raise ValueError(
                f"kernel {self.kernel_name!r} mixes tokens along the sequence, so token pairs and their offsets "
                f"no longer exist; expected position one of {tuple(p for p in POSITIONS if compatible(self.kernel_name, p))}"
            )

    @property
    def spec(self):
        """The kernel's row of `registry.KERNEL_TABLE`."""
        return KERNEL_TABLE[self.kernel_name]

    @property
    def position_spec(self):
        """The position's row of `registry.POSITION_TABLE`."""
        return POSITION_TABLE[self.position]

    @property
    def rotates(self):
        return self.position_spec.kind == "rotation"

    @property
    def order(self):
        return self.rotation_order or self.spec.rotation_order

    @property
    def toeplitz_path_used(self):
        """"dense", "fft" or "dft" for kerple with a linear kernel (after build), else None."""
        if not (self.spec.linear and self.position_spec.kind == "bias" and self.built):
            return None
        if self.toeplitz_path != "auto":
            return self.toeplitz_path
        tokens = self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]
        return auto_toeplitz_path(toeplitz_costs(tokens, self.grid_size, self.features.feature_dim, self.head_dim))

    @property
    def normalizes(self):
        return normalizes_qk(self.position, self.normalize_qk)

    def build(self, inputs_shape):
        check_rank("KernelAttention", inputs_shape, "(batch, tokens, width)", known=("width",))
        width, tokens = int(inputs_shape[-1]), inputs_shape[-2]
        if width % self.num_heads:
            raise ValueError(f"width {width} must be divisible by num_heads={self.num_heads}")
        self.head_dim = width // self.num_heads
        if self.grid_size is not None:
            check_grid_tokens("KernelAttention", inputs_shape, -2, self.grid_size, self.num_prefix_tokens)
        for name in ("query", "key", "value", "output_dense"):
            dense = keras.layers.Dense(width, name=name, dtype=self.dtype_policy)
            dense.build(inputs_shape)
            setattr(self, name, dense)
        heads_shape = (None, self.num_heads, tokens, self.head_dim)
        rotated_dim = self.head_dim
        if self.spec.linear:
            self.features = self._make_features()
            self.features.build(heads_shape, heads_shape)
            if self.order == "after":
                rotated_dim = self.features.feature_dim
        if self.kernel_name == "linformer" and tokens is None:
            raise ValueError("kernel 'linformer' needs a fixed number of tokens")
        # Keras then names a later input whose tokens differ from the grid's or linformer's projections, which
        # otherwise failed in a backend's matmul or in the rotation's positions check, naming neither.
        axes = {-1: width}
        if self.grid_size is not None:
            axes[-2] = self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]
        elif self.kernel_name == "linformer":
            axes[-2] = int(tokens)
        self.input_spec = keras.InputSpec(ndim=3, axes=axes)
        if self.kernel_name == "linformer":
            for name in ("key_projection", "value_projection"):
                setattr(self, name, self.add_weight(
                    name=name, shape=(self.linformer_dim, tokens), initializer="glorot_normal"
                ))
        if self.normalizes and self.learn_qk_norm:
            self.qk_log_scale = self.add_weight(name="qk_log_scale", shape=(self.num_heads,), initializer="zeros")
        self.patch_positions = None if self.grid_size is None else grid_positions(self.grid_size)
        layer = resolve(self.position_spec.layer)
        options = {argument: getattr(self, attribute) for argument, attribute in self.position_spec.options}
        if self.rotates:
            patches = self.grid_size[0] * self.grid_size[1]
            # Rotated features are float32: keep Keras from casting them to the compute dtype.
            self.rotation = layer(name=self.position, dtype=self.dtype_policy, autocast=self.order == "before", **options)
            self.rotation.build((None, self.num_heads, patches, rotated_dim), (patches, 2))
        if self.position_spec.kind == "bias":
            self.toeplitz = layer(
                self.grid_size, self.num_heads, self.num_prefix_tokens, name=self.position,
                dtype=self.dtype_policy, autocast=False, **options,
            )
            self.toeplitz.build()

    def _make_features(self):
        features = feature_map(self.kernel_name, self.spec)
        options = {name: getattr(self, name) for name in self.spec.options}
        return features(name="features", dtype=self.dtype_policy, autocast=False, **options)

    def _features(self, q, k, training):
        """(phi(q), phi(k)), held to the `FeatureMap` contract: a registered map that returned one tensor failed
        to unpack, other widths than its `output_dim` trained with wrong shapes and FLOP counts, float16 features
        failed in a backend's matmul."""
        outputs = self.features(q, k, training=training)
        owner = type(self.features).__name__
        if not (isinstance(outputs, (tuple, list)) and len(outputs) == 2):
            raise ValueError(f"{owner}.call must return (phi(queries), phi(keys)), got {type(outputs).__name__}")
        for which, x in zip(("queries", "keys"), outputs):
            dtype = keras.backend.standardize_dtype(x.dtype)
            if dtype != "float32":
                raise ValueError(f"{owner} must return float32 features, got {dtype} for the {which}")
            check_rank(f"{owner}'s phi({which})", x.shape, "(batch, heads, tokens, features)")
            check_axis(f"{owner}'s phi({which})", x.shape, -1, "the features axis (its output_dim)", self.features.feature_dim)
        return outputs

    def rotate(self, x, positions):
        """Rotate the grid tokens of (batch, heads, N, dim); prefix tokens stay."""
        p = self.num_prefix_tokens
        return ops.concatenate([x[:, :, :p], self.rotation(x[:, :, p:], positions)], axis=2)

    def call(self, inputs, training=None, positions=None):
        if positions is not None and not self.rotates:
            # The Toeplitz bias is a table indexed by the fixed grid's offsets; silently
            # ignoring other coordinates would make a caller believe they were used.
            rotations = positions_of("rotation")
            raise ValueError(f"positions are used by the rotations {rotations} only; position {self.position!r} "
                             f"always uses the {self.grid_size} grid")
        if positions is not None:
            positions = ops.convert_to_tensor(positions)  # a nested list has no .shape
            expected, shape = (self.grid_size[0] * self.grid_size[1], 2), tuple(positions.shape)
            if len(shape) != 2 or any(given not in (None, wanted) for given, wanted in zip(shape, expected)):
                raise ValueError(f"positions must be {expected}: the (row, column) of each of the {self.grid_size} grid's "
                                 f"tokens, got shape {shape}")
        positions = self.patch_positions if positions is None else positions
        q, k, v = self.heads(inputs, positions)
        if self.spec.linear:
            outputs = self._linear(q, k, v, positions, training)
        elif self.kernel_name == "linformer":
            outputs = self._linformer(q, k, v)
        else:
            outputs = self._softmax(q, k, v)
        return self.output_dense(merge_heads(ops.cast(outputs, self.compute_dtype)))

    def heads(self, inputs, positions=None):
        """q, k, v, each (batch, heads, N, d), as the kernel receives them: projected, normalised, rotated "before".

        For looking into a trained layer; `positions` as in `call`, default
        the grid.
        """
        positions = self.patch_positions if positions is None else positions
        q, k, v = (split_heads(layer(inputs), self.num_heads) for layer in (self.query, self.key, self.value))
        if self.normalizes:
            # |q| = |k| = qk_norm sqrt(d), so |q^T k| / sqrt(d) <= qk_norm^2 sqrt(d).
            norm = self.qk_norm * self.head_dim**0.5
            if self.learn_qk_norm:
                norm = norm * ops.reshape(ops.exp(ops.cast(self.qk_log_scale, q.dtype)), (1, -1, 1, 1))
            # ops.normalize, with the norm scaling the (.., N, 1) inverse lengths, not the (.., N, d)
            # vectors: one full-size multiply fewer per tensor, and the scale's gradient reduces over d
            # times fewer entries.
            q, k = (x * (ops.rsqrt(ops.maximum(ops.sum(ops.square(x), axis=-1, keepdims=True), keras.config.epsilon() ** 2)) * norm)
                    for x in (q, k))
        if self.rotates and self.order == "before":
            q, k = self.rotate(q, positions), self.rotate(k, positions)
        return q, k, v

    def _softmax(self, q, k, v):
        bias = self.toeplitz.bias_matrix() if self.position_spec.kind == "bias" else None
        if self.fused:
            transpose = lambda x: ops.transpose(x, (0, 2, 1, 3))  # (batch, N, heads, d)
            bias = None if bias is None else ops.cast(bias[None], q.dtype)
            outputs = ops.dot_product_attention(transpose(q), transpose(k), transpose(v), bias=bias,
                                                scale=self.head_dim**-0.5)
            return transpose(outputs)
        return softmax_attend(q, ops.transpose(k, (0, 1, 3, 2)), v, bias)  # (batch, heads, N, d)

    def _linformer(self, q, k, v):
        key_projection = ops.cast(self.key_projection, k.dtype)
        value_projection = ops.cast(self.value_projection, v.dtype)
        k = ops.matmul(key_projection, k)  # (batch, heads, linformer_dim, d)
        v = ops.matmul(value_projection, v)  # (batch, heads, linformer_dim, d)
        return softmax_attend(q, ops.transpose(k, (0, 1, 3, 2)), v)  # (batch, heads, N, d)

    def _linear(self, q, k, v, positions, training):
        phi_q, phi_k = self._features(q, k, training)  # (batch, heads, N, m) float32
        v = ops.cast(v, "float32")
        if self.position_spec.kind == "bias":
            return self._linear_toeplitz(phi_q, phi_k, v)
        num_q, num_k = phi_q, phi_k
        if self.rotates and self.order == "after":
            num_q, num_k = self.rotate(phi_q, positions), self.rotate(phi_k, positions)
        kv = ops.matmul(ops.transpose(num_k, (0, 1, 3, 2)), v)  # (batch, heads, m, d)
        numerator = ops.matmul(num_q, kv)  # (batch, heads, N, d)
        k_sum = ops.sum(phi_k, axis=2, keepdims=True)  # (batch, heads, 1, m)
        normaliser = ops.matmul(phi_q, ops.transpose(k_sum, (0, 1, 3, 2)))  # (batch, heads, N, 1)
        return numerator / normaliser

    def _linear_toeplitz(self, phi_q, phi_k, v):
        if self.toeplitz_path_used == "dense":
            keys = ops.transpose(phi_k, (0, 1, 3, 2))
            tokens = ops.shape(phi_q)[2]
            if self.num_heads * tokens * tokens <= DENSE_ONE_PIECE_ELEMENTS:
                return weighted_average(phi_q, keys, v, over_batch(self.toeplitz.weight_matrix(), phi_q.shape[0]))
            return self._dense_toeplitz_blocks(phi_q, keys, v)
        m, d = ops.shape(phi_q)[-1], ops.shape(v)[-1]
        v_ones = ops.concatenate([v, ops.ones_like(v[..., :1])], axis=-1)  # (batch, heads, N, d+1)
        if self.toeplitz_path_used == "dft":
            operators, points = (self.toeplitz.dft_operators(),), 2 * self.grid_size[0] * self.grid_size[1]
            one_piece = DFT_ONE_PIECE_ELEMENTS
        else:
            operators, points = self.toeplitz.kernel_spectrum(), math.prod(self.toeplitz.fft_shape)
            one_piece = FFT_CHUNK_ELEMENTS
        per_feature = self.num_heads * (d + 1) * points
        if m * per_feature <= one_piece:
            out = self._correlate_features(phi_q, phi_k, v_ones, *operators)
        else:
            size, whole, _ = loop_chunks(m, per_feature, FFT_CHUNK_ELEMENTS)
            out = self._correlate_feature_chunks(phi_q, phi_k, v_ones, operators, size, whole)
        return out[..., :d] / out[..., d:]

    def _correlate_feature_chunks(self, phi_q, phi_k, v_ones, operators, size, whole):
        """`_correlate_features` over `whole` chunks of `size` features, one after another (`sum_in_a_loop`), then the rest, each recomputed in the backward pass."""
        correlate = keras.remat(self._correlate_features)
        batch, heads, tokens = ops.shape(phi_q)[:3]
        features = whole * size
        stacked_q, stacked_k = (ops.moveaxis(ops.reshape(phi[..., :features], (batch, heads, tokens, whole, size)), 3, 0)
                                for phi in (phi_q, phi_k))  # (whole, batch, heads, N, size)

        def chunk(i):
            return correlate(ops.take(stacked_q, i, axis=0), ops.take(stacked_k, i, axis=0), v_ones, *operators)

        out = sum_in_a_loop(whole, chunk, ops.zeros_like(v_ones))
        if features < ops.shape(phi_q)[-1]:
            out = out + correlate(phi_q[..., features:], phi_k[..., features:], v_ones, *operators)
        return out

    def _dense_toeplitz_blocks(self, phi_q, keys, v):
        """The dense path with the query rows in blocks of grid rows, one block after another (`ops.map`), each recomputed in the backward pass."""
        height, width = self.grid_size
        p = self.num_prefix_tokens
        tokens = p + height * width
        rows, blocks, rest = loop_chunks(height, self.num_heads * width * tokens, DENSE_BLOCK_ELEMENTS)
        table = self.toeplitz.weight_table()

        @keras.remat
        def block(phi_q, first, keys, v, table):
            count = phi_q.shape[2] // width
            return weighted_average(phi_q, keys, v, over_batch(self.toeplitz.weight_rows(table, first, count), phi_q.shape[0]))

        # Prefix queries weigh every key by 1: plain kernelized attention.
        outputs = [weighted_average(phi_q[:, :, :p], keys, v)] if p else []
        batch, m = ops.shape(phi_q)[0], ops.shape(phi_q)[-1]
        whole = blocks * rows * width  # the queries of the whole blocks; the rest's follow
        stacked = ops.reshape(phi_q[:, :, p:p + whole], (batch, self.num_heads, blocks, rows * width, m))
        block_outputs = ops.map(lambda args: block(args[0], args[1], keys, v, table),
                                (ops.moveaxis(stacked, 2, 0), ops.arange(blocks) * rows))  # (blocks, batch, heads, rows W, d)
        outputs.append(ops.reshape(ops.moveaxis(block_outputs, 0, 2), (batch, self.num_heads, whole, -1)))
        if rest:
            outputs.append(block(phi_q[:, :, p + whole:], blocks * rows, keys, v, table))
        return ops.concatenate(outputs, axis=2)

    def _correlate_features(self, phi_q, phi_k, v_ones, *operators):
        """sum_j exp(b[p_j - p_i]) phi(q_i)^T phi(k_j) [v_j, 1] over these features: (batch, heads, N, d+1).

        `operators`: the FFT path's kernel spectrum (real, imag), or the DFT path's (`dft_operators()`,).
        """
        heads, tokens, m = ops.shape(phi_q)[1:]
        width = ops.shape(v_ones)[-1]
        # u_j = phi(k_j) (x) [v_j, 1]: numerator and normaliser in one correlation.
        u = phi_k[..., :, None] * v_ones[..., None, :]  # (batch, heads, N, m, d+1)
        u = ops.reshape(u, (-1, heads, tokens, m * width))
        s = self.toeplitz.correlate_dft(u, *operators) if self.toeplitz_path_used == "dft" else self.toeplitz.correlate(u, operators)
        s = ops.reshape(s, (-1, heads, tokens, m, width))
        return ops.matmul(phi_q[..., None, :], s)[..., 0, :]  # (.., N, 1, m) @ (.., N, m, d+1) -> (batch, heads, N, d+1)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    # What a config saved before an option existed meant: Luo et al.'s norm, never learned,
    # and the Performer's stabiliser.
    _SAVED_BEFORE = {"qk_norm": QK_NORM_BEFORE_OPTION, "learn_qk_norm": False, "stabilizer": STABILIZER_BEFORE_OPTION}

    @classmethod
    def from_config(cls, config):
        return super().from_config({**cls._SAVED_BEFORE, **config})

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            kernel_name=self.kernel_name,
            position=self.position,
            grid_size=self.grid_size,
            num_prefix_tokens=self.num_prefix_tokens,
            num_features=self.num_features,
            orthogonal=self.orthogonal,
            redraw_interval=self.redraw_interval,
            deterministic=self.deterministic,
            rotation_order=self.rotation_order,
            rope_mixed=self.rope_mixed,
            normalize_qk=self.normalize_qk,
            qk_norm=self.qk_norm,
            learn_qk_norm=self.learn_qk_norm,
            linformer_dim=self.linformer_dim,
            fused=self.fused,
            seed=self.seed,
            toeplitz_path=self.toeplitz_path,
            stabilizer=self.stabilizer,
        )
        return config
