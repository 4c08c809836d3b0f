"""The Sample: what the trainer consumes (docs/reference/design.md §4)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Sample:
    """One training sequence.

    Attributes:
        prompt_ids: prompt token ids (list[int]).
        completion_ids: completion token ids (list[int]), length T.
        advantages: per-completion-token advantage (list[float], length T).
        source: ``"local"`` or ``"external:<peer id>"``.
        behaviour_logprobs: log-probs of ``completion_ids`` under the policy that sampled them
            (list[float], length T), or ``None`` when unknown (e.g. another tokenizer).
        loss_mask: 1 for tokens that enter the loss, 0 otherwise (list[int], length T).
        reward: the leaf's verified reward.
        group_id: id of the normalization group (e.g. task key + source).
        policy_version: optimizer step of the producing policy.
        model_id: id of the producing model (``tis`` needs it to equal ours).
        truncated: the completion hit ``max_completion_length`` without EOS.
        admitted_by_form: set by the receiver only (never from a peer's claim): this external completion is
            admitted by its step form (:func:`swarmnode.tasks.steps.admissible_by_form`, checked on our
            regenerated task and the decode of ``completion_ids``), so the likelihood screen does not judge it
            (``external.screen.admit_step_form``).
        unscreened_advantages: set by the receiver only (``external.screen.admit_step_form: keep``): the
            advantages this external sample trains with if the likelihood screen rejects it or is warming up
            (:meth:`swarmnode.rollout.step_credit.StepCredit.unscreened_advantages`: no negative push, a positive
            one only on valid step lines); the sample is then kept with them instead of dropped, and its peer is
            not charged. ``None``: the screen's verdict stands (list[float], length T, or None).
        copied: set by the receiver only: this external completion's normalized text was held from another key (or
            our own rollouts) before its signer sent it (``PeerTree.copied_leaves``); it trains, but its reward
            contrast earns the signer no standing (:func:`swarmnode.train.batch.trained_groups_by_peer`).
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    advantages: list[float]
    source: str = "local"
    behaviour_logprobs: list[float] | None = None
    loss_mask: list[int] = field(default_factory=list)
    reward: float = 0.0
    group_id: str = ""
    policy_version: int = 0
    model_id: str = ""
    truncated: bool = False
    admitted_by_form: bool = False
    unscreened_advantages: list[float] | None = None
    copied: bool = False

    def __post_init__(self) -> None:
        n = len(self.completion_ids)
        if not self.loss_mask:
            self.loss_mask = [1] * n
        if len(self.advantages) != n or len(self.loss_mask) != n:
            raise ValueError(
                f"Sample lengths differ: completion {n}, advantages {len(self.advantages)}, "
                f"loss_mask {len(self.loss_mask)}"
            )
        if self.unscreened_advantages is not None and len(self.unscreened_advantages) != n:
            raise ValueError(f"unscreened_advantages length {len(self.unscreened_advantages)} != completion {n}")
        if self.behaviour_logprobs is not None and len(self.behaviour_logprobs) != n:
            raise ValueError(f"behaviour_logprobs length {len(self.behaviour_logprobs)} != completion {n}")

    @property
    def is_local(self) -> bool:
        return self.source == "local"
