"""One epoch (a subset of Fashion-MNIST) of the narrow cpu-profile model, DataLoader vs data held on the device,
alternately; also the loaders alone.

docs/training.md's CPU figure for --device-data (2026-11-26, AMD EPYC, 2 busy cores, torch 2.14.1):

    OMP_NUM_THREADS=1 python docs/probes/cpu/device_data_pairing.py 500 5 0   # and ... 500 5 4 (padding 4)

raw output: device_data_pairing_2026-11-26.log
"""
import statistics
import sys
import time

import timm
import torch
from torch.utils.data import DataLoader, DistributedSampler, Subset

import sa_vision  # noqa
from sa_vision.train.data import create_image_dataset, dataset_info, held_tensors
from sa_vision.train.device_data import DeviceTrainLoader

N = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
PAD = int(sys.argv[3]) if len(sys.argv) > 3 else 0   # the cpu profile: train_crop_padding 0
torch.set_num_threads(1)
info = dataset_info('fashion-mnist')
ds = create_image_dataset('fashion-mnist', 'train', is_training=True, hflip=0.5, crop_padding=PAD)
idx = list(range(N))
images, targets = held_tensors(ds)

def dataloader():
    sub = Subset(ds, idx)
    sampler = DistributedSampler(sub, num_replicas=1, rank=0, shuffle=True, seed=42, drop_last=True)
    return DataLoader(sub, batch_size=50, sampler=sampler, num_workers=0, drop_last=True)

def device_loader():
    return DeviceTrainLoader(images[:N], targets[:N], 50, info.mean, info.std, 'cpu', hflip=0.5, crop_padding=PAD,
                             seed=42)

model = timm.create_model('sa_quadratic_cifar', embed_dim=64, mlp_hidden_dim=128, num_classes=10)
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
loss_fn = torch.nn.CrossEntropyLoss()

def epoch(loader, train):
    start = time.perf_counter()
    for x, y in loader:
        if train:
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return time.perf_counter() - start

for train in (False, True):
    times = {'DataLoader': [], 'device': []}
    epoch(dataloader(), train)  # warm-up
    epoch(device_loader(), train)
    for _ in range(ROUNDS if train else 3 * ROUNDS):
        for name, make in (('DataLoader', dataloader), ('device', device_loader)):
            times[name].append(epoch(make(), train))
    med = {k: statistics.median(v) for k, v in times.items()}
    what = 'epoch with the model' if train else 'loader alone'
    print(f'{what}, {N} images, pad {PAD}: DataLoader {N / med["DataLoader"]:.0f} img/s, '
          f'device {N / med["device"]:.0f} img/s, '
          f'ratio DataLoader time / device time {med["DataLoader"] / med["device"]:.3f} '
          f'(per round: {[round(a / b, 3) for a, b in zip(times["DataLoader"], times["device"])]})', flush=True)
