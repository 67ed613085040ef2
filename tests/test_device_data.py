""" sa_vision.train.device_data: the data held on the device against the CPU transform and DistributedSampler

References: torchvision's transforms (``create_cifar_transform``, applied per image), crops cut by hand from a
zero-padded image, ``torch.randperm`` as DistributedSampler documents its order, binomial bounds.
"""
import csv
import math
import os
import shutil
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from helpers import HANG_TIMEOUT_S
from torch.utils._python_dispatch import TorchDispatchMode

from sa_vision.errors import UserError
from sa_vision.train.data import create_cifar_transform, create_image_dataset, held_tensors
from sa_vision.train.device_data import DeviceEvalLoader, DeviceTrainLoader, resolve_device_data
from sa_vision.train.recipes import RECIPE_DIR

ROOT = Path(__file__).resolve().parent.parent
DIGITS_RECIPE = RECIPE_DIR / 'sa_quadratic_cifar_digits.yaml'
TINY = ['--model-kwargs', 'embed_dim=16', 'depth=1', 'heads_per_layer=2', 'mlp_hidden_dim=32']

SIZE, PAD = 8, 2
# pixel (r, c) = 1 + 8 r + c: every crop of the zero-padded image and its mirror image differ
PATTERN = (1 + torch.arange(SIZE * SIZE)).view(1, 1, SIZE, SIZE).to(torch.uint8)
IDENTITY = dict(mean=(0.,), std=(1.,), channels=1)  # normalised = pixel / 255, so crops read back exactly


def reference_crops(image: torch.Tensor, pad: int) -> dict:
    """{(row offset, column offset, flipped): crop} of a C x H x W image, cut by hand from its zero-padded copy."""
    padded = F.pad(image, (pad, pad, pad, pad))
    h, w = image.shape[-2:]
    crops = {}
    for i in range(2 * pad + 1):
        for j in range(2 * pad + 1):
            crop = padded[:, i:i + h, j:j + w]
            crops[(i, j, False)], crops[(i, j, True)] = crop, crop.flip(-1)
    return crops


def classify(crops: torch.Tensor, pad: int):
    """The (offset, offset, flipped) of each crop of PATTERN; a crop matching none raises."""
    refs = reference_crops(PATTERN[0].float(), pad)
    keys = list(refs)
    table = torch.stack([refs[k] for k in keys]).flatten(1)
    equal = (crops.flatten(1)[:, None, :] == table[None]).all(-1)
    assert equal.any(1).all(), 'a crop matches no crop of the zero-padded image'
    return [keys[i] for i in equal.float().argmax(1).tolist()]


def binomial_bound(n: int, p: float, sigmas: float = 5.) -> float:
    return sigmas * math.sqrt(n * p * (1 - p))


def train_draws(hflip: float, pad: int = PAD, epochs: int = 4, n: int = 1000):
    loader = DeviceTrainLoader(PATTERN.expand(n, -1, -1, -1), torch.zeros(n), 100, device='cpu', hflip=hflip,
                               crop_padding=pad, seed=3, **IDENTITY)
    crops = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        crops += [images for images, _ in loader]
    return classify(torch.cat(crops).mul(255).round(), pad)


def test_crops_take_every_offset_of_the_cpu_transform_uniformly_and_no_other():
    draws = train_draws(hflip=0.5)
    offsets = [(i, j) for i, j, _ in draws]
    # the CPU pipeline's offsets, from torchvision's RandomCrop applied image by image
    cpu = create_cifar_transform(True, img_size=SIZE, crop_padding=PAD, hflip=0.5, mean=(0.,), std=(1.,),
                                 tensor_input=True)
    cpu_offsets = {(i, j) for i, j, _ in classify(torch.stack([cpu(PATTERN[0].float()) for _ in range(1000)]), PAD)}
    grid = {(i, j) for i in range(2 * PAD + 1) for j in range(2 * PAD + 1)}
    assert set(offsets) == cpu_offsets == grid
    # uniform over the 25 offsets: Pearson's chi-square at 0.1 % (simulated, a sampler drawing the 9 inner offsets
    # 1.3x as often as the 16 outer ones fails it 98 % of the time, the 5-sigma bound of each cell 5 %)
    scipy_stats = pytest.importorskip('scipy.stats')
    counts = [offsets.count(cell) for cell in sorted(grid)]
    assert scipy_stats.chisquare(counts).pvalue > 1e-3, counts


