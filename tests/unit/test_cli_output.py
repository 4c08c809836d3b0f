"""What ``swarmnode run`` prints when stdout is not a terminal (a pipe, a log file, CI)."""

from __future__ import annotations

from types import SimpleNamespace

from rich.console import Console

from swarmnode.cli import training


class _FakeNode:
    """Stands in for ``Node`` in ``_evaluate_with_progress``: an evaluation of 500 held-out questions and 200 probe
    questions in decoding batches of 256, reported through ``progress(done, total)`` as ``Node.evaluate`` does."""

    def __init__(self, held_out: int, probes: int) -> None:
        self.cfg = SimpleNamespace(tasks=SimpleNamespace(eval_size=held_out, probes=[object()] if probes else []))
        self.total = held_out + probes

    def evaluate(self, progress=None):
        for done in (0, 256, 512, self.total):
            progress(min(done, self.total), self.total)
        return "result"


def _printed(monkeypatch, node) -> list[str]:
    console = Console(record=True, width=200, force_terminal=False)
    monkeypatch.setattr(training, "console", console)  # the run command's module
    assert training._evaluate_with_progress(node, "before training") == "result"
    return console.export_text().splitlines()


def test_plain_eval_progress_says_how_many_questions_are_probes(monkeypatch):
    lines = _printed(monkeypatch, _FakeNode(500, 200))
    assert lines[0] == "held-out eval (before training): 700 questions (500 held-out + 200 probe questions)…"
    assert lines[-1].startswith("held-out eval (before training): 700/700 questions")


def test_plain_eval_progress_without_probes_counts_only_questions(monkeypatch):
    lines = _printed(monkeypatch, _FakeNode(500, 0))
    assert lines[0] == "held-out eval (before training): 500 questions…"


def test_top_warnings_panel_keeps_every_word_and_no_blank_line():
    """``top``'s recent-warnings panel at 80 columns: each message wraps at spaces (every word of it is printed
    whole), no blank line closes the panel, and a status without ``save_steps`` shows ``-``, not ``None steps``."""
    import time

    from swarmnode.monitor.status import Verdict
    from swarmnode.monitor.top import render_node

    now = time.time()
    msgs = ["the stall watchdog fired: no progress for 120s in phase evaluating (load 9.1 on 2 cores); see "
            "runs/default/stall-20261206-113000.txt for the stacks",
            "swarm: 3 bundles from 12D3KooWAbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdefgh rejected (screen)"]
    doc = {"state": "training", "step": 3, "steps_total": 600, "phase": "sampling", "phase_seconds": 5.0,
           "updated_at": now, "node": {"pid": 1},
           "warnings": [{"time": now - 30, "level": "WARNING", "message": m} for m in msgs]}
    con = Console(width=80, record=True, color_system=None)
    con.print(render_node("runs/default", doc, Verdict("live", "live", 0)))
    text = con.export_text()
    panel = text[text.index("recent warnings"):].splitlines()[1:-1]
    words = " ".join(ln.strip("│ ") for ln in panel).split()
    for m in msgs:
        for w in m.split():
            assert w in words, f"{w!r} cut in the warnings panel:\n{text}"
    assert all(ln.strip("│ ") for ln in panel), f"blank line in the warnings panel:\n{text}"
    assert "None steps" not in text


def test_top_and_status_say_how_many_questions_of_an_evaluation_are_probes():
    """The status document's evaluation counts probes in ``total``; ``held_out`` says how many are held-out
    questions, and ``top`` shows the split (an older document without it shows the count alone)."""
    import time

    from swarmnode.monitor.status import Verdict
    from swarmnode.monitor.top import probe_split, render_node

    now = time.time()
    ev = {"done": 128, "total": 700, "held_out": 500, "eta_s": 276.0}
    doc = {"state": "evaluating", "step": 0, "steps_total": 600, "phase": "evaluating", "phase_seconds": 95.0,
           "updated_at": now, "evaluation": ev, "node": {"pid": 1}}
    con = Console(width=120, record=True, color_system=None)
    con.print(render_node("runs/default", doc, Verdict("live", "live", 0)))
    assert "128/700 questions (500 held-out + 200 probes), ETA 4m36s" in " ".join(con.export_text().split())
    assert probe_split({"done": 1, "total": 500, "eta_s": None}) == ""  # an older status: no split
    assert probe_split({"done": 1, "total": 500, "held_out": 500}) == ""  # no probes


def test_a_node_evaluation_reports_its_held_out_count_to_the_status(tmp_path):
    """``Node.evaluate`` passes how many of the questions are held-out ones; the rest are the probes."""
    from monitor_helpers import test_model

    from swarmnode.config import load_config
    from swarmnode.node import Node

    cfg = load_config(None, {"run_dir": str(tmp_path / "r"), "model.name_or_path": test_model(), "steps": 1,
                             "sampling.max_completion_length": 8})
    node = Node(cfg)
    seen: list[dict] = []
    try:
        node.evaluate(n=8, progress=lambda d, t: seen.append(dict(node.monitor.tracker.document()["evaluation"])))
    finally:
        node.close()
    assert seen and all(e["held_out"] == 8 and e["total"] > 8 for e in seen), seen[:2]
