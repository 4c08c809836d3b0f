"""The dependency rules of docs/reference/design.md §3, checked for every module of the package by parsing its imports.

Every ``import`` and ``from ... import`` statement of every ``swarmnode/**/*.py`` file counts, wherever it stands
(module level, inside a function, under ``TYPE_CHECKING``): a lazy import is still a dependency. Modules are
grouped into *rooms*: the top-level modules (``cli``, ``node``, ``config``, ``evaluation``) and the
subpackages (``tasks``, ``policy``, ``rollout``, ``train``, ``swarm``, ``monitor``, ``bench``).

Rules (docs/reference/design.md §3, docs/reference/architecture.md):

1. ``cli -> node -> {rollout, train, swarm, tasks, policy, monitor}``: nothing imports ``cli``; only the entry
   rooms (``cli``, and ``bench``, which ``swarmnode bench`` runs) import ``node``;
2. ``rollout``, ``train``, ``tasks`` never import ``swarm``;
3. ``swarm`` never imports ``train`` or ``policy``;
4. no import cycle between rooms;
5. ``swarm/wire.py`` (the wire codec) is the only module that imports ``msgpack``.

``KNOWN`` lists violations that are left on purpose, each with its reason; the test fails when one of them
disappears, so the list cannot go stale.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "swarmnode"

#: rooms that may import ``node``: the front ends a user runs
ENTRY_ROOMS = {"cli", "bench"}

#: (importing module, imported module) pairs that break a rule on purpose, with the reason
KNOWN: dict[tuple[str, str], str] = {
    ("swarmnode.testing.adversary.raw", "msgpack"): (
        "the hostile test peer (swarmnode/testing/, apart from the node) forges malformed msgpack on purpose, "
        "all of it through this one module"
    ),
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports (relative imports resolved)."""
    mod = _module_name(path)
    package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.add(name)
            if name in ("swarmnode",) or (node.level and not node.module):
                out.update(f"{name}.{a.name}" for a in node.names)  # `from swarmnode import node`
    return out


def _room(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "swarmnode" or len(parts) < 2:
        return None
    return parts[1]


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in sorted(PKG.rglob("*.py"))}


GRAPH = _graph()


def _violations() -> list[tuple[str, str, str]]:
    out = []
    for mod, imps in GRAPH.items():
        src = _room(mod)
        for imp in sorted(imps):
            top = imp.split(".")[0]
            if top == "msgpack" and mod != "swarmnode.swarm.wire":
                out.append((mod, imp, "only the wire codec imports msgpack"))
            dst = _room(imp)
            if dst is None or dst == src:
                continue
            if dst == "cli":
                out.append((mod, imp, "nothing imports cli"))
            if dst == "node" and src not in ENTRY_ROOMS:
                out.append((mod, imp, "only cli (and bench) import node"))
            if src in ("rollout", "train", "tasks") and dst == "swarm":
                out.append((mod, imp, f"{src} never imports swarm"))
            if src == "swarm" and dst in ("train", "policy"):
                out.append((mod, imp, f"swarm never imports {dst}"))
            if dst == "testing" and src not in ENTRY_ROOMS:
                out.append((mod, imp, "only the front ends (cli, bench) import the testing support"))
    return out


def test_every_module_was_parsed():
    assert len(GRAPH) > 40
    for room in ("cli", "node", "config", "tasks", "policy", "rollout", "train", "swarm", "monitor", "bench", "testing"):
        assert any(_room(m) == room for m in GRAPH), f"no module found for room {room}"


def test_dependency_rules_hold_for_every_module():
    found = _violations()
    unexpected = [f"{m} imports {i}: {why}" for m, i, why in found if (m, i) not in KNOWN]
    assert not unexpected, "dependency rules broken (docs/reference/design.md §3):\n" + "\n".join(unexpected)
    gone = [k for k in KNOWN if k not in {(m, i) for m, i, _ in found}]
    assert not gone, f"KNOWN lists violations that are fixed now; remove them: {gone}"


def test_no_import_cycle_between_rooms():
    rooms: dict[str, set[str]] = {}
    for mod, imps in GRAPH.items():
        src = _room(mod)
        if src is None:
            continue
        rooms.setdefault(src, set()).update(d for d in (_room(i) for i in imps) if d is not None and d != src)
    # depth-first search for a back edge; report the cycle
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(r: str) -> None:
        state[r] = 1
        stack.append(r)
        for d in sorted(rooms.get(r, ())):
            if state.get(d) == 1:
                cyc = stack[stack.index(d):] + [d]
                pytest.fail("import cycle between rooms: " + " -> ".join(cyc))
            if d not in state:
                visit(d)
        stack.pop()
        state[r] = 2

    for r in sorted(rooms):
        if r not in state:
            visit(r)


