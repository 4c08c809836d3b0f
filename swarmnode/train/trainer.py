"""The optimizer step: clipped policy gradient over a batch of :class:`Sample` s (docs/reference/design.md §5).

One :meth:`Trainer.step` call consumes one generation batch and performs ``num_iterations`` (μ, TRL's name)
optimizer updates on it. Each update walks the batch in micro-batches of ``micro_batch_size`` sequences
(forward + backward each, so activation memory is bounded by the micro-batch), with the loss normalized by
the *global* counts of the batch, so the accumulated gradient equals the full-batch gradient for every
``loss_type`` (see :func:`swarmnode.train.loss.policy_loss`).

Old log-probs follow TRL's rule (docs/reference/references.md §2.2): with μ = 1 the ratio is taken against
``logprobs.detach()`` (ρ ≡ 1, pure on-policy gradient); with μ > 1 the log-probs of the policy *before*
the first update are computed once under ``torch.no_grad()`` and reused for every pass.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Callable, Sequence

import torch

from swarmnode.config import TrainConfig
from swarmnode.train.loss import policy_loss, sequence_logprobs
from swarmnode.train.samples import Sample

TokenWeightFn = Callable[[Sequence[Sample], torch.Tensor, torch.Tensor, torch.Tensor], "torch.Tensor | None"]


def lr_lambda_factory(scheduler_type: str, warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """Multiplier of the base learning rate at scheduler step ``s`` (0-based).

    Warmup: ``(s + 1) / warmup_steps`` for ``s < warmup_steps`` (the first update already moves; no step at
    lr 0). Then ``constant`` 1; ``linear`` ``(T - s) / (T - W)``; ``cosine`` ``0.5 (1 + cos(π p))`` with
    ``p = (s - W) / (T - W)`` — the decay shapes of ``transformers.get_scheduler``, reaching 0 at
    ``s = total_steps`` and clamped at 0 beyond.

    Why not ``transformers.get_scheduler`` itself: with ``warmup_steps = 0`` (the default) the two give the
    same learning rate at every step ``0 … total_steps`` for all three types (``tests/unit/train/test_lr_schedule.py``
    compares them step by step), but they differ where a run can notice:

    - warm-up: ``get_scheduler``'s multiplier is ``s / W``, so its first update runs at learning rate 0 and
      wastes a generated batch; here the first update already moves (``(s + 1) / W``). Switching would change
      the learning rate of every warm-up step of every run with ``warmup_steps > 0``;
    - past ``total_steps`` its cosine rises again (it is a full period of ``cos``); here it stays at 0;
    - its ``constant`` ignores ``warmup_steps`` (warm-up is a separate ``constant_with_warmup``).

    Raises:
        ValueError: unknown ``scheduler_type`` or negative step counts.
    """
    if scheduler_type not in ("constant", "linear", "cosine"):
        raise ValueError(f"unknown lr_scheduler_type {scheduler_type!r}; expected constant, linear or cosine")
    if warmup_steps < 0 or total_steps < 0:
        raise ValueError(f"warmup_steps ({warmup_steps}) and total_steps ({total_steps}) must be >= 0")
    W, T = warmup_steps, total_steps

    def f(s: int) -> float:
        if s < W:
            return (s + 1) / W
        if scheduler_type == "constant":
            return 1.0
        span = max(T - W, 1)
        p = min(max((s - W) / span, 0.0), 1.0)
        if scheduler_type == "linear":
            return 1.0 - p
        return 0.5 * (1.0 + math.cos(math.pi * p))

    return f


def pack_micro_batches(
    samples: Sequence[Sample], max_rows: int, max_tokens: int | None = None
) -> list[list[Sample]]:
    """Split a batch into micro-batches bounded in rows **and** in padded tokens.

    Samples are sorted by total length (prompt + completion; stable, so ties keep batch order) and packed
    greedily: a micro-batch takes the next sample while it has fewer than ``max_rows`` rows and its padded
    size ``rows × (longest prompt + longest completion)`` (the tensor :func:`~swarmnode.train.loss.sequence_logprobs`
    builds: prompts left-padded, completions right-padded) stays within ``max_tokens``. A sample longer
    than ``max_tokens`` alone forms its own micro-batch (it cannot be split). The summed gradient does not
    depend on how the batch is cut (the loss uses global counts).

    Args:
        samples: the batch.
        max_rows: ``train.micro_batch_size`` (>= 1).
        max_tokens: ``train.max_tokens_per_micro_batch`` (>= 1) or ``None`` for rows only.

    Returns:
        Micro-batches (lists of the same Sample objects), every sample exactly once.

    Raises:
        ValueError: ``max_rows < 1`` or ``max_tokens < 1``.
    """
    if int(max_rows) < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {max_rows}")
    if max_tokens is not None and int(max_tokens) < 1:
        raise ValueError(f"max_tokens_per_micro_batch must be >= 1 or None, got {max_tokens}")
    order = sorted(range(len(samples)), key=lambda i: len(samples[i].prompt_ids) + len(samples[i].completion_ids))
    out: list[list[Sample]] = []
    cur: list[Sample] = []
    P = T = 0
    for i in order:
        s = samples[i]
        p, t = max(P, len(s.prompt_ids)), max(T, len(s.completion_ids))
        fits = len(cur) < max_rows and (max_tokens is None or (len(cur) + 1) * (p + t) <= max_tokens)
        if cur and not fits:
            out.append(cur)
            cur, p, t = [], len(s.prompt_ids), len(s.completion_ids)
        cur.append(s)
        P, T = p, t
    if cur:
        out.append(cur)
    return out


class Trainer:
    """Policy-gradient trainer for a Hugging Face causal LM.

    Args:
        model: the policy (``torch.nn.Module`` with the HF causal-LM call convention); trained in place.
            Its dropout should be 0 (RL ratios assume the sampling policy); the model is put in ``train()``
            mode during :meth:`step` (so gradient checkpointing stays active) and its previous mode is
            restored afterwards.
        train_cfg: :class:`~swarmnode.config.TrainConfig` (learning rate, AdamW betas and weight decay,
            ``max_grad_norm``, scheduler, ``loss_type``, ``epsilon`` / ``epsilon_high``, ``beta``,
            ``num_iterations``, ``micro_batch_size``, ``max_tokens_per_micro_batch``: micro-batches are packed
            by rows and by padded tokens, see :func:`pack_micro_batches`).
        max_completion_length: the L of ``dr_grpo`` (sampling's ``max_completion_length``).
        total_steps: number of :meth:`step` calls the LR schedule spans.
        ref_model: frozen reference policy for the k3 KL term. Used only when ``beta > 0``; if ``beta > 0``
            and it is ``None``, a frozen deep copy of ``model`` at construction time is made. Not loaded or
            run at ``beta == 0``.
        temperature: the sampling temperature; logits are divided by it before the log-softmax (TRL).
        pad_token_id: id used for padding in the forward pass (masked, any valid id).

    Optimizer: ``torch.optim.AdamW(lr, betas=(adam_beta1, adam_beta2), weight_decay)`` with weight decay on
    matrices only (parameters with ``ndim >= 2``; biases and norm weights get none, as HF Trainer).
    Scheduler: ``LambdaLR`` with :func:`lr_lambda_factory`; it advances once per :meth:`step` call.

    Raises:
        ValueError: ``max_completion_length < 1``, ``total_steps < 0``, or a model without trainable parameters.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        train_cfg: TrainConfig,
        max_completion_length: int,
        total_steps: int,
        ref_model: torch.nn.Module | None = None,
        temperature: float = 1.0,
        pad_token_id: int = 0,
    ) -> None:
        if max_completion_length < 1:
            raise ValueError(f"max_completion_length must be >= 1, got {max_completion_length}")
        if total_steps < 0:
            raise ValueError(f"total_steps must be >= 0, got {total_steps}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.model = model
        self.cfg = train_cfg
        self.max_completion_length = int(max_completion_length)
        self.total_steps = int(total_steps)
        self.temperature = float(temperature)
        self.pad_token_id = int(pad_token_id)
        self.step_count = 0

        self.ref_model: torch.nn.Module | None = None
        if train_cfg.beta > 0:
            self.ref_model = ref_model if ref_model is not None else copy.deepcopy(model)
            self.ref_model.eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)

        decay, no_decay = [], []
        for p in model.parameters():
            if p.requires_grad:
                (decay if p.ndim >= 2 else no_decay).append(p)
        self.params = decay + no_decay
        if not self.params:
            raise ValueError("model has no trainable parameters (requires_grad is False everywhere)")
        groups = [{"params": decay, "weight_decay": train_cfg.weight_decay}]
        if no_decay:
            groups.append({"params": no_decay, "weight_decay": 0.0})
        self.optimizer = torch.optim.AdamW(
            groups, lr=train_cfg.learning_rate, betas=(train_cfg.adam_beta1, train_cfg.adam_beta2)
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lr_lambda_factory(train_cfg.lr_scheduler_type, train_cfg.warmup_steps, self.total_steps),
        )

    # ------------------------------------------------------------------ helpers
    @property
    def device(self) -> torch.device:
        return self.params[0].device

    @property
    def lr(self) -> float:
        """Learning rate the next update will use."""
        return float(self.optimizer.param_groups[0]["lr"])

    def _micro_batches(self, samples: Sequence[Sample]) -> list[list[Sample]]:
        return pack_micro_batches(samples, self.cfg.micro_batch_size, self.cfg.max_tokens_per_micro_batch)

    def _logprobs(self, model: torch.nn.Module, mb: Sequence[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
        return sequence_logprobs(
            model,
            [s.prompt_ids for s in mb],
            [s.completion_ids for s in mb],
            temperature=self.temperature,
            pad_token_id=self.pad_token_id,
        )

    def _pad(self, rows: list[list[float]], T: int, dtype: torch.dtype) -> torch.Tensor:
        out = torch.zeros((len(rows), T), dtype=dtype)
        for i, r in enumerate(rows):
            if r:
                out[i, : len(r)] = torch.tensor(r, dtype=dtype)
        return out.to(self.device)

    @staticmethod
    def _validate(samples: Sequence[Sample]) -> None:
        for i, s in enumerate(samples):
            if not isinstance(s, Sample):
                raise TypeError(f"samples[{i}] is a {type(s).__name__}, expected swarmnode.train.samples.Sample")
            if not s.prompt_ids:
                raise ValueError(f"samples[{i}] has an empty prompt")
            if not all(math.isfinite(a) for a in s.advantages):
                raise ValueError(f"samples[{i}] has a non-finite advantage")

    # ------------------------------------------------------------------ public
    def accumulate_gradients(
        self,
        samples: Sequence[Sample],
        old_logprobs: list[torch.Tensor] | None = None,
        ref_logprobs: list[torch.Tensor] | None = None,
        token_weight_fn: TokenWeightFn | None = None,
    ) -> dict[str, float]:
        """Zero the gradients, then forward/backward every micro-batch; leaves the full-batch ``.grad``.

        No optimizer step. ``old_logprobs`` / ``ref_logprobs`` are per-micro-batch tensors in the order of
        the micro-batches this method builds (see :meth:`precompute_logprobs`); ``None`` means ratio 1 /
        no KL. Returns the loss (full-batch value) and token-weighted metrics.
        """
        self._validate(samples)
        mbs = self._micro_batches(samples)
        num_items = float(sum(sum(1 for v in s.loss_mask if v) for s in samples))
        num_seq = len(samples)
        self.optimizer.zero_grad(set_to_none=True)
        was_training = self.model.training
        self.model.train()
        try:
            return self._accumulate(mbs, num_items, num_seq, old_logprobs, ref_logprobs, token_weight_fn)
        finally:
            self.model.train(was_training)

    def _accumulate(self, mbs, num_items, num_seq, old_logprobs, ref_logprobs, token_weight_fn) -> dict[str, float]:
        total_loss = 0.0
        acc: dict[str, float] = {}
        tok = 0.0
        for k, mb in enumerate(mbs):
            lp, m = self._logprobs(self.model, mb)
            T = lp.shape[1]
            loss_mask = self._pad([[float(v) for v in s.loss_mask] for s in mb], T, torch.float32) * m
            adv = self._pad([list(s.advantages) for s in mb], T, torch.float32)
            old = old_logprobs[k] if old_logprobs is not None else lp.detach()
            ref = ref_logprobs[k] if ref_logprobs is not None else None
            w = token_weight_fn(mb, lp.detach(), old, loss_mask) if token_weight_fn is not None else None
            loss, met = policy_loss(
                lp,
                old,
                adv,
                loss_mask,
                loss_type=self.cfg.loss_type,
                epsilon=self.cfg.epsilon,
                epsilon_high=self.cfg.epsilon_high,
                beta=self.cfg.beta if ref is not None else 0.0,
                ref_logprobs=ref,
                max_completion_length=self.max_completion_length,
                num_items=num_items,
                num_sequences=num_seq,
                token_weights=w,
            )
            if loss.requires_grad:
                loss.backward()
            total_loss += float(loss.detach().item())
            n = met.pop("active_tokens")
            tok += n
            for key, v in met.items():
                acc[key] = acc.get(key, 0.0) + v * n
        out = {key: (v / tok if tok else 0.0) for key, v in acc.items()}
        out["loss"] = total_loss
        out["tokens"] = tok
        return out

    @torch.no_grad()
    def precompute_logprobs(self, model: torch.nn.Module, samples: Sequence[Sample]) -> list[torch.Tensor]:
        """Log-probs of ``samples`` under ``model`` (no grad), one [b, T] tensor per micro-batch of this trainer."""
        was_training = model.training
        out = [self._logprobs(model, mb)[0] for mb in self._micro_batches(samples)]
        model.train(was_training)
        return out

    def step(self, samples: Sequence[Sample], token_weight_fn: TokenWeightFn | None = None) -> dict[str, Any]:
        """One policy update on a generation batch (``num_iterations`` optimizer updates).

        Args:
            samples: the batch. Tokens with ``loss_mask == 0`` do not enter the loss or the token count.
            token_weight_fn: optional hook ``(micro_batch_samples, logprobs [b,T] detached, old_logprobs
                [b,T], loss_mask [b,T]) -> weights [b,T] or None`` for off-policy modes (see
                :func:`swarmnode.train.loss.policy_loss`).

        Returns:
            Metrics: ``skipped`` (bool) and, if skipped, ``skip_reason``; otherwise ``loss`` (full-batch loss,
            mean over the μ passes), ``grad_norm`` (pre-clip global L2 norm, mean over passes), ``lr`` (used
            by this step), ``clip_low_frac``, ``clip_high_frac``, ``clip_region_frac``, ``ratio_mean``,
            ``advantage_mean``, ``kl`` (when β > 0), ``tokens`` (loss tokens in the batch), ``sequences``,
            ``iterations``, ``nonfinite_updates`` (passes skipped for a non-finite gradient), ``step``.
            An empty batch, or one without any loss token, performs no update and does not advance the
            schedule.
        """
        if not samples:
            return {"skipped": True, "skip_reason": "empty batch", "step": self.step_count}
        self._validate(samples)
        num_items = sum(sum(1 for v in s.loss_mask if v) for s in samples)
        if num_items == 0:
            return {"skipped": True, "skip_reason": "no loss tokens", "step": self.step_count}
        mu = int(self.cfg.num_iterations)
        lr = self.lr
        was_training = self.model.training
        self.model.train()
        try:
            return self._step(samples, mu, lr, num_items, token_weight_fn)
        finally:
            self.model.train(was_training)

    def _step(self, samples: Sequence[Sample], mu: int, lr: float, num_items: int,
              token_weight_fn: TokenWeightFn | None) -> dict[str, Any]:
        old = self.precompute_logprobs(self.model, samples) if mu > 1 else None
        ref = self.precompute_logprobs(self.ref_model, samples) if self.ref_model is not None else None

        sums: dict[str, float] = {}
        norms: list[float] = []
        nonfinite = 0
        for _ in range(mu):
            met = self.accumulate_gradients(samples, old_logprobs=old, ref_logprobs=ref, token_weight_fn=token_weight_fn)
            gn = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
            gn_f = float(gn.item())
            if math.isfinite(gn_f):
                self.optimizer.step()
                norms.append(gn_f)
            else:
                nonfinite += 1
            self.optimizer.zero_grad(set_to_none=True)
            for k, v in met.items():
                sums[k] = sums.get(k, 0.0) + v
        self.scheduler.step()
        self.step_count += 1
        out: dict[str, Any] = {k: v / mu for k, v in sums.items()}
        out.update(
            skipped=False,
            grad_norm=(sum(norms) / len(norms)) if norms else float("nan"),
            lr=lr,
            tokens=float(num_items),
            sequences=float(len(samples)),
            iterations=float(mu),
            nonfinite_updates=float(nonfinite),
            step=self.step_count,
        )
        return out
