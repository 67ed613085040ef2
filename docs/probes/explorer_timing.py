""" The explorer page's speed in headless Chromium (docs/reproduction.md, "The attention explorer"): the time from
navigation start to the first maps drawn, and the time per query update (every head's probabilities computed and
its heat map drawn). A measuring script, not a library part; it needs chromium, chromium-driver and selenium.

    python docs/probes/explorer_timing.py                       # the zoo's four attention architectures, at random
    python docs/probes/explorer_timing.py docs/explorer/index.html
"""
import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'tests'))  # the page tests' browser set-up

from browser import chromium_driver, open_page  # noqa: E402

NARROW = dict(embed_dim=64, mlp_hidden_dim=128)  # the cpu profile's attention models: 6 layers x 9 heads


def _zoo_like_page(out: Path) -> Path:
    import timm

    import sa_vision  # noqa: F401  registers the models
    from sa_vision.research.explorer import ExplorerModel, write_explorer
    models = [ExplorerModel(name, timm.create_model(name, **NARROW).eval(), 'fashion-mnist')
              for name in ('sa_quadratic_cifar', 'sa_gen_cifar', 'sa_gen_pruned', 'sa_learned_cifar')]
    return write_explorer(models, out, num_images=24)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('page', nargs='?', help='an explorer page (default: one of the zoo architectures at random)')
    parser.add_argument('--loads', type=int, default=5, help='page loads (the first-maps time of each)')
    parser.add_argument('--updates', type=int, default=256, help='query updates timed per model and load')
    args = parser.parse_args()
    page = Path(args.page) if args.page else _zoo_like_page(Path(tempfile.mkdtemp()) / 'page.html')
    driver = chromium_driver()
    first, update = [], {}
    try:
        for _ in range(args.loads):
            open_page(driver, page)
            first.append(driver.execute_script('return saExplorer.firstMapsMs'))
            for index, model in enumerate(driver.execute_script('return saExplorer.models()')):
                driver.execute_script(f'saExplorer.setModel({index})')
                ms = driver.execute_script(f'return saExplorer.timeUpdates({args.updates})')
                update.setdefault(f'{model["name"]} ({sum(model["heads"])} heads)', []).append(ms)
        version = driver.capabilities.get('browserVersion')
    finally:
        driver.quit()
    print(f'{page} ({page.stat().st_size / 1e6:.2f} MB), headless Chromium {version}, {args.loads} loads')
    print(f'navigation start to first maps: median {statistics.median(first):.0f} ms '
          f'(min {min(first):.0f}, max {max(first):.0f})')
    for name, times in update.items():
        print(f'query update, {name}: median {statistics.median(times):.2f} ms (min {min(times):.2f}, '
              f'max {max(times):.2f}) over {args.updates} queries per load')


if __name__ == '__main__':
    main()
