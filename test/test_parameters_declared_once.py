"""
Each parameter is declared once, in oxygen_parameters.yaml: nowhere else in the source.

``test_parameters.py`` holds the typed configs to the declaration at run time (each field's
default is its entry's). This file reads the source and the page instead: no Python code
declares a parameter by a name of its own (``declare_parameter('...')``) or builds a
descriptor of its own; no dataclass field and no keyword of the node's layers (``ros/``,
``sim/``) writes a declared default again; the configs that take their defaults from the
declaration write none in their class bodies (the sub-configs none at all); and every row of
docs/parameters.md says what the file says, read from the raw YAML (not through the loader
that generates the page).
"""

import ast
import math
from pathlib import Path

from oxygen_ros.parameters import DECLARATION
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / 'oxygen_ros'
YAML_FILE = PACKAGE / 'parameters' / DECLARATION
PAGE = ROOT / 'docs' / 'parameters.md'

DECLARING_MODULES = {'ros/params.py', 'sim/params.py'}
"""The modules that declare parameters on a node: each from its section of the file."""
DESCRIPTOR_MODULE = 'ros/param_spec.py'
"""The one module that builds a ``ParameterDescriptor`` (from an entry)."""
KEYWORD_LAYERS = ('ros/', 'sim/')
"""Where a function's keyword default naming a parameter would be a second declaration."""
SUB_CONFIGS = {'SchedulerConfig', 'BackendConfig'}
"""Configs with no default of their own: ``EngineConfig`` builds them from the file."""
NO_VALUE = (None, '', 0, False, ())
"""Defaults that decide nothing (an empty name, never, none): not a second declaration."""


def raw_entries():
    """
    Return ``{section: {name: entry}}`` of the file, nested names joined by dots.

    A ``__map_robots`` mapping's entries are ``<robots>.name`` (generate_parameter_library's
    maps), as the page names them.
    """
    out = {}

    def walk(section, prefix, table):
        for key, entry in table.items():
            if 'type' in entry:
                out.setdefault(section, {})[prefix + key] = entry
            elif key.startswith('__map_'):  # declared per item: <robots>.joint_names
                walk(section, f'{prefix}<{key[len("__map_"):]}>.', entry)
            else:
                walk(section, f'{prefix}{key}.', entry)
    for section, table in yaml.safe_load(YAML_FILE.read_text(encoding='utf-8')).items():
        walk(section, '', table)
    return out


def declared_defaults(entries):
    """Return ``({name: default}`` outside the sim, ``{name: default}`` of the sim)."""
    def names(section):
        found = {}
        for name, entry in entries.get(section, {}).items():
            for key in {name, entry.get('field', name)}:
                found.setdefault(key, []).append(entry.get('default_value'))
        return found
    common = names('oxygen')
    for key, values in names('engine').items():
        common.setdefault(key, []).extend(values)
    return common, names('oxygen_sim')


def _value(node):
    """Return a literal's value, an enum member's value by name (``X.FP8``: 'fp8'), or None."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        pass
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
            node.attr.isupper():
        return _EnumName(node.attr)
    return None


class _EnumName(str):
    """An enum member named in the source: equal to a declared string of its value."""

    def __eq__(self, other):
        return isinstance(other, str) and \
            str.__eq__(self, other.upper().replace('-', '_').replace(' ', '_'))

    __hash__ = str.__hash__


def _same(value, defaults):
    if value in NO_VALUE and not isinstance(value, _EnumName):
        return False
    for default in defaults:
        if isinstance(default, list):
            default = tuple(default)
        if value == default and type(value) is not bool or value is default:
            return True
    return False


def _decorators(cls):
    """Return ``{name: first argument}`` of a class's decorators (``{'declared': 'engine'}``)."""
    out = {}
    for dec in cls.decorator_list:
        arg = _value(dec.args[0]) if isinstance(dec, ast.Call) and dec.args else None
        dec = dec.func if isinstance(dec, ast.Call) else dec
        out[dec.attr if isinstance(dec, ast.Attribute) else getattr(dec, 'id', '')] = arg
    return out


