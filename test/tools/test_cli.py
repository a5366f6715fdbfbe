"""The console scripts: one snake_case executable per group, subcommands dispatched lazily."""

from importlib import metadata
import json
import subprocess
import sys

from oxygen_ros.tools import bag, bench, cli, demo, fetch, keystore, stress
import pytest

GROUPS = {'oxygen_bag': bag, 'oxygen_bench': bench, 'oxygen_demo': demo, 'oxygen_fetch': fetch,
          'oxygen_keystore': keystore, 'oxygen_stress': stress}


class _Recorder:
    """A subcommand module that records its argv."""

    def __init__(self):
        self.calls = []

    def main(self, argv):
        self.calls.append(list(argv))
        return 3


@pytest.fixture
def recorder(monkeypatch):
    rec = _Recorder()
    monkeypatch.setattr(cli.importlib, 'import_module', lambda name: rec)
    return rec


COMMANDS = {'one': cli.Subcommand('pkg.one', 'the first'),
            'two': cli.Subcommand('pkg.two', 'the second')}


def test_dispatch_passes_the_rest_and_returns_the_status(recorder):
    assert cli.run_group('prog', 'what it does', COMMANDS, ['two', '--x', '1', '--help']) == 3
    assert recorder.calls == [['--x', '1', '--help']]


def test_default_subcommand_runs_without_a_name_or_before_an_option(recorder):
    assert cli.run_group('prog', 'd', COMMANDS, [], default='one') == 3
    assert cli.run_group('prog', 'd', COMMANDS, ['--duration', '5'], default='one') == 3
    assert recorder.calls == [[], ['--duration', '5']]


def test_help_lists_every_subcommand(recorder, capsys):
    assert cli.run_group('prog', 'what it does', COMMANDS, ['--help'], default='two') == 0
    out = capsys.readouterr().out
    assert out.startswith('usage: prog {one,two} [ARGS ...]\n\nwhat it does\n')
    assert '  one  the first\n  two  (default) the second\n' in out
    assert recorder.calls == []


@pytest.mark.parametrize('argv, error', [([], 'a subcommand is needed'),
                                         (['three'], "unknown subcommand 'three'"),
                                         (['--one'], "unknown subcommand '--one'")])
def test_unknown_or_missing_subcommand_exits_2_with_the_usage(recorder, capsys, argv, error):
    assert cli.run_group('prog', 'd', COMMANDS, argv) == 2
    err = capsys.readouterr().err
    assert err.startswith('usage: prog {one,two}') and err.endswith(f'prog: error: {error}\n')
    assert recorder.calls == []


def test_installed_console_scripts_are_snake_case_and_name_the_groups():
    scripts = {ep.name: ep.value for ep in metadata.entry_points(group='console_scripts')
               if ep.value.startswith('oxygen_ros.')}
    assert all(n.isidentifier() and n == n.lower() and n.startswith('oxygen_') for n in scripts)
    for group, module in GROUPS.items():
        assert scripts[group] == f'{module.__name__}:main'


def test_every_subcommand_runs_its_module_with_its_own_prog():
    """Each subcommand's --help is the module's argparse help under 'GROUP NAME' (one process)."""
    probe = (
        'import contextlib, io, json, sys\n'
        'from oxygen_ros.tools import bag, bench, demo, fetch, keystore, stress\n'
        'out = {}\n'
        'for group, mod in (("oxygen_bag", bag), ("oxygen_bench", bench), ("oxygen_demo", demo),\n'
        '                   ("oxygen_fetch", fetch), ("oxygen_keystore", keystore),\n'
        '                   ("oxygen_stress", stress)):\n'
        '    for name in mod.COMMANDS:\n'
        '        buf = io.StringIO()\n'
        '        with contextlib.redirect_stdout(buf):\n'
        '            try:\n'
        '                mod.main([name, "--help"])\n'
        '            except SystemExit as exc:\n'
        '                assert exc.code == 0, (group, name, exc.code)\n'
        '        out[f"{group} {name}"] = buf.getvalue()\n'
        'print(json.dumps(out))\n')
    proc = subprocess.run([sys.executable, '-c', probe], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    helps = json.loads(proc.stdout.splitlines()[-1])
    expected = {f'{group} {name}' for group, mod in GROUPS.items() for name in mod.COMMANDS}
    assert set(helps) == expected
    for prog, text in helps.items():
        assert text.startswith(f'usage: {prog} '), (prog, text[:200])


def test_group_help_imports_neither_torch_nor_rclpy():
    probe = ('import sys\n'
             'from oxygen_ros.tools import bench\n'
             'assert bench.main(["--help"]) == 0\n'
             'print(sorted(m for m in ("torch", "rclpy") if m in sys.modules))\n')
    proc = subprocess.run([sys.executable, '-c', probe], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == '[]'
