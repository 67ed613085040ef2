from .attention import (
    ATTENTION_KINDS, ContentScores, GeneralizedScores, HeadsLinear, LearnedScores, PositionalAttention, QuadraticScores,
    dense_attention, grid_shifts, relative_shifts,
)
from .embed import SpaceToDepthEmbed, space_to_depth
