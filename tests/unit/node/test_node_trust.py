"""What peer input can do to training: a real node (embedded HF model, CPU) fed hostile PeerTrees.

The swarm layer here is a small :class:`~swarmnode.node.SwarmHook` that hands the node crafted trees as if
they had passed verification: it stands for whatever gets through, so steps 6-7 must hold on their own.
"""

from __future__ import annotations

import math

import pytest
import torch

from swarmnode.config import RunConfig
from swarmnode.node import Node
from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.rollout.tree import RolloutTree


class CraftedSwarm:
    """A SwarmHook whose ``gather`` returns ``make(node, step)``; records ``charge`` and ``credit`` calls."""

    peer_id = "sn1craftedswarmhook"

    def __init__(self, make):
        self.make = make
        self.node: Node | None = None
        self.charges: list[tuple[str, str, int]] = []
        self.credits: list[tuple[str, int]] = []

    def publish(self, trees, step, policy_version):
        return {}

    def gather(self, step, policy_version):
        return self.make(self.node, step), {}

    def charge(self, peer_id, reason, n=1):
        self.charges.append((peer_id, reason, n))

    def credit(self, peer_id, n=1):
        self.credits.append((peer_id, n))

    def close(self):
        pass


def make_cfg(tmp_path, **external) -> RunConfig:
    return RunConfig.model_validate({
        "steps": 3, "run_dir": str(tmp_path / "run"), "seed": 0,
        "model": {"name_or_path": "embedded", "device": "cpu", "dtype": "float32"},
        "sampling": {"prompts_per_step": 2, "num_generations": 4, "max_completion_length": 12},
        "train": {"micro_batch_size": 8},
        "external": {"num_external": 4, "max_peer_share": 1.0, "max_external_share": 0.5, **external},
        "checkpoint": {"save_steps": 1000},
    })


def honest_like_tree(node: Node, step: int, peer: str, rewards=(1.0, 0.0, 0.0, 1.0)) -> PeerTree:
    """A tree of the node's own kind of completions (greedy-ish digits), our prompt."""
    ref = node.tasks.refs_for_step(step + 1000, 1)[0]
    task = node.tasks.get(ref)
    prompt = node.policy.tokenizer(node.prompt_for(task), add_special_tokens=False)["input_ids"]
    comps = [node.policy.tokenizer(t, add_special_tokens=False)["input_ids"] for t in ("3", "5", "7", "3")]
    tree = RolloutTree.from_group(ref, prompt, comps)
    for lid, r in zip(tree.leaves(), rewards):
        tree.nodes[lid].reward = float(r)
    return PeerTree(tree, peer, model_id=node.base_model_id, tokenizer_id=node.policy.tokenizer_id,
                    policy_version=step, same_tokenizer=True)


def shared_node_tree(node: Node, step: int, n_shared: int = 16_000, leaves: int = 255) -> PeerTree:
    """Outside attack: 255 leaves sharing one 16k-token segment (a ~100 KB bundle)."""
    ref = node.tasks.refs_for_step(step + 2000, 1)[0]
    tree = RolloutTree(task=ref, prompt_ids=[5, 6, 7])
    shared = tree.add_child(0, [9] * n_shared)
    for k in range(leaves):
        leaf = tree.add_child(shared, [10 + k % 5], finish_reason="stop")
        tree.nodes[leaf].reward = float(k % 2)
    return PeerTree(tree, "big", model_id=node.base_model_id, tokenizer_id=node.policy.tokenizer_id,
                    policy_version=step, same_tokenizer=True)


def run_node(cfg: RunConfig, swarm: CraftedSwarm, steps: int = 1) -> tuple[Node, list[dict]]:
    node = Node(cfg, swarm=swarm)
    swarm.node = node
    out = []
    try:
        for _ in range(steps):
            out.append(node.run_step().metrics)
    finally:
        node.close()
    return node, out


def test_shared_node_tree_is_bounded_before_decoding(tmp_path):
    swarm = CraftedSwarm(lambda node, step: [shared_node_tree(node, step)])
    _, (m,) = run_node(make_cfg(tmp_path), swarm)
    assert m["external/max_completion_length"] == 12  # our own sampling.max_completion_length
    assert m["external/dropped_overlong"] == 255 and m["samples_external"] == 0
    assert m["external/failed"] == 0 and m["train/skipped"] in (False, True)


