""" Probe behind docs/performance.md, "2026-11-24: an Intel Xeon with AMX": where the narrow SA model's bf16 step goes

Not part of the package and not a test: the measurements of that section, rerunnable. Run from the repository root:

    python docs/probes/attention_layer_probe.py layer   # one attention + Value layer, five formulations
    python docs/probes/attention_layer_probe.py split   # the step with and without attention, and the ResNet
    python docs/probes/attention_layer_probe.py step [--compile]   # whole steps: separable against kron-mix
    python docs/probes/attention_layer_probe.py split-full   # the full-size model's step, with and without mixing
    python docs/probes/attention_layer_probe.py compile [BATCH]   # eager, compiled, compiled with max-autotune
    python docs/probes/attention_layer_probe.py products   # the mixing's matrix products alone
    python docs/probes/attention_layer_probe.py profiler   # what torch.profiler(record_shapes=True) does to a step

``layer`` times forward and backward of ``Value(attention(x))`` for one layer of the narrow model (embedding 64,
9 heads, 16x16 grid, batch 100, bf16), alternating the formulations, median of 5 rounds:

* ``separable``: what the library runs under autocast (``separable_mixing``, the heads concatenated, one GEMM);
* ``kron-mix``: every head's ``(h*w) x (h*w)`` probabilities built as the Kronecker product of its row and column
  probabilities, all heads mixed by one ``(heads*h*w, h*w)`` GEMM, then concatenated and projected;
* ``kron-project``: Value's per-head blocks applied first, then one ``(h*w, heads*h*w)`` GEMM mixes and sums
  the heads straight into the output layout;
* ``kron-function``: ``kron-project`` as a hand-written Function without its heads-sized transposition;
* ``chunked-N``: the separable products and Value run N samples at a time (all heads of a chunk mixed into
  Value's layout while they are in cache), with a hand-written backward that recomputes them.

All equal each other to bf16 rounding (printed). ``split`` replaces every layer's attention + Value by a
Linear of the same output to see what the rest of the step costs, and times the half-width ResNet18 beside it.
"""
import statistics
import sys
import time

import timm
import torch
import torch.nn.functional as F

import sa_vision  # noqa: F401  (registers the models)
import sa_vision.models.sa_cifar as sa_cifar
from sa_vision.layers.attention_autograd import separable_mixing
from sa_vision.train.runtime import retain_freed_memory

GRID, HEADS, DIM, BATCH = 16, 9, 64, 100
DTYPE = torch.bfloat16


