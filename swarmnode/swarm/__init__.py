"""The swarm layer: everything a node says to and hears from its peers (docs/reference/design.md §6-§7,
protocol/SPEC.md). Trust nothing: every byte from the network is checked, re-scored and charged to a key.

The node sees one object, :class:`swarmnode.swarm.gossip.SwarmClient` (``publish``, ``gather``, ``credit``,
``charge``; built by :func:`swarmnode.swarm.gossip.build_swarm`). Importing this package imports nothing else;
the modules, from the bytes up:

Protocol and identity
    ``wire``        the only byte codec: bundles, manifests, manifest records, heartbeats in signed envelopes
                    (the only module that imports msgpack; golden vectors in ``protocol/``)
    ``identity``    the node's Ed25519 key (``sn1…`` peer ids), its PEM file
    ``prune``       what of each rollout tree is published (contrast, not bulk)

Network
    ``dht``         :class:`SwarmDHT`: signed, time-bucketed records and their reads on a hivemind DHT
    ``dht_host``    the DHT process's lifecycle: start, watchdog, restart, join, health, bounded calls
    ``dht_process`` the child processes: dying with the node, stopping; the storage budget
    ``result_channel`` the pipe DHT processes answer on (hivemind's MPFuture), safe when one of them dies
    ``dht_reply``   what one DHT message may cost: bounded decoding, find replies decoded off the event loop,
                    find and store requests bounded (stores checked off the loop)
    ``maddrs``      multiaddr parsing and checks
    ``validator``   the DHT's record validator (Ed25519 owner signatures) and the swarm's key space
    ``transport``   :class:`BundleServer`: bundle bodies over libp2p streams, bounded serving and fetching
    ``bundle_fetch`` / ``bundle_store``  its fetch client (never dials a peer's address); protocol constants, store

Trust
    ``verify``      :class:`Verifier` and the ordered trust table: manifests and bundles, every leaf re-scored
    ``manifest_checks`` a manifest's checks
    ``bundle_checks``   a bundle's checks in the table's order (steps 0-6)
    ``tokens``      checks of token ids: special tokens, decoded text, round trip, re-tokenizing
    ``content``     content keys of trees, authorship claims
    ``replay``      the bounded seen-memories (replays, our own bundles)
    ``rejection``   reason codes (hard, soft, uncharged) and :class:`Rejection`
    ``peers``       :class:`PeerBook`: verdicts per peer, strikes, bans, rate limits, earned standing

The client (``SwarmClient`` in ``gossip`` is a thin facade over these; each owns its state)
    ``gossip``      :class:`SwarmClient` (wiring, lifecycle, the ``SwarmHook`` methods), :func:`build_swarm`,
                    the ``SwarmPolicy`` seam; re-exports the CLI helpers of ``info``
    ``publisher``   publish: prune, sign, split, serve, announce; manifest records; the publisher thread
    ``fetcher``     the fetcher thread: DHT polls (known publishers first), manifests under the rate limit,
                    fetches from the publisher and relays
    ``scheduler``   the fair fetch scheduler: round-robin order, one manifest per digest, per-publisher limits
                    and time budgets, manifest states and retries, the bounded queue of fetched bodies
    ``gather``      the gather: verify queued bodies within a time budget, re-serve them, admit their trees
    ``admission``   young keys' caps and turns per step, carried trees, credit/charge, authorship moves
    ``rates``       our heartbeat's fields; peers' task rates and rescue requests from their heartbeats
    ``counters``    the counters the three kinds of thread share
    ``info``        ``swarm.json``, identity paths, ``list_peers`` (what ``swarmnode peers`` prints)

Tools
    ``local``       a private swarm of N local node processes on loopback (``swarmnode swarm up``)
"""
