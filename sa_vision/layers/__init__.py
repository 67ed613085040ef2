from .attention import (
    ATTENTION_KINDS, ContentScores, GeneralizedScores, HeadsLinear, LearnedScores, PositionalAttention, QuadraticScores,
    apply_mixing, attend_then_project, dense_attention, grid_shifts, relative_shifts,
)
from .embed import SpaceToDepthEmbed, space_to_depth
from .mlp import GeluMlp
