"""The pipe DHT processes answer on (hivemind's real MPFuture, real forked processes): a dead holder releases the
lock, processes forked before and after an unclean exit never interleave their messages, and a half-written
message costs the calls in flight on its pipe, not every later one."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import signal
import struct
import threading
import time

import pytest
from hivemind.utils.mpfuture import MPFuture

from swarmnode.swarm import result_channel
from test_dht import _wait

FORK = mp.get_context("fork")


def _payload(i: int, size: int) -> bytes:
    seed = hashlib.sha256(str(i).encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def _answer(conn, size: int) -> None:
    """Child: receive futures over ``conn`` (pickled the way hivemind sends requests) and set large results."""
    futures = conn.recv()
    conn.send("ready")
    conn.recv()  # go: every child starts writing at the same moment
    for i, future in futures:
        future.set_result(_payload(i, size))


def _hold_lock(conn) -> None:
    MPFuture._update_lock.acquire()
    conn.send("held")
    time.sleep(3600)


@pytest.fixture(autouse=True)
def _installed():
    result_channel.install()


def test_a_holder_killed_while_holding_the_update_lock_releases_it():
    assert isinstance(MPFuture._update_lock, result_channel.FlockLock)
    parent, child = FORK.Pipe()
    holder = FORK.Process(target=_hold_lock, args=(child,), daemon=True)
    holder.start()
    try:
        assert parent.poll(30) and parent.recv() == "held"
        assert MPFuture._update_lock.acquire(blocking=False) is False  # another process holds it
        holder.kill()  # SIGKILL while holding it: an mp.Lock would stay taken for ever
        holder.join(10)
        assert _wait(lambda: MPFuture._update_lock.acquire(blocking=False), 10)
        MPFuture._update_lock.release()
    finally:
        if holder.is_alive():
            holder.kill()


def test_processes_forked_before_and_after_an_unclean_exit_never_interleave_large_results():
    """What broke CI: the lock used to be replaced after an unclean exit, so a DHT process forked before it and one
    forked after it wrote 1 MiB replies into one pipe under different locks, and the node read garbage."""
    size, per_child = 1 << 20, 8
    conns, children = [], []
    try:
        for c in range(2):
            parent, child = FORK.Pipe()
            p = FORK.Process(target=_answer, args=(child, size), daemon=True)
            p.start()
            conns.append(parent)
            children.append(p)
            if c == 0:
                result_channel.after_unclean_exit()  # what stopping a hung DHT process calls
        futures = {}
        for c, conn in enumerate(conns):
            batch = [(c * per_child + i, MPFuture()) for i in range(per_child)]
            futures.update(batch)
            conn.send(batch)
        for conn in conns:
            assert conn.poll(30) and conn.recv() == "ready"
        for conn in conns:
            conn.send("go")
        for i, future in futures.items():
            assert future.result(120) == _payload(i, size), i
    finally:
        for p in children:
            p.join(10)
            if p.is_alive():
                p.kill()


def _set_results(conn) -> None:
    for i, future in conn.recv():
        future.set_result(_payload(i, 2000))


def _round_trip(i: int, timeout: float) -> bytes:
    parent, child = FORK.Pipe()
    p = FORK.Process(target=_set_results, args=(child,), daemon=True)
    p.start()
    try:
        future = MPFuture()
        parent.send([(i, future)])
        return future.result(timeout)
    finally:
        p.join(10)


def _write_half_a_message() -> None:
    """What a process killed in the middle of a send leaves: a frame header and part of its body."""
    os.write(MPFuture._global_sender_pipe.fileno(), struct.pack("!i", 1000) + b"\x80\x04partial")


def test_half_a_message_left_by_a_killed_writer_is_detected_and_the_pipe_replaced():
    result_channel.rotate()  # a pipe of this test alone
    before = result_channel.rotations()
    _write_half_a_message()
    # the next result completes the broken frame: it is lost (its call times out), the pipe is replaced
    with pytest.raises(TimeoutError):
        _round_trip(1, 3)
    assert _wait(lambda: result_channel.rotations() > before, 30)
    assert _round_trip(2, 60) == _payload(2, 2000)  # later calls answer (hivemind's loop misread every later frame)


def test_an_unclean_exit_replaces_the_pipe_before_anything_is_lost():
    result_channel.rotate()
    _write_half_a_message()
    result_channel.after_unclean_exit()  # stop_dht_process after a process that did not exit cleanly
    assert _round_trip(3, 60) == _payload(3, 2000)


def test_a_process_killed_in_the_middle_of_a_large_result():
    """A real writer killed mid-send: its half message is in the pipe; calls after the unclean exit answer."""
    result_channel.rotate()
    parent, child = FORK.Pipe()
    p = FORK.Process(target=_answer, args=(child, 64 << 20), daemon=True)  # 64 MiB: the write takes a while
    p.start()
    try:
        future = MPFuture()
        parent.send([(7, future)])
        assert parent.poll(30) and parent.recv() == "ready"
        parent.send("go")
        time.sleep(0.2)
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
    finally:
        if p.is_alive():
            p.kill()
    result_channel.after_unclean_exit()
    assert _round_trip(8, 60) == _payload(8, 2000)
    assert _wait(lambda: MPFuture._update_lock.acquire(blocking=False), 10)  # the kill released the lock
    MPFuture._update_lock.release()


def _reader(rotation: int):
    return next((t for t in threading.enumerate() if t.name == f"swarmnode.mpfuture.results.{rotation}"), None)


@pytest.mark.parametrize("how", ["retired", "half a frame", "garbage"])
def test_a_retired_pipe_is_closed_even_while_a_copy_of_its_write_end_stays_open(monkeypatch, how):
    """Outside attack: one reader thread and one pipe more after every restart of a node's only DHT process, for
    good: multiprocessing keeps a duplicate of the write end for each future sent to a DHT process until that process
    fetches it, and a killed process never does, so the retired pipe never reached end of file. A retired (or
    half-read) pipe is now read for RETIRED_READ_S more, then closed, and its thread ends."""
    monkeypatch.setattr(result_channel, "RETIRED_READ_S", 0.5)
    monkeypatch.setattr(result_channel, "_POLL_S", 0.05)
    result_channel.rotate()
    rotation = result_channel.rotations()
    reader = _reader(rotation)
    assert reader is not None and reader.is_alive()
    kept = os.dup(MPFuture._global_sender_pipe.fileno())  # what multiprocessing keeps for a never-fetched future
    try:
        if how == "garbage":  # a whole frame that does not decode: the reader rotates, then drains
            os.write(kept, struct.pack("!i", 8) + b"\xd3" * 8)
        else:
            if how == "half a frame":  # a writer killed mid-message, nothing after it: a blocking read waits for ever
                _write_half_a_message()
            result_channel.after_unclean_exit()  # retired
        assert _wait(lambda: not reader.is_alive(), 30, 0.05)
        with pytest.raises(BrokenPipeError):  # the pipe is closed: a late writer fails (hivemind ignores that)
            for _ in range(64):
                os.write(kept, b"\x00" * 65536)
    finally:
        os.close(kept)
    assert result_channel.rotations() == rotation + 1
    assert _round_trip(9, 60) == _payload(9, 2000)
