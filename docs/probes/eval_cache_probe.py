""" What the evaluation cache of the positional probabilities buys (docs/performance.md, "The evaluation cache"):
eval forwards (no autograd, one thread) with the cache (A) and with every layer's cache cleared before each forward
(B), alternated in one process; prints the median of the B/A time ratios. A measuring script, not a library part.

    nice -n 19 python docs/probes/eval_cache_probe.py --rounds 7
"""
import argparse
import statistics
import time

import timm
import torch

import sa_vision  # noqa: F401  registers the models
from sa_vision.layers import PositionalAttention

CASES = [('sa_quadratic_cifar', True, 1), ('sa_quadratic_cifar', True, 100), ('sa_gen_cifar', True, 1),
         ('sa_gen_cifar', True, 100), ('sa_learned_cifar', True, 1), ('sa_gen_cifar', False, 1)]


def timed(model, x, reps, clear):
    layers = [m for m in model.modules() if isinstance(m, PositionalAttention)]
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(reps):
            if clear:
                for layer in layers:
                    layer.clear_probs_cache()
            model(x)
    return (time.perf_counter() - start) / reps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name, narrow, batch in CASES:
        kwargs = dict(embed_dim=64, mlp_hidden_dim=128) if narrow else {}
        model = timm.create_model(name, **kwargs).eval()
        x = torch.randn(batch, 3, 32, 32)
        reps = 10 if batch == 1 else 2
        timed(model, x, 2, False)
        ratios, cached = [], []
        for _ in range(args.rounds):
            a = timed(model, x, reps, False)
            b = timed(model, x, reps, True)
            ratios.append(b / a)
            cached.append(a)
        print(f'{name:18s} {"narrow" if narrow else "full":6s} B={batch:3d}  uncached / cached: median '
              f'{statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f}; '
              f'cached {statistics.median(cached) * 1e3:.0f} ms)', flush=True)


if __name__ == '__main__':
    main()
