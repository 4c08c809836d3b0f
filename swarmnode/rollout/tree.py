"""The RolloutTree data model (docs/reference/design.md §4).

One prompt; nodes are token segments (token ids, text, behaviour log-probs, the policy version that
produced them); leaves are finished responses with a verified reward. Independent group sampling is the
degenerate tree: a root with ``n`` children (see :meth:`RolloutTree.from_group`). Every advantage
estimator and the wire format take trees.

Node 0 is always the root; it holds no tokens (the prompt lives on the tree). A leaf's completion is the
concatenation of the segments on the path root -> leaf.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Iterator

from swarmnode.tasks.base import TaskRef

FINISH_REASONS = ("eos", "answer", "length", "repetition", "budget", "depth", "pruned")


@dataclass
class TreeNode:
    """One segment of a rollout tree.

    Attributes:
        node_id: index of this node in ``RolloutTree.nodes``.
        parent: parent node id, ``None`` for the root.
        token_ids: the segment's token ids (list[int]); empty for the root.
        text: the decoded text of the segment.
        logprobs: behaviour log-probs of ``token_ids`` under the producing policy (list[float], natural log),
            same length as ``token_ids``; empty when unknown.
        policy_version: optimizer step of the policy that produced the segment.
        children: child node ids.
        finish_reason: for a leaf, why decoding stopped (one of ``FINISH_REASONS``); ``None`` while active.
        reward: verified reward of a leaf (float), ``None`` for inner nodes and unscored leaves.
        visit_count: number of scored leaves in this node's subtree (node statistic, see :meth:`update_stats`).
        reward_sum: sum of those leaves' rewards.
    """

    node_id: int
    parent: int | None
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[float] = field(default_factory=list)
    policy_version: int = 0
    children: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    reward: float | None = None
    visit_count: int = 0
    reward_sum: float = 0.0

    @property
    def is_leaf(self) -> bool:
        return not self.children and self.parent is not None

    @property
    def value(self) -> float:
        """Mean reward of the scored leaves under this node, V(s) in TreeRL; 0.0 if none."""
        return self.reward_sum / self.visit_count if self.visit_count else 0.0


@dataclass
class RolloutTree:
    """All rollouts of one prompt, as a tree of segments.

    Attributes:
        task: the TaskRef this prompt was made from.
        prompt_ids: token ids of the full prompt (chat template applied), list[int].
        prompt_text: the prompt as text.
        nodes: node list; ``nodes[0]`` is the root.
        task_name: task-family name (for metrics).
        model_id: id of the producing model (for off-policy handling of shared trees).
        tokenizer_id: id of the producing tokenizer.
    """

    task: TaskRef
    prompt_ids: list[int]
    prompt_text: str = ""
    nodes: list[TreeNode] = field(default_factory=list)
    task_name: str = ""
    model_id: str = ""
    tokenizer_id: str = ""

    def __post_init__(self) -> None:
        if not self.nodes:
            self.nodes.append(TreeNode(node_id=0, parent=None))

    # ---------------------------------------------------------------- building
    def add_child(
        self,
        parent: int,
        token_ids: list[int],
        text: str = "",
        logprobs: list[float] | None = None,
        policy_version: int = 0,
        finish_reason: str | None = None,
    ) -> int:
        """Append a segment under ``parent`` and return its node id.

        Raises:
            IndexError: ``parent`` is not a node of this tree.
            ValueError: ``logprobs`` is given with a length different from ``token_ids``.
        """
        if not 0 <= parent < len(self.nodes):
            raise IndexError(f"parent {parent} not in tree of {len(self.nodes)} nodes")
        lp = list(logprobs) if logprobs is not None else []
        if lp and len(lp) != len(token_ids):
            raise ValueError(f"logprobs length {len(lp)} != token_ids length {len(token_ids)}")
        nid = len(self.nodes)
        self.nodes.append(
            TreeNode(
                node_id=nid,
                parent=parent,
                token_ids=list(token_ids),
                text=text,
                logprobs=lp,
                policy_version=policy_version,
                finish_reason=finish_reason,
            )
        )
        self.nodes[parent].children.append(nid)
        return nid

    @classmethod
    def from_group(
        cls,
        task: TaskRef,
        prompt_ids: list[int],
        completions: list[list[int]],
        texts: list[str] | None = None,
        logprobs: list[list[float]] | None = None,
        finish_reasons: list[str] | None = None,
        policy_version: int = 0,
        prompt_text: str = "",
        task_name: str = "",
    ) -> "RolloutTree":
        """Independent group sampling as a tree: a root with one child leaf per completion."""
        tree = cls(task=task, prompt_ids=list(prompt_ids), prompt_text=prompt_text, task_name=task_name)
        for i, ids in enumerate(completions):
            tree.add_child(
                0,
                ids,
                text=texts[i] if texts else "",
                logprobs=logprobs[i] if logprobs else None,
                policy_version=policy_version,
                finish_reason=finish_reasons[i] if finish_reasons else "eos",
            )
        return tree

    # ---------------------------------------------------------------- queries
    def leaves(self) -> list[int]:
        """Leaf node ids in node order (a lone root is not a leaf)."""
        return [n.node_id for n in self.nodes if n.is_leaf]

    def path(self, node_id: int) -> list[int]:
        """Node ids from the first segment below the root down to ``node_id`` (root excluded)."""
        out: list[int] = []
        cur: int | None = node_id
        seen = 0
        while cur is not None and cur != 0:
            out.append(cur)
            cur = self.nodes[cur].parent
            seen += 1
            if seen > len(self.nodes):
                raise ValueError("cycle in rollout tree")
        return out[::-1]

    def depth(self, node_id: int) -> int:
        """Number of segments from the root to ``node_id`` (root = 0)."""
        return len(self.path(node_id))

    def completion_ids(self, leaf: int) -> list[int]:
        """Token ids of the completion ending at ``leaf`` (all segments on its path)."""
        return [t for nid in self.path(leaf) for t in self.nodes[nid].token_ids]

    def completion_text(self, leaf: int) -> str:
        """Completion text ending at ``leaf``."""
        return "".join(self.nodes[nid].text for nid in self.path(leaf))

    def completion_logprobs(self, leaf: int) -> list[float] | None:
        """Behaviour log-probs of the completion, or ``None`` if any segment on the path lacks them."""
        out: list[float] = []
        for nid in self.path(leaf):
            n = self.nodes[nid]
            if len(n.logprobs) != len(n.token_ids):
                return None
            out.extend(n.logprobs)
        return out

    def token_segments(self, leaf: int) -> list[int]:
        """For each completion token of ``leaf``, the node id of the segment that produced it."""
        return [nid for nid in self.path(leaf) for _ in self.nodes[nid].token_ids]

    def leaf_rewards(self) -> list[float]:
        """Rewards of the leaves in :meth:`leaves` order. Raises ``ValueError`` if a leaf is unscored."""
        out = []
        for lid in self.leaves():
            r = self.nodes[lid].reward
            if r is None:
                raise ValueError(f"leaf {lid} of task {self.task.key()} has no reward")
            out.append(float(r))
        return out

    def generated_tokens(self) -> int:
        """Tokens actually decoded for this tree (each segment counted once)."""
        return sum(len(n.token_ids) for n in self.nodes)

    def iter_subtree(self, node_id: int) -> Iterator[int]:
        """Node ids of the subtree rooted at ``node_id`` (pre-order)."""
        stack = [node_id]
        while stack:
            nid = stack.pop()
            yield nid
            stack.extend(reversed(self.nodes[nid].children))

    def leaves_under(self, node_id: int) -> list[int]:
        """Leaf ids in the subtree of ``node_id``."""
        return [n for n in self.iter_subtree(node_id) if self.nodes[n].is_leaf]

    def subtree(self, leaves: Iterable[int]) -> "RolloutTree":
        """A new tree with the root, the given leaves and all their ancestors, in the original node order.

        Token ids, text, behaviour log-probs and policy versions are copied; kept leaves keep their finish
        reason and reward, inner nodes get neither; :meth:`update_stats` has run. A kept inner node whose
        children were all dropped cannot occur: only ancestors of kept leaves are kept.

        Args:
            leaves: node ids of leaves of this tree.

        Raises:
            ValueError: an id is not a leaf of this tree (or is the root).
        """
        keep: set[int] = {0}
        wanted = set(leaves)
        for lid in wanted:
            if not (0 < lid < len(self.nodes)) or not self.nodes[lid].is_leaf:
                raise ValueError(f"node {lid} is not a leaf of the tree of task {self.task.key()}")
            cur: int | None = lid
            while cur is not None and cur not in keep:
                keep.add(cur)
                cur = self.nodes[cur].parent
        out = RolloutTree(task=self.task, prompt_ids=list(self.prompt_ids), prompt_text=self.prompt_text,
                          task_name=self.task_name, model_id=self.model_id, tokenizer_id=self.tokenizer_id)
        out.nodes[0].policy_version = self.nodes[0].policy_version
        new_id = {0: 0}
        for i in sorted(keep):
            if i == 0:
                continue
            n = self.nodes[i]
            is_leaf = i in wanted
            nid = out.add_child(new_id[n.parent], list(n.token_ids), text=n.text,
                                logprobs=list(n.logprobs) or None, policy_version=n.policy_version,
                                finish_reason=n.finish_reason if is_leaf else None)
            if is_leaf:
                out.nodes[nid].reward = n.reward
            new_id[i] = nid
        out.update_stats()
        return out

    def pruned_leaves(self) -> list[int]:
        """Leaves the sampler cut as near-duplicates of a sibling (``finish_reason == "pruned"``)."""
        return [i for i in self.leaves() if self.nodes[i].finish_reason == "pruned"]

    def without_pruned(self) -> "RolloutTree":
        """This tree without the sampler's pruned leaves (and the segments only they used): what is scored
        and trained on.

        A pruned leaf is an unfinished copy of a sibling's continuation. LATR (arXiv 2510.24302; docs/reference/references.md
        §1.4 step 6) drops pruned branches instead of training on them: scoring one would give an unfinished
        answer a reward of 0 and push down a prefix that its sibling may finish correctly. Returns ``self``
        when nothing was pruned.
        """
        if not self.pruned_leaves():
            return self
        return self.subtree([i for i in self.leaves() if self.nodes[i].finish_reason != "pruned"])

    def update_stats(self) -> None:
        """Recompute ``visit_count`` and ``reward_sum`` of every node from the scored leaves under it."""
        for n in self.nodes:
            n.visit_count, n.reward_sum = 0, 0.0
        for lid in self.leaves():
            r = self.nodes[lid].reward
            if r is None:
                continue
            cur: int | None = lid
            while cur is not None:
                self.nodes[cur].visit_count += 1
                self.nodes[cur].reward_sum += float(r)
                cur = self.nodes[cur].parent
