"""performer-keras: Performer attention and relative positions as Keras 3 layers."""

from performer_keras.circulant_string import CirculantString
from performer_keras.exp_features import ExpFeatures
from performer_keras.favor_features import FavorFeatures
from performer_keras.kernel_attention import KernelAttention
from performer_keras.options import KERNELS, POSITIONS
from performer_keras.relu_features import ReluFeatures
from performer_keras.rotary_embedding_2d import RotaryEmbedding2D
from performer_keras.toeplitz_bias_2d import ToeplitzBias2D
from performer_keras.class_token import ClassToken
from performer_keras.position_embedding import PositionEmbedding
from performer_keras.registry import SIZES, create_model, list_variants, parse_variant
from performer_keras.vit import build_vit
