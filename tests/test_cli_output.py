"""What ``swarmnode run`` prints when stdout is not a terminal (a pipe, a log file, CI)."""

from __future__ import annotations

from types import SimpleNamespace

from rich.console import Console

import swarmnode.cli as cli


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
    monkeypatch.setattr(cli, "console", console)
    assert cli._evaluate_with_progress(node, "before training") == "result"
    return console.export_text().splitlines()


def test_plain_eval_progress_says_how_many_questions_are_probes(monkeypatch):
    lines = _printed(monkeypatch, _FakeNode(500, 200))
    assert lines[0] == "held-out eval (before training): 700 questions (500 held-out + 200 probe questions)…"
    assert lines[-1].startswith("held-out eval (before training): 700/700 questions")


def test_plain_eval_progress_without_probes_counts_only_questions(monkeypatch):
    lines = _printed(monkeypatch, _FakeNode(500, 0))
    assert lines[0] == "held-out eval (before training): 500 questions…"