@pytest.mark.parametrize('hflip', [0., 0.3, 1.])
def test_flips_occur_with_the_recipes_probability(hflip):
    flips = [f for _, _, f in train_draws(hflip=hflip)]
    assert abs(sum(flips) - len(flips) * hflip) <= binomial_bound(len(flips), hflip)
    if hflip in (0., 1.):
        assert set(flips) == {bool(hflip)}


def test_no_padding_means_whole_images():
    assert {(i, j) for i, j, _ in train_draws(hflip=0.5, pad=0, epochs=1)} == {(0, 0)}


def test_eval_batches_equal_the_cpu_transform_exactly():
    ds = create_image_dataset('digits', 'test', is_training=False)
    images, targets = held_tensors(ds)
    loader = DeviceEvalLoader(images, targets, 100, ds.transform.transforms[-1].mean,
                              ds.transform.transforms[-1].std, 'cpu')
    batches = list(loader)
    assert len(loader) == len(batches) == 4 and len(batches[-1][0]) == len(ds) - 300  # the short batch is kept
    expected = torch.stack([ds[i][0] for i in range(len(ds))])
    assert torch.equal(torch.cat([b[0] for b in batches]), expected)
    assert torch.cat([b[1] for b in batches]).tolist() == [ds[i][1] for i in range(len(ds))]


def test_cifar_arrays_give_what_torchvisions_pil_items_give():
    from torchvision.datasets import CIFAR10
    rng = np.random.default_rng(0)
    ds = CIFAR10.__new__(CIFAR10)  # a CIFAR-10 without its files: the arrays torchvision reads them into
    ds.data = rng.integers(0, 256, (7, 32, 32, 3), dtype=np.uint8)
    ds.targets, ds.target_transform = [3, 1, 4, 1, 5, 9, 2], None
    ds.transform = create_cifar_transform(False)
    images, targets = held_tensors(ds)
    norm = ds.transform.transforms[-1]
    (batch, labels), = DeviceEvalLoader(images, targets, 10, norm.mean, norm.std, 'cpu')
    assert torch.equal(batch, torch.stack([ds[i][0] for i in range(7)])) and labels.tolist() == ds.targets


def test_training_batches_without_augmentation_equal_the_cpu_pipeline_exactly():
    ds = create_image_dataset('digits', 'train', is_training=True, hflip=0., crop_padding=0)
    norm = ds.transform.transforms[-1]
    loader = DeviceTrainLoader(*held_tensors(ds), 64, norm.mean, norm.std, 'cpu', hflip=0., crop_padding=0, seed=5)
    loader.set_epoch(2)
    order = torch.randperm(len(ds), generator=torch.Generator().manual_seed(5 + 2))  # DistributedSampler's
    images, targets = next(iter(loader))
    assert torch.equal(images, torch.stack([ds[i][0] for i in order[:64].tolist()]))
    assert targets.tolist() == [ds[i][1] for i in order[:64].tolist()]


def _batches(seed, epoch, n=300, device='cpu'):
    gen = torch.Generator().manual_seed(0)
    loader = DeviceTrainLoader(torch.randint(0, 256, (n, 3, SIZE, SIZE), generator=gen, dtype=torch.uint8),
                               torch.arange(n), 32, (0.5,) * 3, (0.25,) * 3, device, seed=seed)
    loader.set_epoch(epoch)
    return list(loader)


def test_same_seed_same_batches_bit_for_bit_other_seed_or_epoch_others():
    first, again = _batches(1, 0), _batches(1, 0)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, again))
    for other in (_batches(2, 0), _batches(1, 1)):
        assert not torch.equal(torch.cat([b[1] for b in first]), torch.cat([b[1] for b in other]))
        assert not torch.equal(first[0][0], other[0][0])


