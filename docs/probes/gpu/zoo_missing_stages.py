"""The zoo's three stages trained on the H100 on 2026-11-25 (docs/reproduction.md), as they were run.

On the GPU machine: ``OMP_NUM_THREADS=8 python docs/probes/gpu/zoo_missing_stages.py train /tmp/zoo``
(sa_gen_cifar and resnet18_cifar side by side, then pruning and the pruned model's fine-tuning). Then, with the
run folder copied here: ``python docs/probes/gpu/zoo_missing_stages.py keep /tmp/zoo`` (the table's float32
evaluation on the CPU, the Hub folders, and the copy into zoo/fashion-mnist-cpu).
"""
import sys
from concurrent.futures import ThreadPoolExecutor

from sa_vision.reproduce import PRUNED_MODEL, Reproduction

MODELS = ['sa_gen_cifar', 'resnet18_cifar', PRUNED_MODEL]

if __name__ == '__main__':
    step, out = sys.argv[1], sys.argv[2]
    reproduction = Reproduction(out, 'cpu')
    if step == 'train':
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(reproduction.train, MODELS[:2]))
        reproduction.train(PRUNED_MODEL, initial_checkpoint=reproduction.prune())
    else:
        reproduction.table(MODELS)
        reproduction.export(MODELS)
        reproduction.keep('zoo/fashion-mnist-cpu')