class ChunkedMixProject(torch.autograd.Function):
    """``Value(separable mixing(x))`` for grid-major ``x`` (``h x w x B x D``), ``samples`` at a time."""

    @staticmethod
    def forward(ctx, x, row_probs, col_probs, weight, bias, samples):
        H, W, B, D = x.shape
        heads, out_features = row_probs.shape[0], weight.shape[0]
        all_rows = row_probs.reshape(heads * H, H)
        col_per_row = col_probs.repeat(1, H, 1).view(heads * H, W, W)
        out = x.new_empty(H, W, B, out_features)
        for start in range(0, B, samples):
            end = min(start + samples, B)
            b = end - start
            chunk = x[:, :, start:end].contiguous()
            rows = torch.mm(all_rows, chunk.view(H, W * b * D)).view(heads * H, W, b * D)
            mixed = torch.bmm(col_per_row, rows)  # (heads*h, w, b*D)
            # (heads, h*w*b, D) -> (h*w*b, heads*D): Value's layout
            concatenated = mixed.view(heads, H * W * b, D).transpose(0, 1).reshape(H * W * b, heads * D)
            out[:, :, start:end] = F.linear(concatenated, weight, bias).view(H, W, b, out_features)
        ctx.save_for_backward(x, all_rows, col_per_row, weight)
        ctx.samples, ctx.has_bias = samples, bias is not None
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, all_rows, col_per_row, weight = ctx.saved_tensors
        H, W, B, D = x.shape
        heads, out_features = all_rows.shape[0] // H, weight.shape[0]
        grad_x = x.new_empty(x.shape)
        grad_weight = torch.zeros(weight.shape)
        grad_rows = torch.zeros(heads * H, H)
        grad_cols = torch.zeros(heads, W, W)
        for start in range(0, B, ctx.samples):
            end = min(start + ctx.samples, B)
            b = end - start
            chunk = x[:, :, start:end].contiguous()
            rows = torch.mm(all_rows, chunk.view(H, W * b * D)).view(heads * H, W, b * D)
            mixed = torch.bmm(col_per_row, rows)
            concatenated = mixed.view(heads, H * W * b, D).transpose(0, 1).reshape(H * W * b, heads * D)
            grad_chunk = grad_out[:, :, start:end].reshape(H * W * b, out_features)
            grad_weight += torch.mm(grad_chunk.t(), concatenated)
            grad_mixed = torch.mm(grad_chunk, weight).view(H * W * b, heads, D).transpose(0, 1)
            grad_mixed = grad_mixed.reshape(heads * H, W, b * D)
            grad_cols += torch.bmm(grad_mixed, rows.transpose(1, 2)).view(heads, H, W, W).sum(1)
            grad_row_mixed = torch.bmm(col_per_row.transpose(1, 2), grad_mixed).view(heads * H, W * b * D)
            grad_rows += torch.mm(grad_row_mixed, chunk.view(H, W * b * D).t())
            grad_x[:, :, start:end] = torch.mm(all_rows.t(), grad_row_mixed).view(H, W, b, D)
        grad_bias = grad_out.reshape(-1, out_features).sum(0) if ctx.has_bias else None
        return (grad_x, grad_rows.view(heads, H, H).to(x.dtype), grad_cols.to(x.dtype),
                grad_weight.to(weight.dtype), grad_bias, None)


class KroneckerProject(torch.autograd.Function):
    """``kron-project`` by hand, with no heads-sized transposition: every head's Value block written into its slice
    of ``(heads, tokens, out)``, which is already the ``(heads*h*w, B*out)`` operand of the mixing GEMM, whose
    output is grid-major; backward by hand, float32 accumulation of the input gradient over the heads."""

    @staticmethod
    def forward(ctx, x, probs, weight, bias):
        H, W, B, D = x.shape
        heads, out_features, tokens = weight.shape[1] // D, weight.shape[0], H * W * B
        projected = x.new_empty(heads, tokens, out_features)
        for n in range(heads):
            torch.mm(x.reshape(tokens, D), weight[:, n * D:(n + 1) * D].t(), out=projected[n])
        out = torch.mm(probs, projected.view(heads * H * W, B * out_features)).view(tokens, out_features)
        ctx.save_for_backward(x, probs, weight, projected)
        return out + bias

    @staticmethod
    def backward(ctx, grad_out):
        x, probs, weight, projected = ctx.saved_tensors
        H, W, B, D = x.shape
        heads, out_features, tokens = weight.shape[1] // D, weight.shape[0], H * W * B
        grid_grad = grad_out.reshape(H * W, B * out_features)
        grad_projected = torch.mm(probs.t(), grid_grad).view(heads, tokens, out_features)
        grad_probs = torch.mm(grid_grad, projected.view(heads * H * W, B * out_features).t())
        grad_x = torch.zeros(tokens, D)
        grad_weight = weight.new_empty(weight.shape)
        for n in range(heads):
            grad_x += torch.mm(grad_projected[n], weight[:, n * D:(n + 1) * D])
            grad_weight[:, n * D:(n + 1) * D] = torch.mm(grad_projected[n].t(), x.reshape(tokens, D))
        return (grad_x.to(x.dtype).view(H, W, B, D), grad_probs, grad_weight,
                grad_out.reshape(tokens, out_features).sum(0))


def kronecker(row_probs, col_probs):
    """``P[(i, j), n, (k, l)] = row[n, i, k] * col[n, j, l]``: ``(h*w, heads, h*w)``."""
    H, W = row_probs.shape[1], col_probs.shape[1]
    return torch.einsum('nik,njl->ijnkl', row_probs, col_probs).reshape(H * W, -1, H * W)


