"""PeerBook: counters by reason, reputation formula, bans and their expiry, rate limits, bounded state."""

from __future__ import annotations

import logging

import pytest

from swarmnode.swarm.peers import UNATTRIBUTED, LogLimiter, PeerBook


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


@pytest.fixture()
def clock() -> FakeClock:
    return FakeClock()


def test_reputation_formula_by_hand(clock):
    pb = PeerBook(ban_after=10, ban_seconds=60, rate_limit_per_minute=60, clock=clock, decay_half_life=100.0)
    assert pb.reputation("p") == 0.5  # unknown peer: the Beta(1, 1) prior
    pb.record_accept("p", 3)
    assert pb.reputation("p") == pytest.approx(4 / 5)  # (3 + 1) / (3 + 2)
    pb.record_reject("p", "reward_mismatch", hard=True)
    assert pb.reputation("p") == pytest.approx(4 / 10)  # (3 + 1) / (3 + 2 + 5*1)
    pb.record_reject("p", "stale", hard=False)
    assert pb.reputation("p") == pytest.approx(4 / 11)
    clock.advance(100.0)  # one half-life: a = 1.5, h = 0.5, s = 0.5
    assert pb.reputation("p") == pytest.approx(2.5 / (1.5 + 2 + 2.5 + 0.5))
    snap = pb.snapshot()["peers"]["p"]
    assert snap["accepted"] == 3 and snap["hard"] == 1 and snap["soft"] == 1  # totals never decay
    assert snap["rejected"] == {"reward_mismatch": 1, "stale": 1}


def test_ban_after_hard_rejections_and_expiry(clock):
    pb = PeerBook(ban_after=3, ban_seconds=600, rate_limit_per_minute=1000, clock=clock)
    assert pb.record_reject("bad", "bad_signature", hard=True) is False
    assert pb.record_reject("bad", "stale", hard=False) is False  # soft: no strike
    assert pb.record_reject("bad", "vocab", hard=True) is False
    assert pb.banned() == []
    assert pb.record_reject("bad", "reward_mismatch", hard=True) is True  # third strike
    assert pb.banned() == ["bad"] and pb.is_banned("bad")
    assert pb.allow("bad") is False
    s = pb.snapshot()
    assert s["banned"] == ["bad"] and s["peers"]["bad"]["bans"] == 1
    assert s["peers"]["bad"]["ban_remaining_s"] == pytest.approx(600.0)
    assert s["peers"]["bad"]["refused_banned"] == 1
    assert s["totals"]["bans"] == 1
    clock.advance(599.0)
    assert pb.is_banned("bad")
    clock.advance(1.5)  # the ban has expired
    assert not pb.is_banned("bad") and pb.banned() == [] and pb.allow("bad") is True
    # strikes were reset by the ban: it takes ban_after more hard rejections to ban again
    assert pb.record_reject("bad", "tree_shape", hard=True) is False
    assert pb.record_reject("bad", "tree_shape", hard=True) is False
    assert pb.record_reject("bad", "tree_shape", hard=True) is True
    assert pb.snapshot()["peers"]["bad"]["bans"] == 2


def test_soft_rejections_never_ban_and_other_peers_unaffected(clock):
    pb = PeerBook(ban_after=1, ban_seconds=60, rate_limit_per_minute=1000, clock=clock)
    for _ in range(50):
        pb.record_reject("noisy", "duplicate", hard=False)
    assert pb.banned() == []
    pb.record_reject("evil", "bad_signature", hard=True)
    assert pb.banned() == ["evil"]
    assert pb.allow("noisy") and pb.allow("honest")


def test_unattributed_bucket_is_never_banned(clock):
    pb = PeerBook(ban_after=1, ban_seconds=60, rate_limit_per_minute=1000, clock=clock)
    for _ in range(5):
        assert pb.record_reject(UNATTRIBUTED, "bad_signature", hard=True) is False
    assert pb.banned() == [] and pb.allow(UNATTRIBUTED)
    assert pb.snapshot()["peers"][UNATTRIBUTED]["hard"] == 5


def test_rate_limit_token_bucket(clock):
    pb = PeerBook(ban_after=3, ban_seconds=60, rate_limit_per_minute=60, clock=clock)  # 1 token/s, burst 60
    assert all(pb.allow("p") for _ in range(60))
    assert pb.allow("p") is False and pb.allow("p") is False
    assert pb.allow("q") is True  # per peer
    clock.advance(1.0)
    assert pb.allow("p") is True
    assert pb.allow("p") is False
    clock.advance(10.0)
    assert sum(pb.allow("p") for _ in range(20)) == 10
    s = pb.snapshot()
    assert s["peers"]["p"]["rate_limited"] == 3 + 10
    assert s["totals"]["rate_limited"] == 13
    # rate-limit refusals do not touch the reputation
    assert s["peers"]["p"]["reputation"] == 0.5


def test_burst_and_refill_cap(clock):
    pb = PeerBook(ban_after=3, ban_seconds=60, rate_limit_per_minute=6, clock=clock, burst=2)  # 0.1 token/s
    assert pb.allow("p") and pb.allow("p") and not pb.allow("p")
    clock.advance(3600.0)  # refill is capped at the burst
    assert pb.allow("p") and pb.allow("p") and not pb.allow("p")


