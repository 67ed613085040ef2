""" Building blocks: positional attention (paper Sec. 2-3, Eq. 9), the space-to-depth embedding, the MLP,
stochastic depth """
from .attention import (
    ATTENTION_KINDS,
    HeadsLinear,
    PositionalAttention,
    apply_mixing,
    attend_then_project,
    drop_negligible,
    negligible_below,
    project_then_mix,
)
from .attention_path import CUDA_DENSE_MIXING, CUDA_PROJECT_FIRST, AttentionPath, choose_path
from .drop import SampleDropPath
from .embed import (
    SpaceToDepthEmbed,
    check_image_batch_shape,
    check_image_shape,
    check_input_size,
    has_checked_input_size,
)
from .mlp import GeluMlp
from .scores import (
    CONV_INIT_ALPHA,
    POSITION_INITS,
    ContentScores,
    GeneralizedScores,
    LearnedScores,
    QuadraticScores,
    kernel_offsets,
    relative_shifts,
)
from .switches import batched_heads, dense_attention, fused_mix_and_project, project_first

__all__ = [
    'ATTENTION_KINDS', 'CUDA_DENSE_MIXING', 'AttentionPath', 'HeadsLinear', 'PositionalAttention', 'apply_mixing',
    'attend_then_project', 'batched_heads', 'choose_path', 'dense_attention', 'drop_negligible',
    'fused_mix_and_project', 'negligible_below', 'CUDA_PROJECT_FIRST', 'project_first', 'project_then_mix',
    'SampleDropPath', 'SpaceToDepthEmbed', 'check_image_shape', 'check_image_batch_shape', 'check_input_size',
    'has_checked_input_size',
    'GeluMlp',
    'CONV_INIT_ALPHA', 'POSITION_INITS', 'ContentScores', 'GeneralizedScores', 'LearnedScores', 'QuadraticScores',
    'kernel_offsets', 'relative_shifts',
]