def test_rollout_does_not_import_policy():
    """The tree sampler's interface lives in rollout/; the engines in policy/ implement it."""
    bad = [(m, i) for m, imps in GRAPH.items() if _room(m) == "rollout" for i in imps if _room(i) == "policy"]
    assert not bad


def test_the_rule_checker_sees_a_violation():
    """The checker itself can fail: a module of rollout that imports swarm is reported."""
    fake = {"swarmnode.rollout.fake": {"swarmnode.swarm.wire", "msgpack"}}
    saved = dict(GRAPH)
    try:
        GRAPH.update(fake)
        reasons = {why for m, _, why in _violations() if m == "swarmnode.rollout.fake"}
    finally:
        GRAPH.clear()
        GRAPH.update(saved)
    assert reasons == {"rollout never imports swarm", "only the wire codec imports msgpack"}


def _protocol_methods(proto) -> set[str]:
    return {n for n, v in vars(proto).items() if callable(v) and not n.startswith("_")}


def test_declared_seams_are_implemented():
    """The seams are declared protocols, and the parts that sit on them implement every method they declare."""
    from swarmnode.policy.decode import DecodeEngine
    from swarmnode.policy.vllm_backend import (
        ReferenceSegmentGenerator,
        SegmentBackend,
        SegmentRequestEngine,
        VLLMBackend,
    )
    from swarmnode.rollout.engine import SegmentEngine
    from swarmnode.tasks.base import Scorer
    from swarmnode.tasks.mix import TaskMix

    for cls in (DecodeEngine, SegmentRequestEngine):
        missing = _protocol_methods(SegmentEngine) - set(dir(cls))
        assert not missing, f"{cls.__name__} lacks {missing} of SegmentEngine"
        assert isinstance(cls.supports_token_forks, bool)
    for cls in (VLLMBackend, ReferenceSegmentGenerator):
        assert issubclass(cls, SegmentBackend) and not getattr(cls, "__abstractmethods__", None)
    missing = _protocol_methods(Scorer) - set(dir(TaskMix))
    assert not missing, f"TaskMix lacks {missing} of Scorer"


def test_backends_never_dispatch_on_hasattr():
    """Generation-backend dispatch is on declared classes (policy/backends.py), not on attributes an object has."""
    src = (PKG / "policy" / "backends.py").read_text(encoding="utf-8")
    calls = [n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "hasattr"]
    assert not calls


def test_no_module_runs_code_by_file_path():
    """The package works from a wheel: nothing imports or runs a file by path (scripts/ is not installed)."""
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        src = path.read_text(encoding="utf-8")
        for needle in ("spec_from_file_location", "run_path(", "SCRIPTS_DIR"):
            if needle in src:
                bad.append(f"{path.relative_to(PKG.parent)}: {needle}")
    assert not bad


# ------------------------------------------------------------------------------------------ declared seams
#: parameter names that carry a seam between rooms, and the declared type each should have
SEAM_PARAMS: dict[str, str] = {
    "policy": "policy.loading.Policy, or swarm.gossip.SwarmPolicy in the swarm room",
    "tasks": "tasks.base.Scorer or tasks.mix.TaskMix",
    "mix": "tasks.mix.TaskMix or tasks.base.Scorer",
    "scorer": "tasks.base.Scorer",
    "swarm": "node.SwarmHook, or monitor.status.SwarmProbe in the monitor room",
    "node": "monitor.runtime.MonitoredNode, or node.Node in the front ends",
    "backend": "policy.backends.GenerationBackend",
    "engine": "rollout.engine.SegmentEngine",
    "swarm_cfg": "config.SwarmConfig",
    "model_cfg": "config.ModelConfig",
    "sampling_cfg": "config.SamplingConfig",
    "screen_cfg": "config.ScreenConfig",
}

#: (module path, name) of seam reads by ``getattr`` left on purpose, with the reason
KNOWN_DYNAMIC_READS: dict[tuple[str, str], str] = {
    ("swarmnode/monitor/runtime.py", "node"): (
        "the monitor exists before the node has loaded its model (status 'starting' is written first): "
        "policy, base_model_id, resumed_from and tokens_generated are read once they exist (MonitoredNode)"
    ),
}


def _is_any(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return True
    text = ast.unparse(annotation).replace(" ", "").strip("'\"")
    return text in ("Any", "Any|None", "None|Any", "Optional[Any]", "typing.Any")


def _public_functions(tree: ast.Module):
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and not n.name.startswith("_"):
            yield n.name, n
        elif isinstance(n, ast.ClassDef) and not n.name.startswith("_"):
            for m in n.body:
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                        not m.name.startswith("_") or m.name == "__init__"):
                    yield f"{n.name}.{m.name}", m


