"""How much of a compiled training step's first call inductor's on-disk caches save in a fresh process: the device
check's warm phase (docs/probes/gpu/device_check.md) rests on it.

    d=$(mktemp -d); for run in cold warm; do TORCHINDUCTOR_CACHE_DIR=$d OMP_NUM_THREADS=2 \\
        python docs/probes/cpu/compile_cache_probe.py $run; done

The `cpu` profile's narrow sa_quadratic_cifar, batch 8, bf16 autocast, inductor (C++ on the CPU): the first training
step (forward, backward, SGD step) of a new process, with the caches' counters. The second process finds the first
one's graphs in TORCHINDUCTOR_CACHE_DIR.
"""
import sys
import time

import torch
from torch._dynamo.utils import counters

from sa_vision.measure import benchmark as sab
from sa_vision.reproduce import PROFILES

kwargs = dict(PROFILES['cpu'].per_model['sa_quadratic_cifar']['model_kwargs'])
torch.manual_seed(0)
(variant,) = sab.build_variants('sa_quadratic_cifar', [], input_size=(3, 32, 32), **kwargs)
runner = sab.StepRunner(variant, 8, (3, 32, 32), torch.device('cpu'), amp=True, amp_dtype='bfloat16',
                     torchcompile='inductor')
t0 = time.time()
runner.train_step()
caches = {k: v for group in ('inductor', 'aot_autograd') for k, v in counters[group].items()
          if k.startswith(('fxgraph_cache_', 'autograd_cache_'))}
print(f'{sys.argv[1] if len(sys.argv) > 1 else "run"}: first training step {time.time() - t0:.1f} s; {caches}')