def config_fields(entries, config):
    """Return the fields of the typed config ``config`` (``engine``) that the file fills."""
    fields = set()
    for section in entries.values():
        for name, entry in section.items():
            configs = entry.get('config') or ()
            if config in ((configs,) if isinstance(configs, str) else configs):
                fields.add(entry.get('field', name))
    return fields


def second_declarations(source, module, entries):
    """
    Return what ``source`` (the module ``module`` of the package) declares again, one line each.

    A parameter declared on a node by a name of its own, a descriptor built outside
    ``param_spec``, a dataclass field (or a ``ros/`` or ``sim/`` keyword) named as an entry
    whose default it writes again, a field of a declared config with a default in its body, a
    sub-config's field with any default.
    """
    common, sim = declared_defaults(entries)
    defaults = sim if module.startswith('sim/') else common
    out = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        where = f'{module}:{getattr(node, "lineno", 0)}'
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, 'id', '')
            if name == 'declare_parameter' and isinstance(func, ast.Attribute):
                first = node.args[0] if node.args else None
                if module not in DECLARING_MODULES or not (
                        isinstance(first, ast.Attribute) and first.attr == 'name'):
                    out.append(f'{where}: declare_parameter({ast.unparse(first)}, ...) is '
                               f'not an entry of {DECLARATION}')
            if name == 'declare_parameters' and isinstance(func, ast.Attribute):
                out.append(f'{where}: Node.declare_parameters: declare each entry of '
                           f'{DECLARATION} instead')
            if name == 'ParameterDescriptor' and module != DESCRIPTOR_MODULE:
                out.append(f'{where}: a ParameterDescriptor built outside {DESCRIPTOR_MODULE}')
        if isinstance(node, ast.ClassDef) and 'dataclass' in _decorators(node):
            config = _decorators(node).get('declared')
            declared = config_fields(entries, config) if config else set()
            for stmt in node.body:
                if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                        and stmt.value is not None):
                    continue
                field, value = stmt.target.id, _value(stmt.value)
                where = f'{module}:{stmt.lineno}'
                if node.name in SUB_CONFIGS:
                    out.append(f'{where}: {node.name}.{field} has a default of its own')
                elif field in declared:
                    out.append(f'{where}: {node.name}.{field} = {ast.unparse(stmt.value)} in '
                               f'the class body of a declared config')
                elif field in defaults and _same(value, defaults[field]):
                    out.append(f'{where}: {node.name}.{field} = {ast.unparse(stmt.value)} '
                               f'writes the default of {DECLARATION} again')
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                module.startswith(KEYWORD_LAYERS):
            args = node.args
            pairs = list(zip(args.args[len(args.args) - len(args.defaults):], args.defaults))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
            for arg, default in pairs:
                if arg.arg in defaults and _same(_value(default), defaults[arg.arg]):
                    out.append(f'{module}:{default.lineno}: {node.name}({arg.arg}='
                               f'{ast.unparse(default)}) writes the default of '
                               f'{DECLARATION} again')
    return out


def test_no_parameter_or_default_is_declared_a_second_time_in_the_source():
    entries = raw_entries()
    found = []
    for path in sorted(PACKAGE.rglob('*.py')):
        module = path.relative_to(PACKAGE).as_posix()
        found += second_declarations(path.read_text(encoding='utf-8'), module, entries)
    assert not found, 'declared again outside ' + DECLARATION + ':\n' + '\n'.join(found)


