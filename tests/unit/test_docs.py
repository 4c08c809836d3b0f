"""The documentation holds together: links resolve, no machine's paths, the config reference is fresh.

- every relative Markdown link, every ``docs/…`` path and every file path of the package, scripts, tests, configs
  and protocol named in ``README.md`` and ``docs/**/*.md`` points at a file of this checkout (so moving a page
  or a module without fixing what names it fails here);
- the same for ``docs/…`` paths cited in code docstrings and comments (``swarmnode/``, ``tests/``, ``scripts/``,
  ``configs/``, ``protocol/``) and in the config reference generated from them;
- no absolute path of a build machine (``/work/…``, ``/root/…``, ``/home/<user>/…``, ``/Users/…``) in the docs,
  the README or ``configs/``: commands in the docs use paths relative to the checkout;
- ``docs/reference/config.md`` is what ``python scripts/gen_config_reference.py`` writes from
  ``swarmnode/config/`` today.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: generated from code (its doc paths are the code's citations, checked with the code's)
GENERATED = {ROOT / "docs" / "reference" / "config.md"}
CODE_DIRS = ("swarmnode", "tests", "scripts", "configs", "protocol")
CODE_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".sh", ".toml"}

#: a Markdown link or image target: ``[text](target)`` / ``![alt](target)``
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
#: a path under docs/ named in running text, code spans or comments (``docs/guide/swarm.md``)
DOCS_PATH = re.compile(r"(?<![\w/.-])docs/[\w./-]*\w\.(?:md|png|json)")
#: a file of the checkout named in the docs (``swarmnode/rollout/sampler.py``, ``configs/tree.yaml``)
REPO_PATH = re.compile(r"(?<![\w/.-])(?:swarmnode|scripts|tests|configs|protocol)/[\w/.-]*\w\.(?:py|yaml|md|json|sh)")
#: a module named relative to the package, as the architecture page does (``rollout/engine.py``)
PKG_PATH = re.compile(r"(?<![\w/.-])(?:tasks|policy|rollout|train|swarm|monitor|benchmarks|bench|testing|node)/[\w/]*\w\.py")
#: an absolute path of some machine's home or work tree; ``/home/me/`` is the guides' placeholder user
ABSOLUTE = re.compile(r"(?<![\w.~-])/(?:work|root|Users)/[\w.-]+|(?<![\w.~-])/home/(?!me/)[\w.-]+/")


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def _broken_links(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    out = []
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http(s):, mailto:, in-page anchors
        file_part = target.split("#", 1)[0]
        if not (path.parent / file_part).exists():
            out.append(f"{_rel(path)}: link ({target}) -> no file {_rel((path.parent / file_part).resolve())}")
    for rx in (DOCS_PATH, REPO_PATH):
        for m in rx.finditer(text):
            if not (ROOT / m.group(0)).exists():
                out.append(f"{_rel(path)}: names {m.group(0)}, which does not exist")
    for m in PKG_PATH.finditer(text):
        if not (ROOT / "swarmnode" / m.group(0)).exists():
            out.append(f"{_rel(path)}: names {m.group(0)}, which is not a module of swarmnode/")
    return out


def test_doc_links_and_doc_paths_resolve():
    broken = [b for p in DOC_FILES if p not in GENERATED for b in _broken_links(p)]
    assert not broken, "broken links or stale doc paths:\n" + "\n".join(broken)


def _code_files() -> list[Path]:
    return [*GENERATED, *(p for d in CODE_DIRS for p in sorted((ROOT / d).rglob("*"))
                          if p.is_file() and p.suffix in CODE_SUFFIXES and "__pycache__" not in p.parts)]


def test_code_cites_existing_docs():
    stale = []
    for p in _code_files():
        for m in DOCS_PATH.finditer(p.read_text(encoding="utf-8", errors="replace")):
            if not (ROOT / m.group(0)).exists():
                stale.append(f"{_rel(p)}: {m.group(0)}")
    assert not stale, "code cites doc files that do not exist:\n" + "\n".join(sorted(set(stale)))


def test_no_absolute_machine_paths_in_docs_and_configs():
    files = DOC_FILES + [p for p in sorted((ROOT / "configs").rglob("*")) if p.is_file()]
    hits = []
    for p in files:
        for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for m in ABSOLUTE.finditer(line):
                hits.append(f"{_rel(p)}:{i}: {m.group(0)}")
    assert not hits, "absolute machine paths (use paths relative to the checkout, e.g. runs/...):\n" + "\n".join(hits)


def test_absolute_path_pattern_catches_machine_paths_only():
    assert ABSOLUTE.search("--work-dir /work/s22/bench_n4")
    assert ABSOLUTE.search("cp /root/swarmnode/x .")
    assert ABSOLUTE.search("see /home/alice/runs/a")
    assert not ABSOLUTE.search("WorkingDirectory=/home/me/swarmnode")
    assert not ABSOLUTE.search("--work-dir runs/bench_n4 and docs/lab/benchmarks.md")
    assert not ABSOLUTE.search("/ip4/127.0.0.1/tcp/0")


def _generator():
    spec = importlib.util.spec_from_file_location("gen_config_reference", ROOT / "scripts" / "gen_config_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_config_reference_is_fresh():
    gen = _generator()
    committed = (ROOT / "docs" / "reference" / "config.md").read_text(encoding="utf-8")
    assert committed == gen.render(), (
        f"docs/reference/config.md is stale (swarmnode/config/ changed): run `{gen.COMMAND}` and commit the page"
    )


def test_config_reference_lists_every_field():
    """Every leaf key of the config (walked through pydantic, independently of the generator) is on the page."""
    from pydantic import BaseModel

    from swarmnode.config import RunConfig

    gen = _generator()
    page = gen.render()

    def keys(model: type[BaseModel], prefix: str):
        for name, field in model.model_fields.items():
            key = f"{prefix}{name}"
            yield key
            inner, is_list = gen._models_in(field.annotation)
            if inner is not None:
                yield from keys(inner, key + ("[]." if is_list else "."))

    all_keys = list(keys(RunConfig, ""))
    assert len(all_keys) > 100  # the walk reached the nested sections
    missing = [k for k in all_keys if f"**`{k}`**" not in page]
    assert not missing, f"config keys missing from docs/reference/config.md: {missing}"
    for key, bound in (("train.learning_rate", "x > 0"), ("external.max_peer_share", "0 < x <= 1")):
        line = next(ln for ln in page.splitlines() if ln.startswith(f"- **`{key}`**"))
        assert bound in line, line
