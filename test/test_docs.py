"""
README.md and docs/: every relative link and anchor resolves; the front page stays short.

Every docs page is reachable from the front page. Anchors follow GitHub's rule for headings: the
heading's text (inline code and links reduced to their text), lower-cased, every character that is
not a letter, digit, space, ``-`` or ``_`` dropped, spaces turned into ``-``; a repeated slug gets
``-1``, ``-2``, ... Links inside code blocks and inline code are not links. External
(``http``/``https``/``mailto``) links are not fetched: CI has no network to check them with.
"""

from pathlib import Path
import re

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_BYTES = 12 * 1024
_LINK = re.compile(r'!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+(?:\([^()]*\))?)(?:\s+"[^"]*")?\)')
_CODE_SPAN = re.compile(r'`+[^`]*`+')


def _doc_files() -> list[Path]:
    return [ROOT / 'README.md', *sorted((ROOT / 'docs').glob('*.md'))]


def _prose_lines(text: str):
    """Yield (line number, line) outside fenced code blocks, inline code removed."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith('```'):
            fenced = not fenced
            continue
        if not fenced:
            yield number, _CODE_SPAN.sub('', line)


def slug(heading: str) -> str:
    """Return GitHub's anchor for a heading's text (before de-duplication)."""
    text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', heading)  # links -> their text
    text = text.replace('`', '').strip().lower()
    text = ''.join(c for c in text if c.isalnum() or c in ' -_')
    return text.replace(' ', '-')


def anchors(text: str) -> set[str]:
    """Return every heading anchor of a Markdown text."""
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith('```'):
            fenced = not fenced
        if fenced or not re.match(r'#{1,6} ', line):
            continue
        base = slug(line.lstrip('#'))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f'{base}-{count}')
    return found


def broken_links(path: Path) -> list[str]:
    """Return ``'file:line: target (why)'`` for each relative link of ``path`` that fails."""
    text = path.read_text()
    problems = []
    for number, line in _prose_lines(text):
        for target in _LINK.findall(line):
            if re.match(r'[a-z]+:', target):
                continue
            file_part, _, anchor = target.partition('#')
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f'{path.relative_to(ROOT)}:{number}: {target}'
            if not dest.exists():
                problems.append(f'{where} (no such file)')
            elif anchor and dest.suffix == '.md' and anchor not in anchors(dest.read_text()):
                problems.append(f'{where} (no heading #{anchor} in {dest.name})')
    return problems


@pytest.mark.parametrize('path', _doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(path):
    assert broken_links(path) == []


def test_the_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path, monkeypatch):
    monkeypatch.setattr(f'{__name__}.ROOT', tmp_path)
    (tmp_path / 'other.md').write_text('# Other page\n\n## Tools, and more: `x`\n')
    page = tmp_path / 'page.md'
    page.write_text('# Page\n\n[ok](other.md#tools-and-more-x) [self](#page) '
                    '[gone](missing.md) [bad anchor](other.md#nope) `[code](nope.md)`\n'
                    '```\n[in a block](nope.md)\n```\n[web](https://example.org/x)\n')
    assert broken_links(page) == ['page.md:3: missing.md (no such file)',
                                  'page.md:3: other.md#nope (no heading #nope in other.md)']


def test_slugs_follow_github():
    assert slug(' Overload: a flood of questions on `~/ask`') == \
        'overload-a-flood-of-questions-on-ask'
    assert slug(' GPU, TensorRT') == 'gpu-tensorrt'
    assert anchors('# A\n## A\n```\n# B\n```\n') == {'a', 'a-1'}


def test_readme_is_a_short_front_page():
    readme = (ROOT / 'README.md').read_text()
    assert len(readme.encode()) <= README_MAX_BYTES
    assert readme.index('make demo') < readme.index('make test') < 1500


def test_every_docs_page_is_linked_from_the_readme():
    readme = (ROOT / 'README.md').read_text()
    linked = {Path(t.partition('#')[0]).name for t in _LINK.findall(readme)}
    pages = {p.name for p in (ROOT / 'docs').glob('*.md')}
    assert pages - linked == set()
