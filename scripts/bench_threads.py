"""The default ``swarmnode run`` at idle and beside busy processes, before and after a code change, side by side.

Each arm runs ``swarmnode run --steps S --eval-size E`` (the README's first block, shortened) in a fresh run
directory with the environment a new user has: ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS`` and ``OMP_WAIT_POLICY``
are removed. ``--before DIR`` names a source tree of the old code (e.g. ``git archive <commit> | tar -x -C DIR``);
the "after" arm runs this checkout. The loaded arms start ``--busy`` processes that spin on the CPU
(``while True: pass``, each ending by itself after ``--busy-limit`` seconds) and kill them when the run ends.

Printed per arm: wall seconds of the whole command (start-up, both held-out evaluations, training), mean
seconds per step (``step_time`` in ``metrics.jsonl``) and the 1-minute load average at its end; then the ratios
loaded/idle per code version and before/after per load. Timings are of this machine and this moment (other jobs
count): compare only rows of one invocation.

Usage::

    python scripts/bench_threads.py --before runs/swarmnode-before --steps 10 --eval-size 40 --also-threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def _busy(n: int, limit_s: float) -> list[subprocess.Popen]:
    code = f"import time\nt = time.time() + {limit_s}\nwhile time.time() < t: pass\n"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


def _arm(src: Path, run_dir: Path, steps: int, eval_size: int, seed: int, timeout: float,
         extra: list[str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY")}
    env["PYTHONPATH"] = str(src)
    env["PYTHONUNBUFFERED"] = "1"
    cmd = [sys.executable, "-m", "swarmnode.cli", "run", "--steps", str(steps), "--eval-size", str(eval_size),
           "--seed", str(seed), "--run-dir", str(run_dir), *extra]
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=env, cwd=src, capture_output=True, text=True, timeout=timeout)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(f"arm failed ({src}): exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    st = [r["step_time"] for r in rows if "step_time" in r]
    return {"wall_s": wall, "s_per_step": sum(st) / max(len(st), 1), "steps": len(st), "load1": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> None:
    """Parse the flags, run the arms (after/before × idle/loaded, interleaved), print the table and ratios."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, help="source tree of the old code (a `git archive` export)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--eval-size", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--busy", type=int, default=2, help="busy processes beside the loaded arms")
    ap.add_argument("--busy-limit", type=float, default=900.0, help="each busy process ends by itself after this")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds one arm may take")
    ap.add_argument("--also-threads", type=int, nargs="*", default=[],
                    help="more arms of this checkout with --threads N (named after-tN)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    a = ap.parse_args(argv)
    versions = [("after", HERE, [])] + [(f"after-t{n}", HERE, ["--threads", str(n)]) for n in a.also_threads]
    versions += [("before", a.before.resolve(), [])] if a.before else []
    work = Path(tempfile.mkdtemp(prefix="bench_threads_"))
    res: dict[tuple[str, str], dict] = {}
    try:
        for load in ("idle", "loaded"):
            for name, src, extra in versions:
                busy = _busy(a.busy, a.busy_limit) if load == "loaded" else []
                try:
                    time.sleep(1.0 if busy else 0.0)
                    r = _arm(src, work / f"{name}-{load}", a.steps, a.eval_size, a.seed, a.timeout, extra)
                finally:
                    for b in busy:
                        b.kill()
                        b.wait()
                res[(name, load)] = r
                print(f"{name:8s} {load:6s}  wall {r['wall_s']:7.1f} s  {r['s_per_step']:6.2f} s/step  "
                      f"load1 {r['load1']:.1f}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\nratios (wall time of the whole command; s/step in brackets)")
    for name, _, _ in versions:
        i, l_ = res[(name, "idle")], res[(name, "loaded")]
        print(f"  {name}: loaded / idle = {l_['wall_s'] / i['wall_s']:.2f}x  "
              f"({l_['s_per_step'] / i['s_per_step']:.2f}x)")
    if a.before:
        for load in ("idle", "loaded"):
            for name, _, _ in versions[:-1]:
                b, af = res[("before", load)], res[(name, load)]
                print(f"  {load}: before / {name} = {b['wall_s'] / af['wall_s']:.2f}x  "
                      f"({b['s_per_step'] / af['s_per_step']:.2f}x)")
    if a.json:
        a.json.write_text(json.dumps({f"{k[0]}-{k[1]}": v for k, v in res.items()}, indent=1))


if __name__ == "__main__":
    main()
