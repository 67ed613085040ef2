""" The docs as tests: every relative link resolves, and every block marked runnable runs

A shell or Python block of README.md or docs/*.md is run when the line right above its fence is
``<!-- runnable -->``: each in a fresh temporary working folder, offline (``HF_HUB_OFFLINE=1``), on one thread
(``OMP_NUM_THREADS=1``), with ``bash -e`` or this Python; it must exit with status 0. The folder holds a link to the
repository's ``zoo/``, as a clone's root does, so that blocks can load the kept models as the docs tell users to.
Links and images are checked against the files of the repository (and ``#anchors`` against the headings of the
page they point to, as GitHub makes them), skipping http(s) and mailto.
"""
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / 'README.md', ROOT / 'CONTRIBUTING.md', *sorted((ROOT / 'docs').glob('*.md'))]
RUNNABLE_PAGES = [ROOT / 'README.md', *sorted((ROOT / 'docs').glob('*.md'))]
MARKER = '<!-- runnable -->'
LANGUAGES = {'bash': 'bash', 'sh': 'bash', 'python': 'python'}
TIMEOUT_S = 600

LINK = re.compile(r'\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')  # [text](target), ![alt](target), [![..](..)](..)
CODE_SPAN = re.compile(r'(`+)(?:(?!\1).)+?\1')


class Block(NamedTuple):
    page: str      # path relative to the repository
    line: int      # line of the opening fence, 1-based
    language: str  # 'bash' or 'python'
    code: str


def _fences(lines):
    """Yield (index, is_opening, info string) of every fence line ```...; text in between is code."""
    inside = False
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith('```'):
            yield i, not inside, stripped[3:].strip()
            inside = not inside


def _prose_lines(lines):
    """The lines outside fenced code, with their indices."""
    code = set()
    opening = None
    for i, is_opening, _ in _fences(lines):
        if is_opening:
            opening = i
        else:
            code.update(range(opening, i + 1))
    return [(i, line) for i, line in enumerate(lines) if i not in code]


def runnable_blocks(pages=RUNNABLE_PAGES):
    blocks = []
    for page in pages:
        lines = page.read_text(encoding='utf-8').splitlines()
        rel = page.relative_to(ROOT).as_posix()
        openings = {}
        for i, is_opening, info in _fences(lines):
            if is_opening:
                openings[i] = info
                start = i
            elif start - 1 >= 0 and lines[start - 1].strip() == MARKER:
                language = LANGUAGES.get(openings[start].split()[0] if openings[start] else '')
                blocks.append(Block(rel, start + 1, language, '\n'.join(lines[start + 1:i]) + '\n'))
    return blocks


def markers_not_on_a_block(pages=RUNNABLE_PAGES):
    """'page:line' of every marker that is not directly above a bash or python fence."""
    bad = []
    for page in pages:
        lines = page.read_text(encoding='utf-8').splitlines()
        for i, line in enumerate(lines):
            if line.strip() == MARKER:
                following = lines[i + 1].strip() if i + 1 < len(lines) else ''
                if not (following.startswith('```') and following[3:].strip() in LANGUAGES):
                    bad.append(f'{page.relative_to(ROOT).as_posix()}:{i + 1}')
    return bad


def github_anchors(page: Path) -> set:
    """The #anchors GitHub gives the headings of a page: lower case, punctuation dropped, spaces to '-'."""
    anchors, seen = set(), {}
    for _, line in _prose_lines(page.read_text(encoding='utf-8').splitlines()):
        match = re.match(r'#{1,6}\s+(.*?)\s*#*\s*$', line)
        if not match:
            continue
        slug = re.sub(r'[^\w\- ]', '', match.group(1).lower()).replace(' ', '-')
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f'{slug}-{n}')
    return anchors


def links(page: Path):
    """(line, target) of every link and image of the page's prose (not in code blocks or code spans)."""
    for i, line in _prose_lines(page.read_text(encoding='utf-8').splitlines()):
        for match in LINK.finditer(CODE_SPAN.sub('', line)):
            yield i + 1, match.group(1)


def broken_links(pages=PAGES):
    """'page:line: target (why)' of every relative link whose file or anchor is missing."""
    broken = []
    for page in pages:
        rel = page.relative_to(ROOT).as_posix()
        for line, target in links(page):
            if re.match(r'(https?|mailto):', target):
                continue
            path, _, anchor = target.partition('#')
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f'{rel}:{line}: {target} (no such file)')
            elif anchor and file.suffix == '.md' and anchor not in github_anchors(file):
                broken.append(f'{rel}:{line}: {target} (no heading with this anchor)')
    return broken


def test_relative_links_and_images_point_to_existing_files():
    broken = broken_links()
    assert not broken, 'broken links:\n' + '\n'.join(broken)


def test_link_checker_sees_a_broken_link_and_anchor(tmp_path, monkeypatch):
    """The checker itself: a missing file and a missing anchor are reported, good ones are not."""
    monkeypatch.setattr(sys.modules[__name__], 'ROOT', tmp_path)
    (tmp_path / 'docs').mkdir()
    (tmp_path / 'docs' / 'a.md').write_text('# A page\n\n## `pretrained=True` without a network\n')
    page = tmp_path / 'README.md'
    page.write_text('[ok](docs/a.md#pretrainedtrue-without-a-network) ![no](docs/img/none.png)\n'
                    '[bad anchor](docs/a.md#nothing) `[code](not/checked)` [web](https://example.org/x)\n'
                    '```bash\n[in code](not/checked/either)\n```\n')
    broken = broken_links([page])
    assert broken == ['README.md:1: docs/img/none.png (no such file)',
                      'README.md:2: docs/a.md#nothing (no heading with this anchor)'], broken


def test_runnable_markers_sit_on_bash_or_python_blocks():
    assert not markers_not_on_a_block(), f'{MARKER} not directly above a ```bash or ```python fence'
    assert runnable_blocks(), 'no runnable block found'


@pytest.mark.slow
@pytest.mark.parametrize('block', runnable_blocks(), ids=lambda b: f'{b.page}:{b.line}')
def test_runnable_block(block, tmp_path):
    work = tmp_path / 'work'
    work.mkdir()
    (work / 'zoo').symlink_to(ROOT / 'zoo', target_is_directory=True)
    script = tmp_path / ('block.sh' if block.language == 'bash' else 'block.py')
    script.write_text(block.code, encoding='utf-8')
    command = ['bash', '-e', str(script)] if block.language == 'bash' else [sys.executable, str(script)]
    env = dict(os.environ, HF_HUB_OFFLINE='1', OMP_NUM_THREADS='1', MPLBACKEND='Agg')
    # `python` and the installed sa-vision-* commands of the interpreter running the tests come first
    env['PATH'] = os.pathsep.join([str(Path(sys.executable).parent), env.get('PATH', '')])
    try:
        result = subprocess.run(command, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        output = e.stdout.decode(errors='replace') if isinstance(e.stdout, bytes) else (e.stdout or '')
        pytest.fail(f'{block.page}:{block.line} ran past {TIMEOUT_S} s\n--- block ---\n{block.code}'
                    f'--- output ---\n{output}')
    if result.returncode != 0:
        pytest.fail(f'{block.page}:{block.line} exited with status {result.returncode}\n--- block ---\n'
                    f'{block.code}--- output ---\n{result.stdout}')
