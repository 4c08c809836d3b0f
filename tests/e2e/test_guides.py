"""The guides' commands work as written: every ```bash block of docs/guide/{volunteer,researcher,operations}.md.

Each guide runs top to bottom in a fresh directory (with ``configs/`` linked from the repository, as in a
clone), every block as ``bash -e -c <block>`` with the package's ``swarmnode`` on ``PATH``. A block may be
preceded by a marker line ``<!-- test: ... -->``:

* ``skip (reason)`` -- not run here (downloads, public addresses, several hosts); the reason is required;
* ``background`` -- started and left running (like a command in another terminal); ``wait-step=DIR:N``
  waits until ``DIR/status.json`` reports step N; background commands are stopped with SIGINT (Ctrl-C, as
  the guide says) by a later ``stop-background`` block or at the end, and must then exit 0 after
  checkpointing;
* ``interrupt=S`` -- a live view: SIGINT after S seconds, must exit 0;
* ``exit=N`` -- the expected exit code (default 0).

Test-time rewrites, the only differences from what a reader types: ``--steps N`` becomes ``--steps 2``
(except in background commands, which run until stopped), or one more than the step a run directory the block
names is at already when that is 2 or more (a reader's N is larger; a smaller ``--steps`` than the run's
checkpoint is refused), port 9100 becomes a free port, and when the
embedded model is not built yet, ``$SWARMNODE_TEST_MODEL`` replaces it (``--model`` added to ``swarmnode
run`` / ``swarm up``, ``name_or_path: embedded`` rewritten).

The fast test checks, without running anything, that every ``swarmnode`` command line in the guides (skipped
ones included) names an existing subcommand and only its options.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from monitor_helpers import ROOT, child_env, test_model, wait_for
from swarmnode.monitor.status import read_status_file
from swarmnode.swarm.local import free_port

GUIDES = ["guide/volunteer.md", "guide/researcher.md", "guide/operations.md"]
_BLOCK = re.compile(r"(?:<!--\s*test:\s*(?P<mark>[^>]*?)\s*-->[ \t]*\n[ \t]*)?```bash[ \t]*\n(?P<code>.*?)\n[ \t]*```",
                    re.S)


@dataclass
class Block:
    guide: str
    index: int
    code: str
    skip: str | None = None
    background: bool = False
    wait_step: tuple[str, int] | None = None
    interrupt: float | None = None
    exit: int = 0
    stop_background: bool = False


def parse_guide(name: str) -> list[Block]:
    """The ```bash blocks of ``docs/<name>`` with their test markers (see the module docstring)."""
    text = (ROOT / "docs" / name).read_text(encoding="utf-8")
    out = []
    for i, m in enumerate(_BLOCK.finditer(text)):
        b = Block(name, i, textwrap.dedent(m.group("code")))
        mark = (m.group("mark") or "").strip()
        sk = re.match(r"skip\s*\((.+)\)\s*$", mark)
        if sk:
            b.skip = sk.group(1).strip()
        elif mark:
            for tok in mark.split():
                if tok == "background":
                    b.background = True
                elif tok == "stop-background":
                    b.stop_background = True
                elif tok.startswith("wait-step="):
                    d, n = tok.split("=", 1)[1].rsplit(":", 1)
                    b.wait_step = (d, int(n))
                elif tok.startswith("interrupt="):
                    b.interrupt = float(tok.split("=", 1)[1])
                elif tok.startswith("exit="):
                    b.exit = int(tok.split("=", 1)[1])
                else:
                    raise ValueError(f"docs/{name} block {i}: unknown test marker {tok!r}")
        out.append(b)
    return out


def steps_done(code: str, work: Path) -> int:
    """The largest step that a run directory named in ``code`` (``--run-dir D``, under ``work``) is at; 0: none."""
    return max(((read_status_file(work / d) or {}).get("step") or 0 for d in re.findall(r"--run-dir (\S+)", code)),
               default=0)


def rewrite(code: str, background: bool, port: int, model: str, done: int = 0) -> str:
    """The test-time rewrites of a block (see the module docstring); ``done``: :func:`steps_done`."""
    if not background:
        code = re.sub(r"--steps \d+", f"--steps {max(2, done + 1)}", code)
    code = code.replace("9100", str(port))
    if model != "embedded":
        code = re.sub(r"\bswarmnode (run|swarm up)\b", lambda m: f"{m.group(0)} --model {shlex.quote(model)}", code)
        code = code.replace("name_or_path: embedded", f"name_or_path: {model}")
    return code


# ------------------------------------------------------------------------------------------ static check
def _command_lines(code: str) -> list[list[str]]:
    """``swarmnode ...`` invocations in a block, as argv lists (continuation lines joined, comments dropped)."""
    out = []
    joined = re.sub(r"\\\n\s*", " ", code)
    for line in joined.splitlines():
        for part in re.split(r"&&|\|\||;|\||\$\(|\buntil\b|\bdo\b", line):
            part = part.split(" #", 1)[0].strip()
            if part.startswith("swarmnode "):
                out.append(shlex.split(part))
    return out


def test_guides_use_existing_commands_and_options():
    import typer

    from swarmnode.cli import app

    root = typer.main.get_command(app)
    seen = 0
    for g in GUIDES:
        blocks = parse_guide(g)
        assert blocks, f"docs/{g} has no bash blocks"
        for b in blocks:
            for argv in _command_lines(b.code):
                cmd, rest = root, argv[1:]
                while hasattr(cmd, "commands") and rest and not rest[0].startswith("-"):
                    assert rest[0] in cmd.commands, f"docs/{g}: `{' '.join(argv)}`: no subcommand {rest[0]!r}"
                    cmd, rest = cmd.commands[rest[0]], rest[1:]
                opts = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
                for tok in rest:
                    if tok.startswith("--"):
                        assert tok.split("=")[0] in opts, f"docs/{g}: `{' '.join(argv)}`: {cmd.name} has no {tok}"
                seen += 1
    assert seen >= 15
    skipped = [(b.guide, b.skip) for g in GUIDES for b in parse_guide(g) if b.skip]
    assert all(reason for _, reason in skipped)
    assert len(skipped) <= 7, f"too many guide commands are not tested: {skipped}"


# ------------------------------------------------------------------------------------------ run the guides
def _stop(bg: list[tuple[Block, subprocess.Popen, Path]]) -> None:
    for _, p, _ in bg:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGINT)  # Ctrl-C
    for b, p, log in bg:
        try:
            rc = p.wait(300)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            pytest.fail(f"docs/{b.guide} block {b.index} did not stop after Ctrl-C:\n{log.read_text()[-3000:]}")
        assert rc == 0, f"docs/{b.guide} block {b.index} exited {rc} after Ctrl-C:\n{log.read_text()[-3000:]}"
    bg.clear()


@pytest.mark.slow
@pytest.mark.parametrize("guide", GUIDES)
def test_guide_commands_run_as_written(guide, tmp_path):
    model = test_model()
    work = tmp_path / "clone"
    work.mkdir()
    (work / "configs").symlink_to(ROOT / "configs")
    env = child_env(SWARMNODE_HOME=str(tmp_path / "home"))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    port = free_port()
    bg: list[tuple[Block, subprocess.Popen, Path]] = []
    ran = 0
    try:
        for b in parse_guide(guide):
            if b.skip:
                continue
            if b.stop_background:
                _stop(bg)
            code = rewrite(b.code, b.background, port, model, steps_done(b.code, work))
            log = tmp_path / f"block-{b.index}.log"
            where = f"docs/{guide} block {b.index}:\n{code}"
            if b.background or b.interrupt is not None:
                with open(log, "wb") as out:
                    p = subprocess.Popen(["bash", "-e", "-c", code], cwd=work, env=env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
                if b.background:
                    bg.append((b, p, log))
                    if b.wait_step is not None:
                        d, n = b.wait_step
                        wait_for(lambda: (read_status_file(work / d) or {}).get("step", 0) >= n, 300,
                                 f"{where}\nto reach step {n}", p, log)
                    continue
                time.sleep(b.interrupt)
                assert p.poll() is None, f"{where}\nexited early:\n{log.read_text()[-3000:]}"
                os.killpg(p.pid, signal.SIGINT)
                rc = p.wait(300)
                out_text = log.read_text(errors="replace")
            else:
                res = subprocess.run(["bash", "-e", "-c", code], cwd=work, env=env, capture_output=True, text=True,
                                     timeout=600)
                rc, out_text = res.returncode, res.stdout + res.stderr
            assert rc == b.exit, f"{where}\nexit code {rc}, expected {b.exit}:\n{out_text[-4000:]}"
            assert "Traceback" not in out_text, f"{where}\n{out_text[-4000:]}"
            ran += 1
        _stop(bg)
    finally:
        for _, p, _ in bg:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert ran >= 3
