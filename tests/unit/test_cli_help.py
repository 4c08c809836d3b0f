"""Every command's ``--help`` fits an 80-column terminal: no option name is cropped to ``…``.

Rich shrinks the option table's columns when their widths add up past the terminal; an option name is one word,
so a shrunken name column crops it (``--allow-config-ch…``). The check renders each command's help in-process at
80 columns and looks for every long option name of that command, whole.
"""

from __future__ import annotations

import pytest
import typer
from typer.core import TyperOption
from typer.testing import CliRunner

from swarmnode.cli import app


def _commands(cmd, path: tuple[str, ...] = ()) -> list:
    out = [(path, cmd)]
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        out += _commands(sub, path + (name,))
    return out


COMMANDS = _commands(typer.main.get_command(app))


def test_every_command_was_found():
    names = {" ".join(p) for p, _ in COMMANDS}
    assert {"run", "eval", "swarm up"} <= names


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=[" ".join(p) or "swarmnode" for p, _ in COMMANDS])
def test_help_at_80_columns_shows_every_option_name_whole(path, cmd):
    res = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80", "TERM": "dumb"}, terminal_width=80)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    if not any("Options" in ln for ln in lines):
        return  # a passthrough command prints its own parser's help
    too_wide = [ln for ln in lines if len(ln) > 80]
    assert not too_wide, f"`swarmnode {' '.join(path)} --help` has lines over 80 columns: {too_wide[:3]}"
    for p in cmd.params:
        if not isinstance(p, TyperOption) or p.hidden:
            continue
        for name in [*p.opts, *p.secondary_opts]:
            if name.startswith("--"):
                assert any(name in ln.split() or f"{name}," in ln for ln in lines), (
                    f"`swarmnode {' '.join(path)} --help` at 80 columns crops {name}:\n{res.output}")
