""" Measuring: MAC counts, peak memory, and alternating A/B throughput benchmarks """
from .benchmark import benchmark_variants, build_variants, matmul_rate, profile_train_step
from .macs import count_macs, unavoidable_macs, unavoidable_macs_from_config
from .memory import LiveTensorMemory
from .peers import PEERS, build_peer
from .results import RESULTS_FORMATS, format_results

__all__ = ['count_macs', 'unavoidable_macs', 'unavoidable_macs_from_config', 'LiveTensorMemory', 'matmul_rate',
           'build_variants', 'benchmark_variants', 'format_results', 'RESULTS_FORMATS', 'profile_train_step', 'PEERS',
           'build_peer']