def test_bounded_peer_table_keeps_banned_peers(clock):
    pb = PeerBook(ban_after=1, ban_seconds=600, rate_limit_per_minute=60, clock=clock, max_peers=3)
    pb.record_reject("banned-one", "bad_signature", hard=True)
    for i in range(10):
        clock.advance(1.0)
        pb.record_accept(f"sybil{i}")
    assert len(pb) == 3
    assert "banned-one" in pb and pb.is_banned("banned-one")  # a Sybil flood cannot evict a ban
    assert "sybil9" in pb and "sybil8" in pb and "sybil0" not in pb
    assert pb.snapshot()["forgotten"] == 8


def test_snapshot_totals_and_reasons(clock):
    pb = PeerBook(ban_after=5, ban_seconds=60, rate_limit_per_minute=60, clock=clock)
    pb.record_accept("a", 8)
    pb.record_reject("a", "stale", False)
    pb.record_reject("b", "stale", False)
    pb.record_reject("b", "foreign_task", True)
    s = pb.snapshot()
    assert s["totals"]["accepted"] == 8 and s["totals"]["hard"] == 1 and s["totals"]["soft"] == 2
    assert s["rejected_by_reason"] == {"foreign_task": 1, "stale": 2}
    assert s["tracked"] == 2 and s["banned"] == []
    assert set(s["peers"]["a"]) >= {"accepted", "rejected", "hard", "soft", "reputation", "banned", "bans",
                                    "rate_limited", "strikes"}


def test_unban(clock):
    pb = PeerBook(ban_after=1, ban_seconds=600, rate_limit_per_minute=60, clock=clock)
    pb.record_reject("p", "vocab", True)
    assert pb.is_banned("p")
    pb.unban("p")
    assert not pb.is_banned("p") and pb.allow("p")


def test_invalid_arguments():
    with pytest.raises(ValueError, match="ban_after"):
        PeerBook(ban_after=0)
    with pytest.raises(ValueError, match="rate_limit_per_minute"):
        PeerBook(rate_limit_per_minute=0)
    with pytest.raises(ValueError, match="ban_seconds"):
        PeerBook(ban_seconds=float("nan"))
    with pytest.raises(ValueError, match="max_peers"):
        PeerBook(max_peers=0)


def test_rejection_flood_does_not_flood_logs(clock, caplog):
    pb = PeerBook(ban_after=10**9, ban_seconds=60, rate_limit_per_minute=60, clock=clock, log_per_minute=20)
    with caplog.at_level(logging.INFO, logger="swarmnode.swarm.peers"):
        for i in range(5000):
            pb.record_reject(f"p{i % 7}", "malformed", hard=False, detail="x" * 1000)
    lines = [r for r in caplog.records if r.name == "swarmnode.swarm.peers"]
    assert 1 <= len(lines) <= 20
    assert "malformed" in lines[0].getMessage() and "p0" in lines[0].getMessage()
    assert all(len(r.getMessage()) < 400 for r in lines)  # details are truncated


def test_log_limiter_reports_suppressed_lines(caplog):
    t = FakeClock(0.0)
    lim = LogLimiter(per_minute=2, clock=t)
    lg = logging.getLogger("test_peers.limiter")
    with caplog.at_level(logging.INFO, logger="test_peers.limiter"):
        assert [lim.log(lg, logging.INFO, "line %d", i) for i in range(5)] == [True, True, False, False, False]
        t.advance(30.0)  # one token back (2 per minute)
        assert lim.log(lg, logging.INFO, "later") is True
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs == ["line 0", "line 1", "later (3 similar log lines suppressed)"]


def test_earned_standing_grows_the_tree_cap_and_a_hard_rejection_resets_it(clock):
    pb = PeerBook(ban_after=10, ban_seconds=60, rate_limit_per_minute=60, clock=clock)
    assert pb.earned("new") == 0 and pb.is_young("new", 8) and "new" not in pb  # asking creates nothing
    assert pb.tree_cap("new", base=1, per=4, ceiling=6) == 1
    pb.record_earned("p", 3)
    assert pb.tree_cap("p", base=1, per=4, ceiling=6) == 1  # 1 + 3 // 4
    pb.record_earned("p", 5)
    assert pb.earned("p") == 8 and pb.tree_cap("p", base=1, per=4, ceiling=6) == 3  # 1 + 8 // 4
    assert not pb.is_young("p", 8) and pb.is_young("p", 9)
    pb.record_earned("p", 100)
    assert pb.tree_cap("p", base=1, per=4, ceiling=6) == 6  # the ceiling
    pb.record_earned("p", 0)
    pb.record_earned("p", -5)
    assert pb.earned("p") == 108
    pb.record_reject("p", "duplicate", hard=False)  # soft: standing kept
    assert pb.earned("p") == 108
    pb.record_reject("p", "reward_mismatch", hard=True)  # provable misbehaviour: standing lost
    assert pb.earned("p") == 0 and pb.is_young("p", 1)
    assert pb.snapshot()["peers"]["p"]["earned"] == 0
    with pytest.raises(ValueError, match="per >= 1"):
        pb.tree_cap("p", base=1, per=0, ceiling=4)
    with pytest.raises(ValueError, match="ceiling"):
        pb.tree_cap("p", base=3, per=1, ceiling=2)


def test_a_flood_of_fresh_keys_cannot_evict_earned_standing(clock):
    pb = PeerBook(ban_after=10, ban_seconds=60, rate_limit_per_minute=60, clock=clock, max_peers=3)
    pb.record_earned("honest", 5)
    for i in range(10):
        clock.advance(1.0)
        pb.record_accept(f"sybil{i}")
    assert "honest" in pb and pb.earned("honest") == 5
    assert "sybil9" in pb and "sybil8" in pb and len(pb) == 3
