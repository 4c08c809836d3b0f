"""The swarm's config sections, grouped by the layer that reads them: ``swarm`` (with ``swarm.net`` and
``swarm.trust``), ``external`` (with ``external.screen``) and ``levers`` (curriculum, expansion, rescue)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from swarmnode.config.base import _Derived, _fill, _Strict


class ScreenConfig(_Strict):
    """Likelihood screen of external completions (train/screen.py; "Hail to the Thief", arXiv 2511.09780).

    Each external completion is scored under our current policy (one batched no-grad forward); it is rejected
    when its mean token log-prob, or its lowest mean over any ``window`` consecutive tokens, is an outlier
    against the same statistics of our own recent completions (their behaviour log-probs)."""

    enabled: bool = Field(True, description="screen external completions before training on them. Default true")
    window: int = Field(8, ge=1, description="tokens of the sliding window for the windowed-mean statistic. Default 8")
    history: int = Field(
        1024, ge=16, description="how many of our own recent completions form the reference distribution. Default 1024"
    )
    min_history: int = Field(
        32, ge=1, description="our own completions needed before the screen rejects anything (until then it only "
        "counts). Default 32",
    )
    quantile: float = Field(
        0.01, gt=0, lt=0.5, description="lower quantile of our own statistics used as the reference point. Default 0.01"
    )
    margin: float = Field(
        1.0, ge=0, description="nats per token below the reference quantile at which a completion is rejected "
        "(threshold = quantile - margin, for both statistics). Default 1.0",
    )
    max_claim_gap: float | None = Field(
        1.0, ge=0, description="nats/token: a kept external sample whose claimed behaviour log-probs differ from our "
        "own scores by more than this on average loses them, so external.off_policy=tis weighs it with ratio 1 instead "
        "of a capped weight an extreme claim saturates; a sample admitted by its step form is not scored, so its claim "
        "cannot be checked and is dropped too (None = off: claims kept). Default 1.0",
    )
    admit_step_form: Literal["off", "correct", "in_form", "masked", "keep"] = Field(
        "correct", description="admit external completions by their step form instead of their likelihood "
        "(swarmnode/tasks/steps.py admissible_by_form; docs/guide/swarm.md trust rules): for tasks whose every "
        "reasoning line a program checks, a completion that is exactly the task's worked solution (every line in "
        "the exact step form and valid, the needed number of lines, the exact answer, nothing else: no free text "
        "can ride) is not judged by the screen (not rejected, not charged; screen/admitted_by_form). in_form = "
        "also a wrong completion whose every line is in exact form and whose answer follows its last line (only "
        "its numbers differ; admitted only with train.step_credit mask, which keeps its valid lines from being "
        "pushed down). masked = every completion of a task with a step checker, only with train.step_credit mask "
        "(else as correct): the mask leaves a positive advantage only on program-checked text (valid step lines, "
        "the answer tags and a canonical integer answer, the final EOS), so no payload can be pushed up whatever "
        "its likelihood; the screen then judges only tasks without a checker (docs/guide/swarm.md trust rules). In "
        "every mode a completion admitted without the screen keeps no negative advantage and a positive one only "
        "on its valid lines unless it is the worked solution (a junk first line, or one added to every line's "
        "total, turns right steps into pushed-down invalid lines). keep = what masked admits, but still judged "
        "by the screen: one it passes trains with the credit of a screened sample (answer block and negative push "
        "included), one it rejects (or holds in warm-up) is kept with the admitted credit above instead of dropped, "
        "not charged (screen/kept_unscreened): no checked task's completion is lost to the screen. "
        "correct = only the worked solution. off = every external completion is screened. Checked "
        "by us on our regenerated task and the decode of the ids that train; needs our step checks of external "
        "completions (external.external_step_credit with train.step_credit or train.step_reward_weight on); tasks "
        "without a checker are screened as before. Default correct (measured: in_form let no more leaves through the screen, "
        "docs/lab/benchmarks.md \"Admission by step form\")",
    )


class CurriculumConfig(_Strict):
    """Swarm curriculum (swarmnode/tasks/curriculum.py; docs/guide/swarm.md "Swarm curriculum").

    Heartbeats carry the per-task success counts of the sender's recent local samples; a node combines the
    swarm's rates robustly (one vote per peer id, its own included, the median) and reweights its task mix
    toward tasks whose success is near 0.5 (learnability 4p(1-p)), each task's weight kept within
    [min_factor, max_factor] x its configured weight whatever peers claim."""

    enabled: bool = Field(
        False, description="reweight the task mix by the swarm's per-task success rates (and publish ours in "
        "heartbeats). Default false"
    )
    window_steps: int = Field(
        8, ge=1, description="steps of our own local samples that form our per-task success rate. Default 8"
    )
    min_samples: int = Field(
        8, ge=1, description="leaves a rate needs (ours, or a peer's claimed count) to be a vote. Default 8"
    )
    max_age_seconds: float = Field(
        120.0, gt=0, description="seconds: a peer's rates older than this (measured from when WE first read that "
        "heartbeat) are ignored. Default 120"
    )
    max_voters: int = Field(
        1024, ge=0, description="seats: every established peer (at least swarm.trust.established_after useful trained "
        "trees) votes once, whatever its standing, while at most this many are established; beyond that a "
        "uniformly random subset of this many, drawn afresh each step from a secret seed. Young peers get no "
        "seat. Bounds the work per step. Default 1024 (the most peers whose rates the swarm layer keeps)"
    )
    min_factor: float = Field(
        0.5, gt=0, le=1, description="floor of a task's weight as a multiple of its configured weight (success "
        "~0 or ~1). Default 0.5"
    )
    max_factor: float = Field(
        2.0, ge=1, description="ceiling of a task's weight as a multiple of its configured weight (success 0.5). "
        "Default 2.0"
    )


class ExpansionConfig(_Strict):
    """Cross-node tree expansion (swarmnode/rollout/expansion.py; docs/guide/swarm.md "Cross-node tree expansion").

    A node picks, among this step's re-verified peer trees, an inner node whose subtree has mixed outcomes (our
    own re-scores), and continues that prefix with its own policy under its own prompt: the peer's prefix is
    context only (never trained), the continuation tokens are ours with our behaviour log-probs, and every new
    leaf is scored by our verifier. The new group trains as local (on-policy) samples and is not published."""

    enabled: bool = Field(False, description="continue peers' promising prefixes with our policy. Default false")
    max_forks: int = Field(1, ge=1, description="forks (peer prefixes) expanded per step. Default 1")
    num_generations: int = Field(
        4, ge=2, description="continuations sampled from one fork (the new group's size). Default 4"
    )
    min_continuation_tokens: int = Field(
        8, ge=1, description="a fork is used only if at least this many completion TOKENS remain after its prefix "
        "(sampling.max_completion_length minus the prefix). Default 8"
    )


class RescueConfig(_Strict):
    """Rescue of all-wrong groups (swarmnode/train/rescue.py; docs/guide/swarm.md "Rescue").

    An own group (tree) with at least two leaves and no exact-correct leaf has no reward variance: it teaches
    nothing. The node announces such questions (TaskRefs) in its heartbeats (SPEC.md §5.3 ``rescue``); a peer
    with spare budget samples them with its own policy and publishes the trees that have a correct leaf as
    ordinary signed bundles; the asker re-scores them and merges the correct leaves into its own all-wrong group
    (Mutual RL, arXiv 2605.07244; LUFFY arXiv 2504.14945: off-policy correct completions mixed into on-policy
    groups). The helper does not train on what it answers."""

    enabled: bool = Field(
        False, description="announce our all-wrong questions in heartbeats (the optional heartbeat key 'rescue', "
        "SPEC.md §5.3), answer peers' and merge their correct completions. Default false"
    )
    max_requests: int = Field(
        4, ge=1, le=8, description="questions (TaskRefs) announced per heartbeat, the newest pending ones (at most "
        "the wire limit MAX_RESCUE_REFS = 8). Default 4"
    )
    max_age_steps: int = Field(
        4, ge=1, description="steps an own all-wrong group waits for a peer's answer before it expires. Default 4"
    )
    answer_prompts: int = Field(
        2, ge=0, description="spare budget: peers' questions this node samples per step (each one group of "
        "sampling.num_generations completions); 0 = never answer. Default 2"
    )
    max_answers_per_peer: int = Field(
        1, ge=1, description="questions of one asker answered per step. Default 1"
    )
    max_merged: int = Field(
        4, ge=1, description="peer completions our verifier finds exactly correct merged into one own all-wrong "
        "group. Default 4"
    )
    peer_advantage_scale: float = Field(
        1.0, ge=1.0, le=16.0, allow_inf_nan=False,
        description="factor on the advantages of the peer completions merged into an own all-wrong group (the own "
        "wrong leaves keep theirs): a peer's right answer to a question we fail weighs this many times an own "
        "sample of the same advantage, as ReLIFT (arXiv 2506.07527) fine-tunes on solutions to the questions RL "
        "fails. The screen, admission by step form and the step credit mask apply as to any peer sample: on a task "
        "with a step checker, with train.step_credit mask and external.external_step_credit on, a free-text line "
        "of a right answer gets no positive push; elsewhere the factor multiplies whatever the screen lets "
        "through, so keep 1 among untrusted peers on unchecked tasks. 1 = the group's advantages. Default 1",
    )
    min_standing: int = Field(
        1, ge=0, description="earned standing (useful trees we trained on, swarm/peers.py) an asker needs to be "
        "answered in full; askers below it share the young_answers slots. 0 answers anyone. Default 1"
    )
    young_answers: int = Field(
        1, ge=0, description="of the answer_prompts questions answered per step, at most this many go to askers "
        "below min_standing (a newcomer, or a weaker peer whose trees we do not train on, earns no standing with "
        "us, yet its all-wrong questions are where our answers help most); served after the askers with standing, "
        "in queue order (last served, or first asked). A flood of fresh keys shares these slots and costs at most young_answers x 8 "
        "question regenerations a step. 0 = askers without standing are never answered. Default 1"
    )
    skip_after_failures: int = Field(
        3, ge=1, description="an asker whose answered questions got no correct leaf from us this many times in a "
        "row is skipped for skip_steps steps (questions no one can solve cost the asker, not us). Default 3"
    )
    skip_steps: int = Field(
        8, ge=1, description="steps such an asker is skipped. Default 8"
    )


class NetConfig(_Derived, _Strict):
    """The swarm's network layer (``swarm.net``; swarmnode/swarm/: the DHT, gossip.py and the publisher, fetcher,
    scheduler and transport it wires, and the round loop's stop wait): addresses, DHT buckets and timeouts, polling,
    heartbeats, fetch and serve limits and budgets, the bundle store.

    ``None`` defaults are derived here, from the other keys of this section, when the config is validated, so
    readers see plain numbers: ``poll_interval`` = min(2, bucket_seconds / 4), ``gather_budget_seconds`` =
    fetch_timeout, ``publisher_fetch_budget_seconds`` = 2 x fetch_timeout."""

    DERIVED: ClassVar[tuple[str, ...]] = ('poll_interval', 'gather_budget_seconds', 'publisher_fetch_budget_seconds')

    initial_peers: list[str] = Field(default_factory=list, description="bootstrap multiaddrs")
    host_maddrs: list[str] = Field(
        default_factory=lambda: ["/ip4/127.0.0.1/tcp/0"],
        description="libp2p multiaddrs to listen on; default loopback, ephemeral port",
    )
    announce_maddrs: list[str] = Field(
        default_factory=list, description="multiaddrs announced to peers (behind NAT); empty = the listen addresses"
    )
    bucket_seconds: float = Field(30.0, gt=0, description="time bucket of DHT manifest keys")
    read_buckets: int = Field(3, ge=1, le=64, description="how many recent buckets a node reads (at most 64: the keys one DHT read asks for)")
    dht_timeout: float = Field(10.0, gt=0, description="seconds per DHT call")
    fetch_timeout: float = Field(5.0, gt=0, description="seconds per bundle fetch")
    poll_interval: float | None = Field(
        None, gt=0, description="seconds between the fetcher thread's DHT polls; None = min(2, bucket_seconds / 4) "
        "(derived when the config is validated; a dump writes None again)"
    )
    heartbeat_interval: float = Field(10.0, gt=0, description="seconds between the signed heartbeats we publish")
    gather_budget_seconds: float | None = Field(
        None, gt=0, description="seconds one gather (one step) spends verifying fetched bundles; the rest waits for "
        "the next step; None = fetch_timeout (derived when the config is validated; a dump writes None again)"
    )
    stop_wait_seconds: float = Field(
        10.0, ge=0, description="seconds the round loop still waits for a running swarm call (publish) once a stop "
        "was requested (SIGINT/SIGTERM, the memory guard); then it leaves the call behind, skips gather, checkpoints "
        "and exits, so a stop ends well inside a supervisor's grace (swarm up: 120 s) even when the call hangs on "
        "the network; 0 = do not wait. Default 10"
    )
    max_pending_bundles: int = Field(
        32, ge=1, description="fetched bundle bodies waiting for verification (bounded queue; when full, the oldest body of the "
        "publisher holding the most places is dropped and fetched again later)"
    )
    max_concurrent_fetches: int = Field(4, ge=1, description="bundle fetches running at once (fetch worker threads)")
    store_bytes: int = Field(
        32 * 1024 * 1024, ge=1024, description="bytes of bundle bodies kept for serving to peers (LRU; default 32 MiB)"
    )
    fetch_retries: int = Field(
        3, ge=1, description="tries per announced bundle; each try asks the publisher, then up to fetch_relays peers"
    )
    fetch_relays: int = Field(
        2, ge=0, description="other recently seen peers asked per try for a bundle (they may have cached it)"
    )
    max_fetches_per_publisher: int = Field(
        1, ge=1, description="fetches (running or queued) of one publisher's bundles at once while others wait, so "
        "that a publisher whose bodies hang holds at most this many fetch workers (idle workers, all but one, "
        "still go to publishers over this limit or their budget)"
    )
    publisher_fetch_budget_seconds: float | None = Field(
        None, gt=0, description="seconds of fetching one publisher's bundles may take per step (reset at each gather, "
        "at most once per fetch_timeout); a publisher whose bodies hang spends its own budget, not others'; "
        "None = 2 x fetch_timeout (derived when the config is validated; a dump writes None again)"
    )
    max_concurrent_serves: int = Field(
        16, ge=1, description="incoming bundle streams served at once, all peers together (more get 'busy')"
    )
    max_serves_per_peer: int = Field(
        4, ge=1, description="incoming bundle streams served at once for one remote libp2p peer (more get 'busy')"
    )
    serve_first_byte_timeout: float = Field(
        2.0, gt=0, description="seconds a peer may take, after opening a bundle stream, to send its 36-byte request"
    )

    @model_validator(mode="after")
    def _derive(self) -> "NetConfig":
        """Fill the derived values of the keys left unset (a value given explicitly is kept)."""
        _fill(self, "poll_interval", min(2.0, self.bucket_seconds / 4))
        _fill(self, "gather_budget_seconds", float(self.fetch_timeout))
        _fill(self, "publisher_fetch_budget_seconds", 2.0 * float(self.fetch_timeout))
        return self


class TrustConfig(_Derived, _Strict):
    """What the verifier and admission of received bundles enforce (``swarm.trust``; swarmnode/swarm/verify.py,
    peers.py, admission.py, rates.py; docs/guide/swarm.md trust rules): freshness and clock skew, the replay
    window, rate limit and bans, young keys' trees and standing, per-peer tree caps, bundle byte and token caps.

    ``max_young_trees`` left unset is derived by :class:`RunConfig` from ``external.num_external``:
    max(1, num_external // 2)."""

    DERIVED: ClassVar[tuple[str, ...]] = ('max_young_trees',)

    freshness_seconds: float = Field(
        600.0, gt=0, description="seconds: bundles older than this (+ max_clock_skew) are refused; default 600"
    )
    max_clock_skew: float = Field(30.0, ge=0, description="seconds of clock difference tolerated both ways in the "
                                  "freshness check (future and stale); default 30")
    replay_window_seconds: float | None = Field(
        None, gt=0, description="seconds the receiver remembers the normalized content (TaskRef + "
        "completion texts) of every accepted tree, so copies and re-signed replays are dropped (reason replay); "
        "None (default) = until the bounded memory (65,536 trees and leaves, oldest first) evicts it: a tree "
        "re-signed with a fresh time can be trained at any age, so a time window lets replays back in"
    )
    rate_limit_per_minute: float = Field(120.0, gt=0, description="bundles+manifests accepted per peer per minute")
    ban_after: int = Field(3, ge=1, description="hard rejections before a peer is banned")
    ban_seconds: float = Field(600.0, gt=0, description="seconds a banned peer stays banned; default 600")
    young_key_trees: int = Field(
        1, ge=0, description="external trees per step admitted from a key that has earned nothing yet (Sybil "
        "resistance: a key's cap grows with the useful trees it had admitted, see trees_per_earned_tree)"
    )
    trees_per_earned_tree: int = Field(
        4, ge=1, description="useful trained trees a key needs for each extra tree of per-step cap: cap = "
        "min(max_trees_per_peer, young_key_trees + earned // trees_per_earned_tree)"
    )
    max_trees_per_peer: int = Field(8, ge=1, description="most external trees admitted from one key per step")
    established_after: int = Field(
        16, ge=0, description="useful trained trees after which a key is no longer young: an established key's "
        "curriculum votes are trusted and its trees may be expanded (0: every key is established, which turns "
        "the young-key pool off; curriculum votes then need 1 useful tree)"
    )
    max_young_trees: int | None = Field(
        None, ge=0, description="external trees per step admitted from all young keys together, shared round-robin; "
        "None = max(1, external.num_external // 2), so fresh keys together never hold more than half the external "
        "groups (derived when the config is validated; a dump writes None again)"
    )
    max_bundle_bytes: int = Field(
        1024 * 1024, ge=1024,
        description="bytes: size cap of a received bundle, checked before decoding; default 1 MiB (an honest bundle of "
        "8 trees x 8 leaves x 96 tokens is about 0.1 MiB; the bound on memory is this x max_pending_bundles plus "
        "store_bytes)",
    )
    max_bundle_tokens: int = Field(
        131072, ge=1, description="most tokens of one bundle expanded into samples (our prompt + completion per "
        "leaf, so a tree with shared nodes costs what its leaves expand to); checked before any expansion, "
        "larger bundles are rejected (reason too_many_tokens)"
    )


class SwarmConfig(_Strict):
    """Which swarm and who we are (off for a solo node), with its network layer (``net``) and trust rules
    (``trust``). What the trainer does with peers' samples is :class:`ExternalConfig` (``external``), the swarm
    levers are :class:`LeversConfig` (``levers``)."""

    enabled: bool = Field(False, description="join a swarm (off: a solo node); default False")
    swarm_id: str = Field(
        "swarmnode-local", description="name of the swarm; bundles of another swarm id are refused; default "
        "swarmnode-local"
    )
    identity_path: str | None = Field(None, description="Ed25519 PEM key; None = <home>/identity.pem")
    allowlist: list[str] = Field(default_factory=list, description="hex public keys; empty = open swarm")
    net: NetConfig = Field(default_factory=NetConfig, description="the network layer's knobs (swarm.net.*)")
    trust: TrustConfig = Field(
        default_factory=TrustConfig, description="what the verifier and admission enforce (swarm.trust.*)"
    )


class ExternalConfig(_Derived, _Strict):
    """What the trainer does with peers' samples (``external``; swarmnode/train/external.py, batch.py,
    off_policy.py, screen.py, process.py): how many external groups, their shares, selection, staleness and age,
    normalization, off-policy correction, step credit, length policy and caps, and the likelihood screen.

    ``max_external_completion_length`` left unset is derived by :class:`RunConfig` from
    ``sampling.max_completion_length``."""

    DERIVED: ClassVar[tuple[str, ...]] = ('max_external_completion_length',)

    num_external: int = Field(
        4, ge=0, description="SAPO J: external groups per step (SAPO I, the local groups, is sampling.prompts_per_step)"
    )
    max_external_share: float = Field(0.5, ge=0, le=1, description="cap on the external share of a batch")
    max_peer_share: float = Field(0.5, gt=0, le=1, description="cap on one peer's share of external samples")
    selection: Literal["random", "contrast"] = Field(
        "contrast", description="which external groups fill the num_external slots: contrast = highest reward "
        "variance first, random = uniform; default contrast"
    )
    max_staleness: int | None = Field(
        None,
        ge=0,
        description="drop external trees of our own model id more than this many policy versions behind our step; "
        "versions are per-node step counts, so this only makes sense for nodes that start together (None: off)",
    )
    max_age_seconds: float | None = Field(
        600.0, gt=0,
        description="seconds: drop external trees whose body arrived (receiver's clock, PeerTree.received_at) more "
        "than this long ago. Staleness a peer cannot lie about, unlike the signed policy version; default 600 "
        "(None: off)",
    )
    normalization: Literal["per_source", "joint"] = Field(
        "per_source", description="external rewards normalized within their own group (per peer and task; ERILS) "
        "or jointly with local ones; default per_source"
    )
    off_policy: Literal["none", "luffy", "tis"] = Field(
        "none", description="correction for external samples (docs/reference/design.md §5): none = ratio 1 under our policy "
        "(SAPO), luffy = f = p/(p+gamma) shaping, tis = capped importance ratio (same model id only); default none"
    )
    luffy_gamma: float = Field(0.1, gt=0, description="gamma of off_policy luffy; default 0.1")
    tis_cap: float = Field(2.0, gt=1, description="cap C of the importance ratio of off_policy tis; default 2.0")
    external_step_credit: bool = Field(
        True, description="give peers' completions the step-checked credit of our own (train.step_credit and "
        "train.step_reward_weight, checked by us on the re-verified text; docs/reference/step_credit.md). False: external "
        "samples get outcome credit only. Default true"
    )
    max_external_completion_length: int | None = Field(
        None, ge=1, description="most TOKENS of one external completion (root-to-leaf path, in our vocabulary); "
        "longer ones are rejected at verification (reason too_long). None = our sampling.max_completion_length (derived when the config is validated; a dump writes None again)"
    )
    external_length_policy: Literal["drop", "truncate"] = Field(
        "drop", description="an external completion over the length cap is dropped, or truncated and masked; "
        "default drop"
    )
    max_external_tokens_per_step: int = Field(
        32768,
        ge=0,
        description="tokens (prompt + completion, per leaf, after the length cap) of all external samples in one "
        "step, all peers together; a tree is costed by the samples it expands into, before it is decoded, and "
        "skipped when it does not fit. Default 32768",
    )
    screen: ScreenConfig = Field(
        default_factory=lambda: ScreenConfig(),
        description="likelihood screen of external completions under our own policy (train/screen.py)",
    )


class LeversConfig(_Strict):
    """The swarm levers (``levers``; swarmnode/node/levers.py): curriculum, cross-node expansion, rescue."""

    curriculum: CurriculumConfig = Field(
        default_factory=lambda: CurriculumConfig(),
        description="swarm curriculum: task weights from the swarm's per-task success rates (tasks/curriculum.py)",
    )
    expansion: ExpansionConfig = Field(
        default_factory=lambda: ExpansionConfig(),
        description="cross-node tree expansion: continue re-verified peer prefixes with our policy "
        "(rollout/expansion.py)",
    )
    rescue: RescueConfig = Field(
        default_factory=lambda: RescueConfig(),
        description="rescue: peers answer the questions this node got all wrong (train/rescue.py)",
    )
