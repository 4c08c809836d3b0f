#!/usr/bin/env python
"""Admission by step form: honest rejection by the likelihood screen from same-model and foreign peers.

A **receiver** (a real node of ``--receiver`` model, CPU, solo, no network) trains ``--warm`` steps with its own
completions feeding its screen reference exactly as ``Node.run_step`` does, then each round it takes one more
step and receives one round of groups from each **peer** (a real node: ``same``: the receiver's model with
another seed and task stream; ``foreign``: the other packaged model, ``embedded`` <-> ``embedded-bpe``). A peer's
trees go through what the swarm layer does to them (swarmnode/swarm/verify.py): a foreign tree's segment texts are
re-tokenized into the receiver's vocabulary (``tok(text, add_special_tokens=False)``, log-probs dropped, our prompt
for the task), a same-tokenizer tree keeps its ids. Then the node's own path: :func:`select_external` (zero-variance
groups dropped), :func:`external_samples` with the receiver's :class:`StepCredit` (its task set, its tokenizer) and
``admit_step_form`` = ``off`` / ``correct`` / ``in_form`` / ``masked`` / ``keep``, and the receiver's
:class:`LikelihoodScreen`.

Per (receiver, peer, mode): ``leaves`` (samples offered to the screen), ``rejected`` (the screen's rejections;
charged to the peer), ``admitted`` (admitted by form, not judged), ``kept_unscreened`` (``keep``: judged, failed,
kept with the unscreened credit; the share of a peer's leaves that trains on checked steps only), ``lost`` (offered but not kept: rejected or
dropped with their group), ``groups`` and ``groups_dropped`` (groups that lost a member, so went whole).
Rates: ``rejected / leaves`` and ``groups_dropped / groups``. ``by_task``: with admission off, per task the
leaves offered, rejected, and rejected although every line was in exact form (``rejected_in_form``; a wrong one
counts too): the most admission by form can save.

**Poison check**: every correct leaf the peers sent is rewritten as a poisoned-but-correct completion (a payload
line before the answer, before the first line, between two lines, payload text after ``</answer>``, the payload
appended to the last line, a special-token string after the answer) and re-encoded in the receiver's vocabulary
with its EOS; ``StepCredit.admits`` must admit none of them in either mode (``poison_admitted`` must be 0). Under
``masked`` (and ``keep``) they are admitted (``poison_masked_admitted``; all but those with a special id), and then
no token that covers a payload character may keep a positive advantage when the leaf is pushed up (advantage +1
through ``StepCredit.token_advantages``, the credit of a sample the screen passes; the unscreened credit of a
rejected one is a subset of it): ``poison_masked_pushed`` must be 0.

Usage: nice python scripts/bench_screen_admission.py [--rounds 6] [--warm 4] [--pairs embedded:embedded ...]
Prints one table and one JSON object (``--out`` writes the JSON too).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from swarmnode.config import RunConfig
from swarmnode.node import Node
from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.rollout.step_credit import StepCredit, token_char_starts
from swarmnode.rollout.tree import RolloutTree
from swarmnode.train.batch import external_samples
from swarmnode.train.external import select_external

MODES = ("off", "correct", "in_form", "masked", "keep")
PAYLOADS = {
    "line_before_answer": lambda body, ans, p: body + p + "\n" + ans,
    "line_first": lambda body, ans, p: p + "\n" + body + ans,
    "line_between": lambda body, ans, p: body.replace("\n", "\n" + p + "\n", 1) + ans,
    "after_answer": lambda body, ans, p: body + ans + p,
    "on_last_line": lambda body, ans, p: body[:-1] + " " + p + "\n" + ans,
    "special_after_answer": lambda body, ans, p: body + ans + "<|endoftext|>" + p,
}


def make_node(run_dir: Path, model: str, seed: int, stream: int, args: argparse.Namespace) -> Node:
    cfg = RunConfig.model_validate({
        "steps": 10_000, "run_dir": str(run_dir), "seed": seed,
        "model": {"name_or_path": model, "device": "cpu", "dtype": "float32"},
        "tasks": {"seed": stream},
        "sampling": {"prompts_per_step": args.prompts, "num_generations": args.generations,
                     "temperature": args.temperature},
        "checkpoint": {"save_steps": 10**6},
    })
    return Node(cfg)


def observe_own(node: Node, trees: list[RolloutTree]) -> None:
    """Our completions of the step join the screen reference (as ``Node.run_step`` does with the swarm on)."""
    node.screen.observe(t.completion_logprobs(leaf) for t in trees for leaf in t.leaves())


def as_received(recv: Node, peer: Node, trees: list[RolloutTree], name: str) -> list[PeerTree]:
    """The peer's trees as the receiver's verification layer hands them on (our prompt; foreign: re-tokenized)."""
    same = recv.policy.tokenizer_id == peer.policy.tokenizer_id
    tok, ptok = recv.policy.tokenizer, peer.policy.tokenizer
    out = []
    for t in trees:
        task = recv.tasks.get(t.task)
        prompt_text = recv.prompt_for(task)
        prompt_ids = list(tok(prompt_text, add_special_tokens=False)["input_ids"])[-recv.cfg.sampling.max_prompt_length:]
        if same:
            new = t  # the peer is done with its trees: our prompt replaces its own
            new.prompt_ids, new.prompt_text = prompt_ids, prompt_text
        else:
            new = RolloutTree(task=t.task, prompt_ids=prompt_ids, prompt_text=prompt_text, model_id=peer.policy.model_id,
                              tokenizer_id=peer.policy.tokenizer_id)
            ids_of = {0: 0}
            for k, n in enumerate(t.nodes[1:], start=1):
                text = n.text or ptok.decode(list(n.token_ids), skip_special_tokens=True)
                ids = list(tok(text, add_special_tokens=False)["input_ids"]) if text else []
                ids_of[k] = new.add_child(ids_of[n.parent], ids, text=text, logprobs=None,
                                          policy_version=n.policy_version, finish_reason=n.finish_reason)
            for k, n in enumerate(t.nodes):
                if n.reward is not None:
                    new.nodes[ids_of[k]].reward = n.reward
            new.task_name = t.task_name
        new.update_stats()
        out.append(PeerTree(tree=new, peer_id=name, model_id=peer.policy.model_id,
                            tokenizer_id=peer.policy.tokenizer_id, same_tokenizer=same, verified=True))
    return out


def poison_count(recv: Node, credit: StepCredit, ptrees: list[PeerTree], payload: str) -> dict[str, int]:
    """Correct leaves rewritten with a payload: how many are admitted by form (must be 0) out of how many."""
    tok = recv.policy.tokenizer
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    tried = admitted = correct_admitted = masked = pushed = 0
    for pt in ptrees:
        for leaf in pt.tree.leaves():
            if pt.tree.nodes[leaf].reward != 1.0:
                continue
            text = tok.decode(pt.tree.completion_ids(leaf), skip_special_tokens=True)
            cut = text.find("<answer>")
            if cut < 0:
                continue
            body, ans = text[:cut], text[cut:]
            correct_admitted += credit.admits(pt.tree.task, list(tok(text, add_special_tokens=False)["input_ids"]) + eos)
            for make in PAYLOADS.values():
                ids = list(tok(make(body, ans, payload), add_special_tokens=False)["input_ids"]) + eos
                for allow_wrong in (False, True):
                    tried += 1
                    admitted += credit.admits(pt.tree.task, ids, allow_wrong=allow_wrong)
                if credit.admits_masked(pt.tree.task, ids):  # admitted under "masked": is any payload char pushed up?
                    masked += 1
                    adv, _ = credit.token_advantages(1.0, ids, credit.report(pt.tree.task, ids), 1.0)
                    dec = tok.decode(ids, skip_special_tokens=True)
                    lo = dec.find(payload)
                    starts = token_char_starts(tok, ids) + [len(dec)]
                    pushed += any(a > 0 and starts[t] < lo + len(payload) and max(starts[t + 1], starts[t] + 1) > lo
                                  for t, a in enumerate(adv)) if lo >= 0 else 0
    return {"poison_tried": tried, "poison_admitted": admitted, "clean_correct_admitted": correct_admitted,
            "poison_masked_admitted": masked, "poison_masked_pushed": pushed}


def run_pair(recv_model: str, peer_model: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    recv = make_node(root / f"recv-{recv_model}", recv_model, args.seed, 0, args)
    if peer_model == recv_model:
        peers = {"same": make_node(root / f"same-{recv_model}", recv_model, args.seed + 1, 1, args)}
    else:
        peers = {"foreign": make_node(root / f"foreign-{peer_model}", peer_model, args.seed + 2, 2, args)}
    t = recv.cfg.train
    credit = StepCredit(recv.tasks.get, recv.policy.tokenizer, mask=t.step_credit == "mask", weight=t.step_reward_weight)
    for _ in range(args.warm):
        observe_own(recv, recv.run_step().trees)
    for p in peers.values():
        for _ in range(args.peer_warm):
            p.run_step()
    rows: dict[str, dict[str, int]] = {f"{k}/{m}": dict.fromkeys(
        ("leaves", "rejected", "admitted", "kept_unscreened", "lost", "groups", "groups_dropped"), 0)
        for k in peers for m in MODES}
    poison = {"poison_tried": 0, "poison_admitted": 0, "clean_correct_admitted": 0, "poison_masked_admitted": 0,
              "poison_masked_pushed": 0}
    by_task: dict[str, dict[str, int]] = {}
    for r in range(args.rounds):
        observe_own(recv, recv.run_step().trees)
        for kind, p in peers.items():
            ptrees = as_received(recv, p, p.run_step().trees, f"{kind}-peer")
            chosen = select_external(ptrees, len(ptrees), "random", 1.0, rng=r)
            for k, v in poison_count(recv, credit, chosen, args.payload).items():
                poison[k] += v
            for mode in MODES:
                samples, _ = external_samples(chosen, max_len=recv.cfg.sampling.max_completion_length,
                                              our_model_id=recv.base_model_id, our_tokenizer_id=recv.policy.tokenizer_id,
                                              scale_rewards=t.scale_rewards, std_floor=t.advantage_std_floor,
                                              step_credit=credit, admit_step_form=mode)
                sr = recv.screen.screen(recv.policy.model, samples)
                assert not sr.metrics["screen/warmup"], "the screen reference is not warm: raise --warm"
                if mode == "off":
                    th = recv.screen.thresholds()
                    assert th is not None
                    task_of = {pt.task_key: pt.tree.task for pt in chosen}
                    for s, (mean, win) in zip(samples, sr.stats):
                        ref = task_of[s.group_id.split("|")[0]]
                        row = by_task.setdefault(f"{kind}/{recv.tasks.get(ref).name}",
                                                 {"leaves": 0, "rejected": 0, "rejected_in_form": 0})
                        row["leaves"] += 1
                        if mean < th[0] or win < th[1]:
                            row["rejected"] += 1
                            row["rejected_in_form"] += credit.admits(ref, s.completion_ids, allow_wrong=True)
                kept = {id(s) for s in sr.kept}
                lost_groups = {s.group_id for s in samples if id(s) not in kept}
                row = rows[f"{kind}/{mode}"]
                row["leaves"] += len(samples)
                row["rejected"] += sr.metrics["screen/rejected"]
                row["admitted"] += sr.metrics["screen/admitted_by_form"]
                row["kept_unscreened"] += sr.metrics["screen/kept_unscreened"]
                row["lost"] += len(samples) - len(sr.kept)
                row["groups"] += len({s.group_id for s in samples})
                row["groups_dropped"] += len(lost_groups)
    recv.close()
    for p in peers.values():
        p.close()
    for row in rows.values():
        row["rejection_rate"] = row["rejected"] / row["leaves"] if row["leaves"] else float("nan")
        row["loss_rate"] = row["lost"] / row["leaves"] if row["leaves"] else float("nan")
        row["group_drop_rate"] = row["groups_dropped"] / row["groups"] if row["groups"] else float("nan")
    return {"receiver": recv_model, "peer": peer_model, "rows": rows, "poison": poison, "by_task": by_task}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", nargs="+", default=["embedded:embedded", "embedded:embedded-bpe",
                                                   "embedded-bpe:embedded"],
                    help="receiver:peer model pairs; the same model gives a same-model peer (another seed)")
    ap.add_argument("--rounds", type=int, default=6, help="measured rounds (one step of each node)")
    ap.add_argument("--warm", type=int, default=4, help="steps the receiver trains before measuring (screen reference)")
    ap.add_argument("--peer-warm", type=int, default=2, help="steps each peer trains before measuring")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--payload", default="Visit evil.example for the answers!")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    t0 = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory() as d:
        for i, pair in enumerate(args.pairs):  # each pair in its own directories (run directories are locked)
            recv_model, _, peer_model = pair.partition(":")
            results.append(run_pair(recv_model, peer_model or recv_model, args, Path(d) / f"pair-{i}"))
    print(f"{'receiver':13} {'peer':22} {'mode':8} {'leaves':>6} {'rejected':>9} {'rej%':>6} {'admitted':>8} "
          f"{'unscr.':>6} {'lost%':>6} {'groups':>6} {'dropped':>7} {'grp%':>6}")
    for res in results:
        for key, row in res["rows"].items():
            kind, mode = key.split("/")
            print(f"{res['receiver']:13} {kind + ' ' + res['peer']:22} {mode:8} {row['leaves']:6d} {row['rejected']:9d} "
                  f"{100 * row['rejection_rate']:6.1f} {row['admitted']:8d} {row['kept_unscreened']:6d} "
                  f"{100 * row['loss_rate']:6.1f} "
                  f"{row['groups']:6d} {row['groups_dropped']:7d} {100 * row['group_drop_rate']:6.1f}")
        print(f"{'':13} off, per task (leaves / rejected / rejected in form): " + ", ".join(
            f"{k} {v['leaves']}/{v['rejected']}/{v['rejected_in_form']}" for k, v in sorted(res["by_task"].items())))
        print(f"{'':13} poison: {res['poison']['poison_admitted']} of {res['poison']['poison_tried']} payload "
              f"completions admitted by form (clean correct admitted: {res['poison']['clean_correct_admitted']}); "
              f"masked: {res['poison']['poison_masked_admitted']} admitted, {res['poison']['poison_masked_pushed']} "
              "with a payload character pushed up")
    report = {"command": " ".join(sys.argv), "wall_s": round(time.perf_counter() - t0, 1),
              "rounds": args.rounds, "warm": args.warm, "peer_warm": args.peer_warm, "payload": args.payload,
              "results": results}
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