def test_a_negative_seed_trains_on_the_device_as_on_the_dataloader():
    """--seed -1, which timm's and the DataLoader's seeding take (modulo 2**32), draws the device's augmentation too
    (numpy's SeedSequence refuses negative numbers: the first batch crashed), the same for the same seed."""
    first, again = _batches(-1, 0), _batches(-1, 0)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, again))
    assert not torch.equal(first[0][0], _batches(-2, 0)[0][0])


def test_blocks_of_batches_give_every_image_its_own_crop_flip_and_target():
    gen = torch.Generator().manual_seed(0)
    n, batch = 70, 8  # 8 full batches, augmented 3 at a time: blocks of 24, 24 and 16 images
    images = torch.randint(0, 256, (n, 3, SIZE, SIZE), generator=gen, dtype=torch.uint8)
    loader = DeviceTrainLoader(images, torch.arange(n) * 10, batch, (0.5,) * 3, (0.25,) * 3, 'cpu', crop_padding=PAD,
                               seed=1, block_images=3 * batch + 5)
    loader.set_epoch(3)
    indices, offsets, flips = loader.epoch_draws()
    expected = []
    for i, (r, c), f in zip(indices.tolist(), offsets.tolist(), flips.tolist()):
        crop = reference_crops(images[i], PAD)[(r, c, f)].float().div(255.)
        expected.append((crop - 0.5) / 0.25)
    batches = list(loader)
    assert len(batches) == len(loader) == n // batch and all(len(b[0]) == batch for b in batches)
    assert torch.equal(torch.cat([b[0] for b in batches]), torch.stack(expected[:n // batch * batch]))
    assert torch.cat([b[1] for b in batches]).tolist() == [10 * i for i in indices[:n // batch * batch].tolist()]


def test_crops_and_flips_are_drawn_anew_per_seed_epoch_and_rank():
    def first_batch(seed, epoch, rank):  # of identical images: only the augmentation tells batches apart
        loader = DeviceTrainLoader(PATTERN.expand(200, -1, -1, -1), torch.zeros(200), 50, device='cpu', seed=seed,
                                   rank=rank, world_size=2, crop_padding=PAD, **IDENTITY)
        loader.set_epoch(epoch)
        return next(iter(loader))[0]
    base = first_batch(1, 0, 0)
    assert torch.equal(base, first_batch(1, 0, 0))
    for seed, epoch, rank in ((2, 0, 0), (1, 1, 0), (1, 0, 1)):
        assert not torch.equal(base, first_batch(seed, epoch, rank)), (seed, epoch, rank)


@pytest.mark.cuda
def test_cuda_trains_on_the_batches_the_cpu_draws():
    cpu, cuda = ([(x.to('cpu'), y.to('cpu')) for x, y in _batches(1, 0, device=device)] for device in ('cpu', 'cuda'))
    for (x, y), (x_cuda, y_cuda) in zip(cpu, cuda):
        assert torch.equal(y, y_cuda)
        torch.testing.assert_close(x_cuda, x, rtol=0, atol=1e-6)


def test_ranks_train_disjoint_slices_of_distributed_samplers_order():
    n, batch, seed, epoch = 103, 10, 7, 3
    seen = []
    for rank in range(2):
        loader = DeviceTrainLoader(torch.zeros(n, 1, 4, 4, dtype=torch.uint8), torch.arange(n), batch, (0.,), (1.,),
                                   'cpu', seed=seed, rank=rank, world_size=2)
        loader.set_epoch(epoch)
        batches = [t.tolist() for _, t in loader]
        assert len(loader) == len(batches) == (n // 2) // batch and all(len(b) == batch for b in batches)
        seen.append([i for b in batches for i in b])
    assert not set(seen[0]) & set(seen[1])
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()[:n // 2 * 2]
    for rank in range(2):  # rank r takes every second image of the epoch's order, full batches only
        assert seen[rank] == order[rank::2][:len(seen[rank])]


def test_ranks_evaluate_disjoint_shards_of_every_image():
    n = 11
    shards = [[i for _, t in DeviceEvalLoader(torch.zeros(n, 1, 4, 4), torch.arange(n), 4, (0.,), (1.,), 'cpu',
                                              rank=rank, world_size=2) for i in t.tolist()] for rank in range(2)]
    assert sorted(shards[0] + shards[1]) == list(range(n)) and not set(shards[0]) & set(shards[1])


def test_on_refuses_what_it_cannot_hold(monkeypatch):
    ds = create_image_dataset('digits', 'train', is_training=True)
    monkeypatch.setattr(torch.cuda, 'mem_get_info', lambda device: (2 ** 20, 2 ** 30))
    with pytest.raises(UserError, match=r'--device-data on .* needs 0\.0\d GiB .* has 0\.00 GiB free'):
        resolve_device_data('on', 'cuda', ds, ds, 32, 4)
    held, why = resolve_device_data('auto', 'cuda', ds, ds, 32, 4)
    assert held is None and 'DataLoader' in why
    from torchvision.datasets import ImageFolder
    images = ImageFolder.__new__(ImageFolder)  # reads its files per item
    with pytest.raises(UserError, match='--device-data on .* not held in memory'):
        resolve_device_data('on', 'cpu', images, ds, 32, 4)
    with pytest.raises(UserError, match='--device-data on .* images are 32x32, the model takes 64x64'):
        resolve_device_data('on', 'cpu', ds, ds, 64, 4)
    assert resolve_device_data('auto', 'cpu', ds, ds, 32, 4)[0] is None  # the CPU keeps its DataLoader
    assert resolve_device_data('on', 'cpu', ds, ds, 32, 4)[0] is not None


def test_without_augmentation_both_paths_train_the_same_weights(tmp_path):
    # the same images in the same order: bit for bit the same steps (the digits recipe draws no crop or flip)
    from sa_vision.train import loop as training
    from sa_vision.train.checkpoint import read_checkpoint
    weights = {}
    for device_data in ('on', 'off'):
        training.main(['-c', str(DIGITS_RECIPE), '--device-data', device_data, '--device', 'cpu', '--epochs', '1',
                       '-b', '64', *TINY, '--output', str(tmp_path), '--experiment', device_data])
        weights[device_data] = read_checkpoint(tmp_path / device_data / 'last.pth.tar').state_dict
    for key, value in weights['off'].items():
        assert torch.equal(weights['on'][key], value), key


@pytest.mark.slow
def test_torchrun_two_processes_hold_their_slices_like_one_process_with_the_global_batch(tmp_path):
    # DDP averages the gradients of two disjoint halves of each global batch: 2 x 32 trains as 1 x 64
    torchrun = shutil.which('torchrun')
    cmd = [torchrun] if torchrun else [sys.executable, '-m', 'torch.distributed.run']
    args = ['-c', DIGITS_RECIPE, '--device-data', 'on', '--device', 'cpu', '--epochs', 1, *TINY, '--output',
            tmp_path]
    cmd += ['--standalone', '--nproc_per_node', 2, '-m', 'sa_vision.cli.train', *args, '-b', 32, '--experiment', 'ddp']
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT))
    proc = subprocess.run(list(map(str, cmd)), cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=HANG_TIMEOUT_S)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert '2 process(es) on cpu' in log and 'Data: --device-data on' in log and '(360 images)' in log
    from sa_vision.train import loop as training
    from sa_vision.train.checkpoint import read_checkpoint
    training.main(list(map(str, args + ['-b', 64, '--experiment', 'single'])))
    ddp, single = (read_checkpoint(tmp_path / run / 'last.pth.tar') for run in ('ddp', 'single'))
    assert ddp.meta['num_updates'] == single.meta['num_updates'] == 1437 // 64
    for key, value in single.state_dict.items():
        torch.testing.assert_close(ddp.state_dict[key], value, rtol=1e-3, atol=1e-4, msg=key)


@pytest.mark.parametrize('device_data', ['on', 'off'])
def test_a_batch_larger_than_the_split_is_refused_on_both_paths(device_data, tmp_path):
    from sa_vision.train import loop as training
    with pytest.raises(UserError, match='fewer than one batch of 2000'):
        training.main(['--dataset', 'digits', '--device-data', device_data, '--device', 'cpu', '-b', '2000', '-j', '0',
                       *TINY, '--output', str(tmp_path)])


class _Killed(Exception):
    pass


@pytest.mark.slow
def test_training_with_the_data_on_the_device_end_to_end_and_resumed(tmp_path, monkeypatch):
    from sa_vision.train import loop as training
    from sa_vision.train.checkpoint import read_checkpoint
    args = ['--dataset', 'digits', '--device-data', 'on', '--device', 'cpu', '--epochs', '2', '-b', '64',
            '--hflip', '0.5', '--train-crop-padding', '4', *TINY, '--output', str(tmp_path)]
    epochs = []
    set_epoch = DeviceTrainLoader.set_epoch
    monkeypatch.setattr(DeviceTrainLoader, 'set_epoch', lambda self, epoch: (epochs.append(epoch),
                                                                             set_epoch(self, epoch)))
    training.main(args + ['--experiment', 'straight'])
    assert epochs == [0, 1]  # the loop starts every epoch of the loader
    run = tmp_path / 'straight'
    used = yaml.safe_load((run / 'args.yaml').read_text())
    assert used['device_data'] == 'on' and used['device_data_used'] is True
    assert 'device_data' not in yaml.safe_load((run / 'recipe.yaml').read_text())  # a choice of this machine
    straight = read_checkpoint(run / 'last.pth.tar')
    history = straight.meta['history']
    rows = list(csv.DictReader(open(run / 'summary.csv', encoding='utf-8')))
    for h, row in zip(history, rows):
        assert h['train_img_per_s'] == pytest.approx(1437 // 64 * 64 / h['train_time'])
        assert float(row['train_img_per_s']) == pytest.approx(h['train_img_per_s'])

    save = training.save_epoch

    def save_and_stop(ckpt, *rest):  # as if killed right after the first epoch's checkpoint
        save(ckpt, *rest)
        raise _Killed
    monkeypatch.setattr(training, 'save_epoch', save_and_stop)
    with pytest.raises(_Killed):
        training.main(args + ['--experiment', 'killed'])
    monkeypatch.setattr(training, 'save_epoch', save)
    training.main(['--resume', str(tmp_path / 'killed' / 'last.pth.tar')])
    resumed = read_checkpoint(tmp_path / 'killed' / 'last.pth.tar')
    assert resumed.meta['epoch'] == 2 and resumed.state_dict.keys() == straight.state_dict.keys()
    for key, value in straight.state_dict.items():
        assert torch.equal(value, resumed.state_dict[key]), key


class _LiveBytes(TorchDispatchMode):
    """The bytes of the storages that ops make while active and that are still alive, and their peak."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.seen = set()

    def _freed(self, key, nbytes):
        self.live -= nbytes
        self.seen.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key and key not in self.seen:
                    self.seen.add(key)
                    self.live += storage.nbytes()
                    weakref.finalize(storage, self._freed, key, storage.nbytes())
        self.peak = max(self.peak, self.live)
        return out


def test_the_memory_check_counts_the_augmentations_peak(monkeypatch):
    """What ``device_data_bytes`` adds for the augmentation holds the peak of the tensors one epoch makes, the loop
    keeping the batch before (measured by the storages alive, not by the formula)."""
    import sa_vision.train.device_data as device_data
    images = torch.randint(0, 256, (2048, 3, 32, 32), dtype=torch.uint8)
    targets = torch.zeros(2048, dtype=torch.long)
    loader = DeviceTrainLoader(images, targets, 128, (0.5,) * 3, (0.25,) * 3, 'cpu', crop_padding=4,
                               block_images=1024)
    with _LiveBytes() as live:
        for _batch in loader:  # the loop variable holds the last batch, a view of its block, while the next is made
            pass
    held = ((images, targets), (images[:10], targets[:10]))
    counted = {}
    for block in (1024, 0):
        monkeypatch.setattr(device_data, 'AUGMENT_BLOCK_IMAGES', block)
        counted[block] = device_data.device_data_bytes(*held, crop_padding=4)
    float_block = 1024 * 3 * 32 * 32 * 4
    assert 2 * float_block < live.peak <= counted[1024] - counted[0], (live.peak / float_block)
