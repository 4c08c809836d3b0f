"""End to end: real ``swarmnode run`` processes forming a private swarm on loopback (real p2pd, no mocks).

One scenario covers the acceptance list of the swarm issue:

* node C starts first with an **unreachable bootstrap peer** (node A's address, A not running yet): it trains
  solo, then joins when A appears;
* A (embedded-style char model, Llama) and B (**another architecture and tokenizer**: Granite with a permuted
  character vocabulary, so every token id differs) join; **every node trains on external samples another
  node published** (``external:<peer>/used`` in metrics.jsonl), B re-tokenizes A's and C's trees and A and C
  re-tokenize B's;
* ``swarmnode peers`` lists all three from their DHT heartbeats;
* B is **killed** (SIGKILL of its process group): A and C keep training on each other's samples;
* SIGTERM stops A and C cleanly, after a checkpoint.

A record written under another publisher's subkey is refused by every honest DHT peer's record validator:
``tests/integration/test_dht.py::test_hostile_records_are_refused_by_honest_peers``; a record that relays someone else's
manifest under the relay's own subkey is refused at the gossip level (``owner_mismatch``):
``tests/integration/test_gossip.py::test_hostile_records_are_charged_to_their_owner``.

The policies are tiny real HF models (``LlamaForCausalLM`` / ``GraniteForCausalLM``) whose weights are set by
hand to a bigram policy: attention and MLP outputs are zero, the embedding is one-hot, and ``lm_head`` holds a
bigram table that answers ``<answer>d</answer>`` with a random digit d in 0..3. On a JSONL task file whose
answers are 0..3 about a quarter of the leaves are right, so groups have reward variance (contrast to share)
from the first step. ``swarmnode swarm up`` is tested with two nodes of the same setup.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import string
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swarmnode.swarm.identity import Identity
from swarmnode.tasks.mix import stream_for_peer
from swarmnode.swarm.local import bootstrap_identity, free_port

pytestmark = pytest.mark.slow

ANSWERS = "0123"


# ============================================================================ tiny real models
def build_char_tokenizer(out: Path, perm_seed: int | None = None):
    """A character-level fast tokenizer (``tokenizers`` WordLevel + per-character split), saved to ``out``.

    Vocabulary: 5 specials (pad, eos, unk, user, assistant), the two answer tags, and printable ASCII.
    ``perm_seed`` shuffles the ids, so two tokenizers agree on text and differ on every id.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<|endoftext|>", "<unk>", "<|user|>", "<|assistant|>"]
    tags = ["<answer>", "</answer>"]
    base = specials + tags + [c for c in string.printable if c not in "\x0b\x0c\r"]
    ids = list(range(len(base)))
    if perm_seed is not None:
        random.Random(perm_seed).shuffle(ids)
    tk = Tokenizer(models.WordLevel(vocab={t: ids[i] for i, t in enumerate(base)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tk.add_tokens([AddedToken(t, special=False, normalized=False) for t in tags])
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<|endoftext|>",
                                   unk_token="<unk>")
    fast.chat_template = ("{% for m in messages %}{% if m['role'] == 'user' %}<|user|>{{ m['content'] }}{% endif %}"
                          "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
    fast.save_pretrained(out)
    return fast


def build_bigram_model(out: Path, arch: str = "llama", perm_seed: int | None = None) -> Path:
    """A real HF causal LM whose weights implement a bigram policy answering ``<answer>d</answer>``, d in 0..3.

    With zero attention/MLP output projections the residual stream is the embedding of the current token
    (one-hot), the final RMSNorm scales it by sqrt(H), and ``lm_head`` column ``i`` holds the bigram logits
    after token ``i`` divided by sqrt(H).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    tok = build_char_tokenizer(out, perm_seed)
    V = len(tok)
    H = V + (8 if arch == "llama" else 12)
    H += H % 2
    t = tok.convert_tokens_to_ids
    table = torch.zeros(V, V)
    table[:, tok.eos_token_id] = 10.0                    # by default: stop
    table[t("<|assistant|>")] = 0.0
    table[t("<|assistant|>"), t("<answer>")] = 10.0      # open the answer
    table[t("<answer>")] = 0.0
    for d in ANSWERS:
        table[t("<answer>"), t(d)] = 10.0                # a random digit
        table[t(d)] = 0.0
        table[t(d), t("</answer>")] = 10.0               # close (sometimes one more digit)
        for e in ANSWERS:
            table[t(d), t(e)] = 6.0
    cfg = AutoConfig.for_model(arch, vocab_size=V, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=1,
                               num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                               bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                               tie_word_embeddings=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        emb.zero_()
        emb[:, :V].copy_(torch.eye(V))
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.zero_()
        head = model.get_output_embeddings().weight
        head.zero_()
        head[:, :V].copy_(table.t() / math.sqrt(H))
    model.save_pretrained(out)
    return out


def write_tasks(path: Path, n: int = 240) -> Path:
    """JSONL tasks ``what is a + b?`` with answers 0..3."""
    rng = random.Random(0)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            s = rng.randrange(4)
            a = rng.randrange(s + 1)
            f.write(json.dumps({"question": f"Item {i}: what is {a} + {s - a}?", "answer": str(s)}) + "\n")
    return path


def write_config(path: Path, model: Path, tasks: Path, swarm_id: str) -> Path:
    import yaml

    cfg = {
        "steps": 100000,
        "seed": 0,
        "eval_at_start": False,
        "model": {"name_or_path": str(model), "device": "cpu", "dtype": "float32", "system_prompt": ""},
        "tasks": {"sources": [{"type": "jsonl", "path": str(tasks)}], "eval_size": 8},
        "sampling": {"prompts_per_step": 2, "num_generations": 4, "max_completion_length": 6,
                     "max_prompt_length": 64},
        "train": {"learning_rate": 1e-4, "micro_batch_size": 32},
        "checkpoint": {"save_steps": 100000, "keep_last": 1},
        "swarm": {"enabled": True, "swarm_id": swarm_id,
                  "net": {"bucket_seconds": 10.0, "dht_timeout": 5.0, "fetch_timeout": 5.0}},
        "external": {"num_external": 4, "max_external_share": 0.5, "max_staleness": 1000000,
                     # the bigram policies spin through thousands of ~0 s steps here and drift apart, and the
                     # likelihood screen then rightly rejects a peer's completions (seen: A screened out C's after
                     # ~3,700 steps, so "A and C train on each other's samples" timed out); the screen is tested
                     # in test_screen.py, test_node_trust.py and the hostile suite
                     "screen": {"enabled": False}},
    }
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


# ============================================================================ processes and metrics
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def start_node(rd: Path, config: Path, *args: str) -> subprocess.Popen:
    rd.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "swarmnode.cli", "run", "--config", str(config), "--run-dir", str(rd),
           "--identity", str(rd / "identity.pem"), "--create-identity", "--no-eval", *args]
    with open(rd / "stdout.log", "ab") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=ENV,
                                start_new_session=True)


def steps(rd: Path) -> list[dict]:
    """The training-step records of a node's metrics.jsonl (complete lines only)."""
    try:
        text = (rd / "metrics.jsonl").read_text(encoding="utf-8")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if "step" in rec and "eval" not in rec:
            out.append(rec)
    return out


def used_from(rec: dict, peer: str) -> int:
    return int(rec.get(f"external:{peer}/used", 0) or 0)


def wait_for(pred, timeout: float, procs=(), what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        for p, rd in procs:
            if p.poll() is not None:
                log = (rd / "stdout.log").read_text(errors="replace")[-3000:]
                pytest.fail(f"node in {rd} exited with {p.returncode} while waiting for {what}:\n{log}")
        time.sleep(0.5)
    logs = "\n".join(f"--- {rd}\n" + (rd / "stdout.log").read_text(errors="replace")[-1500:] for _, rd in procs)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{logs}")


def kill_group(p: subprocess.Popen, sig=signal.SIGKILL) -> None:
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    tasks = write_tasks(tmp / "tasks.jsonl")
    char = build_bigram_model(tmp / "char-llama", "llama")
    perm = build_bigram_model(tmp / "perm-granite", "granite", perm_seed=7)
    sid = f"e2e-{os.getpid()}"
    return {"tmp": tmp, "cfg_a": write_config(tmp / "a.yaml", char, tasks, sid),
            "cfg_b": write_config(tmp / "b.yaml", perm, tasks, sid), "tasks": tasks, "char": char, "perm": perm}


def test_bigram_models_are_heterogeneous(setup):
    from swarmnode.config import ModelConfig
    from swarmnode.policy.loading import build_prompt, load_policy

    a = load_policy(ModelConfig(name_or_path=str(setup["char"]), device="cpu", system_prompt=""))
    b = load_policy(ModelConfig(name_or_path=str(setup["perm"]), device="cpu", system_prompt=""))
    assert type(a.model).__name__ == "LlamaForCausalLM" and type(b.model).__name__ == "GraniteForCausalLM"
    assert a.tokenizer_id != b.tokenizer_id and a.model_id != b.model_id
    text = build_prompt(a.tokenizer, "Item 3: what is 1 + 2?") + "<answer>3</answer>"
    ids_a = a.tokenizer(text, add_special_tokens=False)["input_ids"]
    ids_b = b.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids_a) == len(ids_b) and sum(x != y for x, y in zip(ids_a, ids_b)) > len(ids_a) // 2
    assert a.tokenizer.decode(ids_a) == b.tokenizer.decode(ids_b) == text


def test_three_node_swarm_end_to_end(setup):
    tmp = setup["tmp"]
    rd = {n: tmp / f"node-{n}" for n in "abc"}
    # node A's address is fixed in advance (libp2p identity + port) so that C can be given it before A runs
    peer_a = bootstrap_identity(rd["a"] / "p2p.key")
    port = free_port()
    addr_a = f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer_a}"
    procs: dict[str, subprocess.Popen] = {}
    try:
        # 1. C: unreachable bootstrap peer -> trains solo
        procs["c"] = start_node(rd["c"], setup["cfg_a"], "--seed", "3", "--initial-peers", addr_a)
        wait_for(lambda: len(steps(rd["c"])) >= 3, 150, [(procs["c"], rd["c"])], "C's first solo steps")
        solo = steps(rd["c"])[:3]
        assert all(r["swarm/connected"] is False and r["swarm/peers"] == 0 for r in solo)
        # solo: nothing external; local samples in at least one step (a step whose groups all have zero reward
        # variance trains on nothing, and the node's questions depend on its fresh identity's task stream)
        assert all(r["samples_external"] == 0 for r in solo) and any(r["samples_local"] > 0 for r in solo)

        # 2. A (bootstrap peer, appears late) and B (another architecture and tokenizer) join
        procs["a"] = start_node(rd["a"], setup["cfg_a"], "--seed", "1", "--host-maddrs", f"/ip4/127.0.0.1/tcp/{port}")
        procs["b"] = start_node(rd["b"], setup["cfg_b"], "--seed", "2", "--initial-peers", addr_a)
        live = [(procs[n], rd[n]) for n in "abc"]
        wait_for(lambda: all(rd[n].joinpath("identity.pem").exists() for n in "ab"), 150, live, "identities")
        pid = {n: Identity.load(rd[n] / "identity.pem").peer_id for n in "abc"}

        def trained_on_others() -> bool:
            for n in "abc":
                others = [pid[o] for o in "abc" if o != n]
                if not any(used_from(r, p) > 0 for r in steps(rd[n]) for p in others):
                    return False
            # the heterogeneous pairs: B re-tokenizes A's or C's trees, A and C re-tokenize B's
            return (any(r.get("swarm/retokenized_trees", 0) > 0 for r in steps(rd["b"]))
                    and any(used_from(r, pid["b"]) > 0 for n in "ac" for r in steps(rd[n])))

        wait_for(trained_on_others, 240, live, "every node training on another node's samples")
        rec_c = steps(rd["c"])
        assert any(r["swarm/connected"] for r in rec_c[3:]), "C joined the swarm once A appeared"
        info_a = json.loads((rd["a"] / "swarm.json").read_text())
        assert info_a["peer_id"] == pid["a"] and info_a["libp2p_peer_id"] == peer_a
        for n in "abc":
            recs = steps(rd[n])
            assert sum(r["samples_external"] for r in recs) > 0
            assert any(r.get("swarm/bundles_accepted", 0) > 0 for r in recs)
            assert any(r.get("swarm/bundles_published", 0) > 0 for r in recs)
            assert not any(k.startswith("swarm/rejected/reward_mismatch") for r in recs for k in r)
        # every node draws its own questions: the task stream derived from its identity
        streams = {n: {r["task_stream"] for r in steps(rd[n])} for n in "abc"}
        assert all(streams[n] == {stream_for_peer(pid[n])} for n in "abc"), streams
        assert len({stream_for_peer(pid[n]) for n in "abc"}) == 3

        # 3. swarmnode peers: the swarm as its heartbeats show it
        # the three nodes spin here (every group has zero variance: no update, ~0 s per step) and keep both
        # cores busy, so the one-shot query process gets a small share of the CPU: a generous bound
        # a heartbeat is published on its own cadence, so the one read may predate a node's first publish: read
        # again (at most 3 times) until every heartbeat shows it
        for attempt in range(3):
            t_peers = time.monotonic()
            out = subprocess.run([sys.executable, "-m", "swarmnode.cli", "peers", "--run-dir", str(rd["a"]),
                                  "--json"], capture_output=True, text=True, env=ENV, timeout=420)
            print(f"swarmnode peers took {time.monotonic() - t_peers:.0f} s")
            assert out.returncode == 0, out.stdout + out.stderr
            listed = json.loads(out.stdout.strip().splitlines()[-1])
            assert {p["peer_id"] for p in listed["peers"]} == set(pid.values())
            if all(p["step"] >= 1 and p["samples_published"] > 0 for p in listed["peers"]):
                break
            time.sleep(10.0)
        assert all(p["step"] >= 1 and p["samples_published"] > 0 for p in listed["peers"]), listed

        # 4. kill B: A and C keep training, on each other's samples
        kill_group(procs["b"])
        procs["b"].wait(30)
        n0 = {n: len(steps(rd[n])) for n in "ac"}

        def survivors_go_on() -> bool:
            new = {n: steps(rd[n])[n0[n]:] for n in "ac"}
            return (all(len(new[n]) >= 5 for n in "ac")
                    and any(used_from(r, pid["c"]) > 0 for r in new["a"])
                    and any(used_from(r, pid["a"]) > 0 for r in new["c"]))

        wait_for(survivors_go_on, 180, [(procs[n], rd[n]) for n in "ac"], "A and C training after B died")

        # 5. SIGTERM: finish the step, checkpoint, exit 0
        for n in "ac":
            kill_group(procs[n], signal.SIGTERM)
        for n in "ac":
            assert procs[n].wait(90) == 0, (rd[n] / "stdout.log").read_text(errors="replace")[-2000:]
            assert list((rd[n] / "checkpoints").glob("step-*")), f"no checkpoint in {rd[n]}"
    finally:
        for p in procs.values():
            if p.poll() is None:
                kill_group(p)
                p.wait(30)


def test_swarm_up_two_nodes_and_ctrl_c(setup):
    rd = setup["tmp"] / "up"
    rd.mkdir()
    with open(rd / "stdout.log", "wb") as log:  # the launcher's own output (its live view)
        launcher = subprocess.Popen(
            [sys.executable, "-m", "swarmnode.cli", "swarm", "up", "--nodes", "2", "--config", str(setup["cfg_a"]),
             "--run-dir", str(rd), "--no-eval", "--steps", "100000"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=ENV, start_new_session=True)
    nodes = [rd / "node-0", rd / "node-1"]
    try:
        def both_trained_on_each_other() -> bool:
            if not all((n / "identity.pem").exists() for n in nodes):
                return False
            pid = [Identity.load(n / "identity.pem").peer_id for n in nodes]
            return all(any(used_from(r, pid[1 - i]) > 0 for r in steps(nodes[i])) for i in range(2))

        wait_for(both_trained_on_each_other, 240, [(launcher, rd)], "the two nodes of swarm up exchanging samples")
        os.kill(launcher.pid, signal.SIGINT)  # Ctrl-C
        launcher.wait(400)
        text = (rd / "stdout.log").read_text(errors="replace")
        assert launcher.returncode == 0, text[-3000:]
        assert "exit codes: [0, 0]" in text
        assert text.count("last/total") == 1, text[-3000:]  # in a file the final table is printed once, no live frame
        for n in nodes:
            assert list((n / "checkpoints").glob("step-*")), f"no checkpoint in {n}"
            assert (n / "identity.pem").exists() and (n / "stdout.log").exists()
            out = " ".join((n / "stdout.log").read_text(errors="replace").split())
            for noise in ("daemon failed", "restarting the DHT", "did not shut down", "Traceback", "ERROR"):
                assert noise not in out, f"a normal Ctrl-C logged {noise!r} in {n}: {out[-3000:]}"  # a quiet stop
        assert Identity.load(nodes[0] / "identity.pem") != Identity.load(nodes[1] / "identity.pem")
    finally:
        if launcher.poll() is None:
            kill_group(launcher)
            launcher.wait(30)
        for n in nodes:  # never leave node processes behind
            info = n / "swarm.json"
            if info.exists():
                try:
                    os.killpg(json.loads(info.read_text())["pid"], signal.SIGKILL)
                except (ProcessLookupError, PermissionError, KeyError, TypeError, ValueError):
                    pass