def layer_variants(x, row_probs, col_probs, weight, bias):
    H, W, B, D = x.shape
    heads, out_features = row_probs.shape[0], weight.shape[0]

    def separable():
        mixed = separable_mixing(x.to(DTYPE), row_probs.to(DTYPE), col_probs.to(DTYPE))
        return F.linear(mixed.movedim(0, -2).reshape(-1, heads * D), weight.to(DTYPE), bias.to(DTYPE))

    def kron_mix():
        probs = kronecker(row_probs, col_probs).reshape(H * W * heads, H * W)
        with torch.autocast('cpu', dtype=DTYPE):
            mixed = probs @ x.reshape(H * W, B * D)  # (h*w, heads, B, D)
            concatenated = mixed.view(H * W, heads, B, D).transpose(1, 2).reshape(H * W * B, heads * D)
            return F.linear(concatenated, weight, bias)

    def kron_project():
        probs = kronecker(row_probs, col_probs).reshape(H * W, heads * H * W)
        with torch.autocast('cpu', dtype=DTYPE):
            blocks = weight.view(out_features, heads, D).permute(2, 1, 0).reshape(D, heads * out_features)
            projected = (x.reshape(H * W * B, D) @ blocks).view(H * W, B, heads, out_features)
            projected = projected.permute(2, 0, 1, 3).reshape(heads * H * W, B * out_features)
            return (probs @ projected).view(-1, out_features) + bias

    def kron_function():
        probs = kronecker(row_probs, col_probs).reshape(H * W, heads * H * W)
        return KroneckerProject.apply(x.to(DTYPE), probs.to(DTYPE), weight.to(DTYPE), bias.to(DTYPE))

    def chunked(samples):
        return lambda: ChunkedMixProject.apply(x.to(DTYPE), row_probs.to(DTYPE), col_probs.to(DTYPE),
                                               weight.to(DTYPE), bias.to(DTYPE), samples)

    return {'separable': separable, 'kron-mix': kron_mix, 'kron-project': kron_project, 'kron-function': kron_function,
            'chunked-5': chunked(5), 'chunked-10': chunked(10), 'chunked-25': chunked(25)}


def probe_layer(rounds: int = 5) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(GRID, GRID, BATCH, DIM, generator=gen).requires_grad_()
    row_probs = torch.randn(HEADS, GRID, GRID, generator=gen).softmax(-1).requires_grad_()
    col_probs = torch.randn(HEADS, GRID, GRID, generator=gen).softmax(-1).requires_grad_()
    weight = (torch.randn(DIM, HEADS * DIM, generator=gen) / 24).requires_grad_()
    bias = torch.randn(DIM, generator=gen).requires_grad_()
    grad_out = torch.randn(GRID * GRID * BATCH, DIM, generator=gen)
    leaves = (x, row_probs, col_probs, weight, bias)
    variants = layer_variants(*leaves)

    def run(fn):
        start = time.perf_counter()
        out = fn().reshape(-1, DIM)
        middle = time.perf_counter()
        out.backward(grad_out.to(out.dtype))
        grads = [leaf.grad for leaf in leaves]
        for leaf in leaves:
            leaf.grad = None
        return middle - start, time.perf_counter() - middle, out.float(), grads

    *_, reference_out, reference_grads = run(variants['separable'])
    for name, fn in variants.items():
        *_, out, grads = run(fn)
        run(fn)
        errors = [(a - b).norm() / b.norm() for a, b in zip([out, *grads], [reference_out, *reference_grads])]
        print(f'{name}: relative difference to separable (out, x, rows, cols, weight, bias): '
              + ' '.join(f'{e:.1e}' for e in errors))
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            times[name].append(run(fn)[:2])
    for name, pairs in times.items():
        forward = statistics.median(t[0] for t in pairs) * 1e3
        backward = statistics.median(t[1] for t in pairs) * 1e3
        print(f'{name:>13}: forward {forward:5.1f} ms  backward {backward:5.1f} ms  total {forward + backward:5.1f} ms')