def test_shared_node_tree_truncated_is_capped_by_the_step_token_budget(tmp_path):
    swarm = CraftedSwarm(lambda node, step: [shared_node_tree(node, step), honest_like_tree(node, step, "h")])
    cfg = make_cfg(tmp_path, external_length_policy="truncate", max_external_tokens_per_step=1000)
    _, (m,) = run_node(cfg, swarm)
    # 255 x (3 + 12) = 3825 tokens > 1000: the big tree is skipped as a whole, the honest one is taken
    assert m["select/dropped_token_budget"] == 1 and m["select/selected"] == 1
    assert m["select/tokens"] <= 1000


def test_only_trees_the_node_trained_on_earn_their_peer_standing(tmp_path):
    """Outside attack (2026-12-05): standing was earned at admission, so a junk tree over the per-step
    token budget -- admitted, never selected, never screened -- made a fresh key established in 16 steps. Now the
    node credits a peer only for groups it trained on (after its update), each with reward contrast."""
    def junk_over_budget(node, step):  # 80 mixed leaves of 3 + 12 tokens: over the 1,000-token budget
        ref = node.tasks.refs_for_step(step + 4000, 1)[0]
        tree = RolloutTree.from_group(ref, [5, 6, 7], [[10 + k % 5] * 12 for k in range(80)])
        for k, lid in enumerate(tree.leaves()):
            tree.nodes[lid].reward = float(k % 2)
        return PeerTree(tree, "junk", model_id=node.base_model_id, tokenizer_id=node.policy.tokenizer_id,
                        policy_version=step, same_tokenizer=True)

    swarm = CraftedSwarm(lambda node, step: [junk_over_budget(node, step), honest_like_tree(node, step, "h"),
                                             honest_like_tree(node, step, "flat", rewards=(1.0,) * 4)])
    cfg = make_cfg(tmp_path / "off", max_external_tokens_per_step=1000, max_external_share=1.0,
                   screen={"enabled": False})
    _, ms = run_node(cfg, swarm, steps=3)
    assert all(m["select/dropped_token_budget"] == 1 and m["samples_external"] > 0 for m in ms)
    assert all(m["external:h/used"] > 0 for m in ms)
    assert swarm.credits == [("h", 1)] * 3  # not the junk over budget, not the tree without contrast
    # with the screen on but still in warm-up (it judges nothing), nothing earns standing (a payload
    # key earned 3 in the first steps) and no external sample trains at all (an outside attack trained a payload line
    # in the first steps of a node with fewer local leaves per step than min_history)
    swarm = CraftedSwarm(swarm.make)
    cfg = make_cfg(tmp_path / "warm", max_external_tokens_per_step=1000, max_external_share=1.0,
                   screen={"enabled": True, "min_history": 10_000})
    _, ms = run_node(cfg, swarm, steps=2)
    assert all(m["screen/warmup"] == 1 and m["screen/warmup_held"] > 0 for m in ms) and swarm.credits == []
    assert all(m["samples_external"] == 0 and m.get("external:h/used", 0) == 0 for m in ms)
    assert [m["step"] for m in ms] == [1, 2] and swarm.charges == []  # the node steps, nobody is charged


def test_processing_failure_is_dropped_and_counted(tmp_path):
    def make(node, step):
        t = honest_like_tree(node, step, "nan")
        t.tree.nodes[t.tree.leaves()[0]].reward = math.nan  # rewards() raises ValueError inside processing
        return [t]

    swarm = CraftedSwarm(make)
    node, ms = run_node(make_cfg(tmp_path), swarm, steps=2)
    assert all(m["external/failed"] == 1 and m["external/failed_stage"] == "process" for m in ms)
    assert node.step == 2 and all(m["samples_external"] == 0 for m in ms)


