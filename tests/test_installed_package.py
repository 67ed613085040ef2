""" A non-editable install (``pip install --target``) is self-contained: a recipe given by name trains and the
export's model card is rendered from the card template installed as package data, not from the checkout. """
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import HANG_TIMEOUT_S

ROOT = Path(__file__).resolve().parent.parent
MARKER = 'Marker line written into the installed card template by test_installed_package.'


def _copy_sources(dst: Path) -> None:
    """The files of the checkout that git knows (tracked or not ignored), links kept as links; the build then
    writes its build/ and egg-info into the copy, not into the checkout."""
    proc = subprocess.run(['git', 'ls-files', '-co', '--exclude-standard', '-z'], cwd=ROOT, capture_output=True)
    if proc.returncode == 0:
        for name in filter(None, proc.stdout.decode().split('\0')):
            src = ROOT / name
            if not (src.exists() or src.is_symlink()):
                continue  # deleted in the working tree
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / name, follow_symlinks=False)
    else:  # not a git checkout
        shutil.copytree(ROOT, dst, symlinks=True, ignore=shutil.ignore_patterns(
            '.git', '__pycache__', '*.egg-info', 'build', 'dist', 'output', '.pytest_cache'))


@pytest.mark.slow
def test_installed_copy_trains_a_recipe_and_renders_its_packaged_card(tmp_path):
    src, site, out = tmp_path / 'src', tmp_path / 'site', tmp_path / 'out'
    src.mkdir()
    _copy_sources(src)
    env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'PYTHONHOME')}
    proc = subprocess.run(
        [sys.executable, '-m', 'pip', 'install', '--no-deps', '--no-build-isolation', '--no-index', '--quiet',
         '--target', str(site), str(src)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    package = site / 'sa_vision'
    assert not package.is_symlink() and (package / 'configs' / 'sa_quadratic_cifar_digits.yaml').is_file()
    assert (package / 'research' / 'explorer.html').is_file()  # the explorer's template is package data
    assert not list(site.rglob('*.safetensors')) and not (site / 'zoo').exists()  # the kept zoo stays out
    template = package / 'model_cards' / 'sa_quadratic_cifar.md'
    assert template.is_file() and not template.is_symlink()
    # a line only the installed template has: the export's card must come from it
    text = template.read_text(encoding='utf-8')
    template.write_text(text.replace('## Citation', f'{MARKER}\n\n## Citation'), encoding='utf-8')

    env = dict(env, PYTHONPATH=str(site), OMP_NUM_THREADS='1', HF_HUB_OFFLINE='1')
    where = subprocess.run([sys.executable, '-c', 'import sa_vision; print(sa_vision.__file__)'], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    assert where.stdout.strip() == str(package / '__init__.py'), where.stdout + where.stderr  # not the checkout
    run = subprocess.run(
        [sys.executable, '-m', 'sa_vision.cli.train', '-c', 'sa_quadratic_cifar_digits', '--epochs', '1',
         '--model-kwargs', 'embed_dim=16', 'depth=1', 'heads_per_layer=2', 'mlp_hidden_dim=32',
         '--experiment', 'run', '--output', str(out), '--export'],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    readme = (out / 'run' / 'hub' / 'README.md').read_text(encoding='utf-8')
    assert MARKER in readme
    assert '# sa_quadratic_cifar.digits_custom' in readme and 'Training summary' in readme
    assert MARKER not in (ROOT / 'sa_vision' / 'model_cards' / 'sa_quadratic_cifar.md').read_text(encoding='utf-8')
