""" The probes that chose the cpu profile (docs/reproduction.md, "Choosing the profile"): a short training on
Fashion-MNIST, top-1 on the first test images and the median centre shift. A measuring script, not a library part.

    python docs/probes/zoo_recipe_probe.py --steps 200 --ntest 1000 --tag paper-init        # the earlier profile
    python docs/probes/zoo_recipe_probe.py --steps 200 --ntest 1000 --pos 30 --pad 0
    python docs/probes/zoo_recipe_probe.py --steps 400 --bs 50 --ntest 1000 --pos 30 --pad 0
    python docs/probes/zoo_recipe_probe.py --steps 200 --ntest 1000 --kw '{"pos_init": "conv"}'
    python docs/probes/zoo_recipe_probe.py --steps 200 --ntest 1000 --model resnet18_cifar --pad 0
"""
import argparse
import json
import time
from functools import partial

import timm
import torch
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2

import sa_vision  # noqa: F401  registers the models
from sa_vision.models.param_groups import param_groups_pos_lr
from sa_vision.train.data import create_image_dataset


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument('--model', default='sa_quadratic_cifar')
    p.add_argument('--kw', default='{}', help='extra model kwargs as JSON')
    p.add_argument('--steps', type=int, default=300)
    p.add_argument('--bs', type=int, default=100)
    p.add_argument('--lr', type=float, default=2e-3)
    p.add_argument('--wd', type=float, default=0.05)
    p.add_argument('--pos', type=float, default=1.0, help='positional lr scale')
    p.add_argument('--pad', type=int, default=4, help='pad-and-crop padding, 0 for none')
    p.add_argument('--hflip', type=float, default=0.5)
    p.add_argument('--ntest', type=int, default=2000)
    p.add_argument('--tag', default='')
    a = p.parse_args()
    torch.manual_seed(0)
    is_sa = a.model.startswith('sa_')
    kw = (dict(embed_dim=64, mlp_hidden_dim=128, proj_drop_rate=0., attn_drop_rate=0.) if is_sa
          else dict(channels=(32, 64, 128, 256), stem_width=32))
    kw.update(json.loads(a.kw))
    model = timm.create_model(a.model, num_classes=10, **kw)
    group_fn = partial(param_groups_pos_lr, weight_decay=a.wd, pos_lr_scale=a.pos) if is_sa else None
    opt = create_optimizer_v2(model, 'adamw', lr=a.lr, weight_decay=a.wd, param_group_fn=group_fn)
    # the schedule counts steps as its epochs: 5 % linear warm-up, cosine to 0
    sched, _ = create_scheduler_v2(opt, 'cosine', num_epochs=a.steps, warmup_epochs=max(1, a.steps // 20),
                                   warmup_lr=0., min_lr=0.)
    train = create_image_dataset('fashion-mnist', 'train', True, crop_padding=a.pad, hflip=a.hflip)
    test = create_image_dataset('fashion-mnist', 'test', False)
    loader = torch.utils.data.DataLoader(train, batch_size=a.bs, shuffle=True, drop_last=True,
                                         generator=torch.Generator().manual_seed(0))
    initial = {n: q.detach().clone() for n, q in model.named_parameters() if n.endswith('position.centers')}
    step, start, losses = 0, time.time(), []
    sched.step(0)
    model.train()
    while step < a.steps:
        for x, y in loader:
            with torch.autocast('cpu', torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            sched.step(step)
            losses.append(loss.item())
            if step >= a.steps:
                break
    seconds = time.time() - start
    model.eval()
    correct = 0
    with torch.no_grad(), torch.autocast('cpu', torch.bfloat16):
        for i in range(0, a.ntest, 500):
            idx = range(i, min(i + 500, a.ntest))
            xs, ys = torch.stack([test[j][0] for j in idx]), torch.tensor([test[j][1] for j in idx])
            correct += (model(xs).argmax(1) == ys).sum().item()
    final = dict(model.named_parameters())
    shifts = [(final[n].detach() - c).norm(dim=-1).flatten() for n, c in initial.items()]
    shift = torch.cat(shifts).median().item() if shifts else 0.
    print(json.dumps(dict(tag=a.tag, model=a.model, kw=a.kw, steps=a.steps, bs=a.bs, lr=a.lr, pos=a.pos, pad=a.pad,
                          top1=round(100 * correct / a.ntest, 2), shift_median=round(shift, 3),
                          img_s=round(a.steps * a.bs / seconds, 1))))


if __name__ == '__main__':
    main()
