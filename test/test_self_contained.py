"""
The repository explains itself: what its code, tests and docs cite, a reader can open.

A citation names a page of this repository's docs (``docs/model.md#flow-matching``), an upstream
source file (openpi ``src/openpi/models/pi0.py``) or a paper; never notes kept outside the
repository, and never one of this project's own issue numbers (a reader has neither). Upstream
issues stay citable as URLs or ``owner/repo#N``. Every ``docs/<page>.md`` cited from a file
exists, and so does every ``#anchor`` after it (GitHub's heading slugs, as ``test_docs`` builds
them). The patterns below are built from pieces so that this file does not match them.
"""

from pathlib import Path
import re

from test_docs import anchors

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ('oxygen_ros', 'test', 'launch', 'docs', 'config', '.ci', 'README.md', 'Makefile',
           'setup.py', 'package.xml')
_SECTION = '\N{SECTION SIGN}'
_NOTES = ('style', 'ros2-from-pypi', 'sim-from-pypi')
_OUTSIDE = re.compile('|'.join((
    r'\bspec(?:\'s)? ' + _SECTION,                  # the private model notes, by section
    r'\barchitecture(?:\.md)? ' + _SECTION,
    r'\b' + 'pi05' + r'-spec\b',
    r'\b' + 'architecture' + r'\.md\b',
    r'\.\./' + r'shared\b',
    r'\bshared/(?:' + 'design|gpu|hooks' + r')\b',
    r'\b(?:' + '|'.join(_NOTES) + r')\.md\b',
    r'\bdesign' + r' notes\b',
    r'\b[Ii]ssues?' + r' #?\d+',                    # this project's issues, by number
    r'\b(?:PR|[Pp]ull request)' + r' #?\d+',
    r'(?<![\w/&#])#' + r'\d+\b',
)))
_URL = re.compile(r'https?://\S+')
_DOCS_CITATION = re.compile(r'\bdocs/([\w./-]+?\.md)(?:#([^\s`\'"),;]+))?')


def _texts() -> list[tuple[str, str]]:
    """Return ``(path, text)`` of every scanned text file (figures and binaries skipped)."""
    out = []
    for name in SCANNED:
        top = ROOT / name
        files = sorted(p for p in top.rglob('*') if p.is_file()) if top.is_dir() else [top]
        for path in files:
            if not path.exists() or '__pycache__' in path.parts:
                continue
            try:
                out.append((str(path.relative_to(ROOT)), path.read_text(encoding='utf-8')))
            except UnicodeDecodeError:
                continue
    return out


def outside_references(text: str) -> list[str]:
    """Return ``'line: match'`` for each reference to notes or issues a reader cannot open."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in _OUTSIDE.finditer(_URL.sub('<url>', line)):
            found.append(f'{number}: {match.group(0)}')
    return found


def broken_docs_citations(text: str) -> list[str]:
    """Return ``'line: docs/<page>.md#<anchor> (why)'`` for each missing cited page or anchor."""
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        for page, anchor in _DOCS_CITATION.findall(line):
            anchor = anchor.rstrip('.:')
            dest = ROOT / 'docs' / page
            cited = f'{number}: docs/{page}' + (f'#{anchor}' if anchor else '')
            if not dest.is_file():
                problems.append(f'{cited} (no such page)')
            elif anchor and anchor not in anchors(dest.read_text()):
                problems.append(f'{cited} (no such heading)')
    return problems


def test_nothing_refers_to_notes_or_issues_outside_the_repository():
    found = [f'{path}:{hit}' for path, text in _texts() for hit in outside_references(text)]
    assert found == []


def test_every_cited_docs_page_and_anchor_exists():
    found = [f'{path}:{hit}' for path, text in _texts() for hit in broken_docs_citations(text)]
    assert found == []


def test_the_patterns_find_what_a_reader_cannot_open():
    sect = _SECTION
    cited = [f'spec {sect}', f"spec's {sect}", f'architecture {sect}', 'pi05' + '-spec',
             'architecture' + '.md', '../' + 'shared', 'shared/' + 'design', 'style' + '.md',
             'design' + ' notes', 'Issue' + ' 18', 'issues #' + '3', '#' + '22', 'PR #' + '4']
    lines = [f'(spec {sect}1.3)', f"the spec's {sect}5 figures", f'(architecture {sect}1)',
             'see ' + 'pi05' + '-spec.md', 'architecture' + '.md', '../' + 'shared' + '/gpu',
             'in shared/' + 'design/', 'style' + '.md', "the project's design" + ' notes',
             'Issue' + ' 18', 'issues #' + '3', 'as in #' + '22', 'PR #' + '4']
    found = outside_references('\n'.join(lines))
    assert [hit.split(': ', 1)[1] for hit in found] == cited


def test_the_patterns_let_upstream_citations_through():
    text = ('https://github.com/pytorch/pytorch/issues/' + '123\n'
            'ros2/rclpy#' + '1452, PKCS#' + '8, OMG DDS Security 1.1, ' + _SECTION + '9.4\n'
            'openpi `src/openpi/models/pi0.py`; `docs/model.md#flow-matching`.\n')
    assert outside_references(text) == []
    assert broken_docs_citations(text) == []


def test_a_missing_page_or_anchor_is_reported():
    model, nope = 'docs/' + 'model.md#no-such-heading', 'docs/' + 'nope.md'
    assert broken_docs_citations(f'see ``{model}`` and {nope}.\n') == [
        f'1: {model} (no such heading)', f'1: {nope} (no such page)']