def probe_split(rounds: int = 4, steps: int = 3) -> None:
    narrow = dict(num_classes=10, embed_dim=DIM, mlp_hidden_dim=2 * DIM, proj_drop_rate=0., attn_drop_rate=0.)
    models = {'narrow SA': timm.create_model('sa_quadratic_cifar', **narrow),
              'narrow SA, attention + Value replaced by a Linear': timm.create_model('sa_quadratic_cifar', **narrow),
              'half-width ResNet18': timm.create_model('resnet18_cifar', num_classes=10, channels=(32, 64, 128, 256),
                                                        stem_width=32)}
    real_attend_then_project = sa_cifar.attend_then_project

    def linear_instead(attn, value, x):
        return F.linear(x, value.weight[:, :x.shape[-1]])

    gen = torch.Generator().manual_seed(0)
    images, targets = torch.randn(BATCH, 3, 32, 32, generator=gen), torch.randint(0, 10, (BATCH,), generator=gen)

    def step(name, model, optimizer):
        sa_cifar.attend_then_project = linear_instead if 'replaced' in name else real_attend_then_project
        with torch.autocast('cpu', dtype=DTYPE):
            loss = F.cross_entropy(model(images), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    optimizers = {name: torch.optim.SGD(model.parameters(), lr=0.01) for name, model in models.items()}
    for name, model in models.items():
        for _ in range(2):
            step(name, model, optimizers[name])
    times = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            start = time.perf_counter()
            for _ in range(steps):
                step(name, model, optimizers[name])
            times[name].append((time.perf_counter() - start) / steps * 1e3)
    sa_cifar.attend_then_project = real_attend_then_project
    for name, values in times.items():
        print(f'{name}: {statistics.median(values):.0f} ms per step of {BATCH} (rounds '
              + ' '.join(f'{v:.0f}' for v in values) + ')')


def probe_split_full(rounds: int = 3, steps: int = 2, batch: int = 32) -> None:
    """The full-size ``sa_quadratic_cifar``'s bf16 training step (forward and backward) at batch 32 as it is, with
    Value applied to every head's unmixed input (Value's GEMM and its concatenated input kept, the mixing removed),
    and with attention + Value replaced by a Linear of the same output, alternating."""
    def value_without_mixing(attn, value, x):
        H, W, B, D = x.shape
        heads = value.in_features // D
        concatenated = x.unsqueeze(-2).expand(H, W, B, heads, D).reshape(H, W, B, heads * D)
        return F.linear(concatenated, value.weight, value.bias)

    def linear_instead(attn, value, x):
        return F.linear(x, value.weight[:, :x.shape[-1]])

    variants = {'as it is': sa_cifar.attend_then_project, 'Value without the mixing': value_without_mixing,
                'attention + Value replaced by a Linear': linear_instead}
    real_attend_then_project = sa_cifar.attend_then_project
    model = timm.create_model('sa_quadratic_cifar', num_classes=10, proj_drop_rate=0., attn_drop_rate=0.)
    gen = torch.Generator().manual_seed(0)
    images, targets = torch.randn(batch, 3, 32, 32, generator=gen), torch.randint(0, 10, (batch,), generator=gen)

    def step(attend_then_project):
        sa_cifar.attend_then_project = attend_then_project
        with torch.autocast('cpu', dtype=DTYPE):
            loss = F.cross_entropy(model(images), targets)
        loss.backward()
        model.zero_grad(set_to_none=True)

    for variant in variants.values():
        step(variant)
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, variant in variants.items():
            start = time.perf_counter()
            for _ in range(steps):
                step(variant)
            times[name].append((time.perf_counter() - start) / steps * 1e3)
    sa_cifar.attend_then_project = real_attend_then_project
    for name, values in times.items():
        print(f'full size, {name}: {statistics.median(values):.0f} ms per forward + backward of {batch}')


def probe_step(compiled: bool, rounds: int = 6, steps: int = 3, batch: int = 50) -> None:
    """Whole training steps of the narrow model, the library's separable path against ``kron-mix`` in every layer
    (same initial weights, alternating), bf16, eager or both compiled."""
    import copy

    real_attend_then_project = sa_cifar.attend_then_project

    def kron_mix(attn, value, x):
        H, W, B, D = x.shape
        row_probs, col_probs = attn.mixing_probs(H, W)
        heads = row_probs.shape[0]
        probs = kronecker(row_probs, col_probs).reshape(H * W * heads, H * W)
        mixed = (probs @ x.reshape(H * W, B * D)).view(H * W, heads, B, D).transpose(1, 2)
        return F.linear(mixed.reshape(H * W * B, heads * D), value.weight, value.bias).view(H, W, B, -1)

    narrow = dict(num_classes=10, embed_dim=DIM, mlp_hidden_dim=2 * DIM, proj_drop_rate=0., attn_drop_rate=0.)
    model = timm.create_model('sa_quadratic_cifar', **narrow)
    gen = torch.Generator().manual_seed(0)
    images, targets = torch.randn(batch, 3, 32, 32, generator=gen), torch.randint(0, 10, (batch,), generator=gen)

    def make_step(net, attend_then_project):
        optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
        run = torch.compile(net) if compiled else net

        def step():
            sa_cifar.attend_then_project = attend_then_project
            with torch.autocast('cpu', dtype=DTYPE):
                loss = F.cross_entropy(run(images), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return step

    variants = {'separable': make_step(model, real_attend_then_project),
                'kron-mix': make_step(copy.deepcopy(model), kron_mix)}
    for step in variants.values():
        for _ in range(3):
            step()
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, step in variants.items():
            start = time.perf_counter()
            for _ in range(steps):
                step()
            times[name].append((time.perf_counter() - start) / steps * 1e3)
    sa_cifar.attend_then_project = real_attend_then_project
    ratios = [a / b for a, b in zip(times['separable'], times['kron-mix'])]
    print(f'{"compiled" if compiled else "eager"}, batch {batch}: separable '
          f'{statistics.median(times["separable"]):.0f} ms, kron-mix {statistics.median(times["kron-mix"]):.0f} ms '
          f'per step; kron-mix {statistics.median(ratios):.3f}x as fast (rounds '
          + ' '.join(f'{r:.2f}' for r in ratios) + ')')


def narrow_training_step(model, batch: int):
    """A bf16 training step of ``model`` (a callable) on a fixed random batch, SGD, as the benchmark times it."""
    gen = torch.Generator().manual_seed(0)
    images, targets = torch.randn(batch, 3, 32, 32, generator=gen), torch.randint(0, 10, (batch,), generator=gen)
    module = getattr(model, '_orig_mod', model)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01)

    def step():
        with torch.autocast('cpu', dtype=DTYPE):
            loss = F.cross_entropy(model(images), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def probe_compile(batch: int, rounds: int = 4, steps: int = 3) -> None:
    """The narrow model's bf16 training step eager, compiled (inductor) and compiled with mode='max-autotune',
    alternating (three copies of the same initial weights); compile times included in the printout."""
    import copy

    narrow = dict(num_classes=10, embed_dim=DIM, mlp_hidden_dim=2 * DIM, proj_drop_rate=0., attn_drop_rate=0.)
    model = timm.create_model('sa_quadratic_cifar', **narrow)
    variants = {'eager': narrow_training_step(model, batch),
                'compiled': narrow_training_step(torch.compile(copy.deepcopy(model)), batch),
                'max-autotune': narrow_training_step(torch.compile(copy.deepcopy(model), mode='max-autotune'), batch)}
    for name, step in variants.items():
        start = time.perf_counter()
        for _ in range(2):
            step()
        print(f'{name}: first two steps (compilation included) {time.perf_counter() - start:.1f} s')
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, step in variants.items():
            start = time.perf_counter()
            for _ in range(steps):
                step()
            times[name].append((time.perf_counter() - start) / steps * 1e3)
    for name, values in times.items():
        print(f'{name}, batch {batch}: {statistics.median(values):.0f} ms per step (rounds '
              + ' '.join(f'{v:.0f}' for v in values) + ')')


def probe_products(iters: int = 10) -> None:
    """The matrix products of one narrow layer's mixing alone, bf16, outputs written into reused buffers: the two
    K = 16 products over the grid side (as the separable path runs them, and the row product in the tall
    orientation) against the Kronecker form's K = 256 GEMM and Value's GEMM."""
    H, B, D, heads = GRID, BATCH, DIM, HEADS
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(DTYPE)
    x, rows_probs, cols = rand(H, H * B * D), rand(heads * H, H), rand(heads * H, H, H)
    row_out, col_out = rand(heads * H, H * B * D), rand(heads * H, H, B * D)
    tall_x, tall_probs, tall_out = rand(H * B * D, H), rand(H, heads * H), rand(H * B * D, heads * H)
    kron, grid_x, kron_out = rand(heads * H * H, H * H), rand(H * H, B * D), rand(heads * H * H, B * D)
    concatenated, value, value_out = rand(H * H * B, heads * D), rand(heads * D, D), rand(H * H * B, D)
    products = {
        'row mixing (144, 16) @ (16, 102400)':
            (lambda: torch.mm(rows_probs, x, out=row_out), heads * H * H * H * B * D),
        'column mixing bmm (144, 16, 16) @ (144, 16, 6400)':
            (lambda: torch.bmm(cols, row_out.view(heads * H, H, B * D), out=col_out), heads * H * H * H * B * D),
        'row mixing, tall (102400, 16) @ (16, 144)':
            (lambda: torch.mm(tall_x, tall_probs, out=tall_out), heads * H * H * H * B * D),
        'Kronecker mixing (2304, 256) @ (256, 6400)':
            (lambda: torch.mm(kron, grid_x, out=kron_out), heads * H ** 4 * B * D),
        'Value (25600, 576) @ (576, 64)':
            (lambda: torch.mm(concatenated, value, out=value_out), H * H * B * heads * D * D),
    }
    for name, (product, macs) in products.items():
        for _ in range(2):
            product()
        start = time.perf_counter()
        for _ in range(iters):
            product()
        seconds = (time.perf_counter() - start) / iters
        print(f'{name}: {seconds * 1e3:.2f} ms, {2 * macs / seconds / 1e9:,.0f} GFLOP/s')


def probe_profiler(batch: int = BATCH) -> None:
    """One narrow bf16 training step timed plainly and under torch.profiler(record_shapes=True): the profiler's
    own effect on the step, and the K = 16 column product's time as the profiler reports it."""
    from torch.profiler import profile

    narrow = dict(num_classes=10, embed_dim=DIM, mlp_hidden_dim=2 * DIM, proj_drop_rate=0., attn_drop_rate=0.)
    step = narrow_training_step(timm.create_model('sa_quadratic_cifar', **narrow), batch)
    for _ in range(3):
        step()
    start = time.perf_counter()
    for _ in range(3):
        step()
    print(f'plain: {(time.perf_counter() - start) / 3 * 1e3:.0f} ms per step')
    start = time.perf_counter()
    with profile(record_shapes=True) as prof:
        step()
    print(f'under the profiler: {(time.perf_counter() - start) * 1e3:.0f} ms for the step')
    for event in prof.key_averages(group_by_input_shape=True):
        if event.key == 'aten::bmm' and event.input_shapes and event.input_shapes[0] == [HEADS * GRID, GRID, GRID]:
            print(f'  aten::bmm {event.input_shapes}: {event.self_cpu_time_total / event.count / 1e3:.1f} ms per call '
                  f'({event.count} calls)')


if __name__ == '__main__':
    retain_freed_memory()
    torch.set_num_threads(2)
    mode = sys.argv[1] if len(sys.argv) > 1 else 'layer'
    if mode == 'step':
        probe_step(compiled='--compile' in sys.argv)
    elif mode == 'compile':
        probe_compile(int(sys.argv[2]) if len(sys.argv) > 2 else 50)
    else:
        {'layer': probe_layer, 'split': probe_split, 'split-full': probe_split_full, 'products': probe_products,
         'profiler': probe_profiler}[mode]()
