"""N training (or eval) steps of the cpu profile's narrow sa_quadratic_cifar, batch 50, float32; prints the
mean of the faster half and the median seconds per step, with the sa_vision it imported.

How docs/performance.md's pairing of choose_path (and of the chunked attention + Value Function) was measured
on 2026-11-26 (AMD EPYC, 2 shared cores, torch 2.14.1): the same script, in separate processes, alternating
between a checkout of the code before (cf13499) and after, one thread:

    for r in $(seq 6); do for code in $OLD $NEW; do
      OMP_NUM_THREADS=1 PYTHONPATH=$code python docs/probes/cpu/path_pairing.py train 8
    done; done   # and `eval 30`; raw lines: path_pairing_2026-11-26.log
"""
import sys
import time

import timm
import torch

import sa_vision  # noqa: F401

mode, steps = sys.argv[1], int(sys.argv[2])
name = sys.argv[3] if len(sys.argv) > 3 else 'sa_quadratic_cifar'
torch.manual_seed(0)
model = timm.create_model(name, embed_dim=64, mlp_hidden_dim=128)
x = torch.randn(50, 3, 32, 32)
y = torch.randint(0, 10, (50,))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
def train_step():
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
def eval_step():
    with torch.no_grad():
        model(x)
if mode == 'train':
    model.train()
    step = train_step
else:
    model.eval()
    step = eval_step
for _ in range(2):
    step()
times = []
for _ in range(steps):
    t = time.perf_counter()
    step()
    times.append(time.perf_counter() - t)
times.sort()
print(sa_vision.__file__, mode, f'{sum(times[:len(times)//2+1])/(len(times)//2+1):.5f}', f'{times[len(times)//2]:.5f}')