@pytest.mark.parametrize('module, source, says', [
    ('ros/node.py', "node.declare_parameter('control_rate_hz', 10.0)\n",
     "declare_parameter('control_rate_hz', ...) is not an entry"),
    ('ros/params.py', "node.declare_parameter(f'{x}', 1)\n", 'is not an entry'),
    ('ros/node.py', 'node.declare_parameters("", [])\n', 'Node.declare_parameters'),
    ('ros/node.py', 'ParameterDescriptor(read_only=True)\n', 'built outside'),
    ('tools/bench/x.py', '@dataclass\nclass Run:\n    tokens_per_cycle: int = 5\n',
     'Run.tokens_per_cycle = 5 writes the default'),
    ('engine/x.py', '@dataclass\nclass Run:\n    quantization: Q = Quantization.NONE\n',
     'Run.quantization = Quantization.NONE writes the default'),
    ('sim/x.py', '@dataclass\nclass Scene:\n    image_size: int = 224\n', 'writes the default'),
    ('ros/x.py', 'def smooth(mode, ensemble_decay=0.01):\n    pass\n',
     'smooth(ensemble_decay=0.01) writes the default'),
    ('engine/config.py', "@dataclass\n@declared('engine')\nclass EngineConfig:\n"
     '    seed: int = 1\n', 'in the class body of a declared config'),
    ('sched/scheduler.py', '@dataclass\nclass SchedulerConfig:\n    block_size: int = 8\n',
     'SchedulerConfig.block_size has a default of its own'),
])
def test_the_scan_finds_a_second_declaration(module, source, says):
    found = second_declarations(source, module, raw_entries())
    assert len(found) == 1 and says in found[0], found


def test_the_scan_leaves_what_decides_nothing_and_other_names_alone():
    source = ('@dataclass\nclass Run:\n    frame_id: str = ""\n    tokens_per_cycle: int = 7\n'
              '    other: float = 0.01\n'
              'def smooth(mode, ensemble_decay=None):\n    pass\n'
              'def tools_only(ensemble_decay=0.01):\n    pass\n')
    assert second_declarations(source, 'tools/x.py', raw_entries()) == []
    # the sim's own names are the sim's only: the model's image size is another thing
    model = '@dataclass\nclass Vision:\n    image_size: int = 224\n'
    assert second_declarations(model, 'config.py', raw_entries()) == []


def _cells(row):
    return [cell.strip() for cell in row.strip().strip('|').split(' | ')]


def _page_rows():
    rows = [line for line in PAGE.read_text(encoding='utf-8').splitlines()
            if line.startswith('| `')]
    return [_cells(row) for row in rows]


def _default_cell(text):
    text = text.strip('`')
    if text in ('true', 'false'):
        return text == 'true'
    return ast.literal_eval(text)


def test_docs_parameters_md_says_what_the_declaration_says():
    entries = raw_entries()['oxygen']
    rows = _page_rows()
    assert [row[0].strip('`') for row in rows] == list(entries), \
        'docs/parameters.md names other parameters, or in another order: run `make docs`'
    kinds = {'bool': 'bool', 'int': 'int', 'double': 'double', 'string': 'string',
             'string_array': 'string[]', 'double_array': 'double[]'}
    for row, entry in zip(rows, entries.values()):
        name, kind, default, bounds, unit, when, description = row
        where = f'docs/parameters.md, {name.strip("`")}'
        assert kind == kinds[entry['type']], where
        if 'preset_default' in entry:
            assert default == entry['preset_default'], where
        else:
            value = entry['default_value']
            assert _default_cell(default) == value and \
                type(_default_cell(default)) in (type(value), float), where
        limits = (entry.get('validation') or {}).get('bounds<>')
        if limits is None:
            assert bounds == '', where
        else:
            page = [float(v) for v in bounds.strip('[]').split(',')]
            assert all(math.isclose(a, b) for a, b in zip(page, limits)) and \
                len(page) == 2, where
        assert unit == str(entry.get('unit', '')), where
        assert when == ('read-only' if entry.get('read_only', False) else 'dynamic'), where
        assert description == ' '.join(str(entry['description']).split()), where