def test_training_failure_on_external_samples_redoes_the_step_on_local_samples(tmp_path):
    def make(node, step):
        t = honest_like_tree(node, step, "oob")
        bad = t.tree.leaves()[1]  # a wrong leaf: its negative advantage trains (an id without text of its own
        # takes no positive push from the step credit, so a right leaf's would not reach the forward)
        t.tree.nodes[bad].token_ids = [10_000]  # outside the embedding: IndexError in the forward
        return [t]

    cfg = make_cfg(tmp_path, screen={"enabled": False}, max_external_share=1.0)
    swarm = CraftedSwarm(make)
    node = Node(cfg, swarm=swarm)
    swarm.node = node
    try:
        before = [p.detach().clone() for p in node.trainer.params]
        m = node.run_step().metrics
        assert m["external/failed"] == 1 and m["external/failed_stage"] == "train"
        assert m["external/failed_samples"] >= 1 and m["samples_external"] == 0
        assert node.step == 1 and all(p.grad is None for p in node.trainer.params)
        if not m["train/skipped"]:  # the local-only step trained
            assert any(not torch.equal(a, p.detach()) for a, p in zip(before, node.trainer.params))
        m2 = node.run_step().metrics
        assert node.step == 2 and m2["external/failed"] == 1
    finally:
        node.close()


def test_local_failures_are_not_swallowed(tmp_path):
    swarm = CraftedSwarm(lambda node, step: [])
    node = Node(make_cfg(tmp_path), swarm=swarm)
    swarm.node = node
    try:
        def boom(*a, **k):
            raise RuntimeError("our own bug")

        node.trainer.step = boom  # no external sample in the batch: the error is ours and must surface
        with pytest.raises(RuntimeError, match="our own bug"):
            node.run_step()
    finally:
        node.close()


def test_payload_carriers_are_screened_and_charged_to_their_peer(tmp_path):
    def make(node, step):
        t = honest_like_tree(node, step, "pay")
        tok = node.policy.tokenizer
        for lid in t.tree.leaves():
            t.tree.nodes[lid].token_ids = tok("zq#pwned!<answer>3</answer>", add_special_tokens=False)["input_ids"]
        return [t]

    cfg = make_cfg(tmp_path, screen={"min_history": 8}, max_external_share=1.0)
    swarm = CraftedSwarm(make)
    _, ms = run_node(cfg, swarm, steps=2)
    assert all(m["screen/warmup"] == 0 and m["screen/checked"] == 4 for m in ms)
    assert all(m["screen/rejected"] == 4 and m["samples_external"] == 0 for m in ms)
    assert swarm.charges == [("pay", "likelihood_screen", 4)] * 2
    assert swarm.credits == []  # what the screen throws out earns no standing


def worked_tree(node: Node, step: int, peer: str = "steps") -> PeerTree:
    """Two right worked solutions and two with every line right but a wrong answer, of a task from our mix."""
    from swarmnode.tasks.solutions import worked_solution

    ref = node.tasks.refs_for_step(step + 3000, 1)[0]
    task = node.tasks.get(ref)
    sol = worked_solution(task.name, {"question": task.question, "answer": task.answer, "metadata": task.metadata})
    wrong = sol[: sol.index("<answer>")] + "<answer>999</answer>"
    tok = node.policy.tokenizer
    prompt = tok(node.prompt_for(task), add_special_tokens=False)["input_ids"]
    tree = RolloutTree.from_group(ref, prompt, [tok(t, add_special_tokens=False)["input_ids"]
                                                for t in (sol, wrong, sol, wrong)])
    for lid, text in zip(tree.leaves(), (sol, wrong, sol, wrong)):
        tree.nodes[lid].reward = float(node.tasks.score_detail(task, text)["correct"])
    return PeerTree(tree, peer, model_id=node.base_model_id, tokenizer_id=node.policy.tokenizer_id,
                    policy_version=step, same_tokenizer=True)


@pytest.mark.parametrize("on", [True, False])
def test_peers_worked_solutions_get_our_step_credit(tmp_path, on):
    cfg = make_cfg(tmp_path, screen={"enabled": False}, max_external_share=1.0, external_step_credit=on)
    d = cfg.model_dump()  # validated again, so the external length cap derived from it follows too
    d["sampling"]["max_completion_length"] = 160
    cfg = RunConfig.model_validate(d)
    _, (m,) = run_node(cfg, CraftedSwarm(lambda node, step: [worked_tree(node, step)]))
    assert m["external/failed"] == 0 and m["samples_external"] == 4
    if on:  # every line of the wrong-answer completions is right: its tokens are not pushed down
        assert m["external/step_checked"] == 4 and m["external/step_zeroed_tokens"] > 0
    else:
        assert m["external/step_checked"] == 0 == m["external/step_zeroed_tokens"]