def _seam_violations(sources: dict[str, str]) -> list[str]:
    """Public functions whose seam parameter (:data:`SEAM_PARAMS`) is annotated ``Any`` or not at all, and
    ``getattr``/``hasattr`` on a seam object (duck typing across rooms), in ``{path: source}``."""
    out = []
    for path, src in sources.items():
        tree = ast.parse(src)
        for name, f in _public_functions(tree):
            for a in f.args.posonlyargs + f.args.args + f.args.kwonlyargs:
                if a.arg in SEAM_PARAMS and _is_any(a.annotation):
                    out.append(f"{path}: {name}({a.arg}: {ast.unparse(a.annotation) if a.annotation else '?'}) "
                               f"-- declare it as {SEAM_PARAMS[a.arg]}")
        for n in ast.walk(tree):
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr")
                    and n.args):
                x = n.args[0]
                last = x.attr if isinstance(x, ast.Attribute) else x.id if isinstance(x, ast.Name) else None
                if last in SEAM_PARAMS and (path, last) not in KNOWN_DYNAMIC_READS:
                    out.append(f"{path}:{n.lineno}: {ast.unparse(n)} -- read a declared attribute of the seam")
    return out


def _package_sources() -> dict[str, str]:
    return {str(p.relative_to(PKG.parent)): p.read_text(encoding="utf-8") for p in sorted(PKG.rglob("*.py"))}


def test_seams_are_declared_not_any():
    """Every seam between rooms is a declared type. A public function never takes a seam (policy, task
    set, swarm layer, node, backend, engine, a config section) as ``Any`` or unannotated, and no module reads a
    seam through ``getattr``/``hasattr``."""
    found = _seam_violations(_package_sources())
    assert not found, "seams typed as Any or read by duck typing:\n" + "\n".join(found)
    used = {(p, n) for p, src in _package_sources().items() for n in SEAM_PARAMS
            if (p, n) in KNOWN_DYNAMIC_READS and f"getattr({n}," in src.replace("self.", "")}
    assert used == set(KNOWN_DYNAMIC_READS), "KNOWN_DYNAMIC_READS lists reads that are gone; remove them"


def test_the_seam_checker_sees_a_violation():
    fake = {"swarmnode/fake.py": (
        "from typing import Any\n"
        "def build(policy: Any, tasks, mix: 'TaskMix') -> None:\n"
        "    hasattr(mix, 'rescore')\n"
        "class C:\n"
        "    def __init__(self, swarm_cfg: Any | None = None) -> None:\n"
        "        getattr(self.swarm_cfg, 'x', 0)\n"
        "def _private(policy: Any) -> None: ...\n")}
    found = _seam_violations(fake)
    assert len(found) == 5, found
    assert any("build(policy: Any)" in f for f in found) and any("build(tasks: ?)" in f for f in found)
    assert any("C.__init__(swarm_cfg" in f for f in found)
    assert sum("getattr" in f or "hasattr" in f for f in found) == 2


#: the most lines a module may have (docs/reference/architecture.md: a module is one job a newcomer can read)
MAX_MODULE_LINES = 650
#: modules allowed to be longer, each with its reason
LONG_MODULES = {
    "swarmnode/swarm/wire.py": "the protocol codec: every message's schema and checks in one place, as protocol/SPEC.md",
}


def test_no_module_is_over_the_size_of_one_job():
    """Every module of the package is at most ``MAX_MODULE_LINES`` lines, except the wire codec."""
    root = PKG.parent
    long = {str(p.relative_to(root)): n for p in PKG.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    unexpected = {k: v for k, v in long.items() if k not in LONG_MODULES}
    assert not unexpected, f"modules over {MAX_MODULE_LINES} lines (split them by concern): {unexpected}"
    assert set(LONG_MODULES) <= {str(p.relative_to(root)) for p in PKG.rglob("*.py")}


def test_every_package_init_maps_its_package():
    """Each package's ``__init__.py`` docstring names every module and subpackage in it (how the package is
    organized, as hivemind's do), so a newcomer finds a file from the package's front door."""
    missing: dict[str, list[str]] = {}
    for init in sorted(PKG.rglob("__init__.py")):
        d = init.parent
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        parts = [p.stem for p in d.glob("*.py") if p.stem not in ("__init__", "__main__")]
        parts += [p.name for p in d.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
        absent = sorted(m for m in parts if m not in doc)
        if not doc or absent:
            missing[str(d.relative_to(PKG.parent))] = absent or ["(no docstring)"]
    assert not missing, f"package docstrings that do not name their modules: {missing}"


def test_no_issue_or_helper_numbers_in_code():
    """Docstrings and comments of the package, the tests and the scripts say what and why, not which ticket:
    commit messages keep the issue and helper numbers."""
    import re

    root = PKG.parent
    pat = re.compile(r"\b[Ii]ssue \d+|\bhelper-\d+")
    files = [p for d in ("swarmnode", "tests", "scripts") for p in sorted((root / d).rglob("*.py"))
             if p.name != "test_architecture.py"]
    hits = [f"{p.relative_to(root)}:{i}" for p in files
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pat.search(line)]
    assert not hits, f"issue or helper numbers in code: {hits[:10]}"
