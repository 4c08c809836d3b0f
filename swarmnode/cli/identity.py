"""``swarmnode keygen`` and ``swarmnode id``: this node's Ed25519 identity file (swarmnode/swarm/identity.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from swarmnode.cli.common import _fail, console


def default_identity_path() -> Path:
    """``$SWARMNODE_HOME/identity.pem`` (``SWARMNODE_HOME`` defaults to ``~/.swarmnode``)."""
    return Path(os.environ.get("SWARMNODE_HOME", Path.home() / ".swarmnode")) / "identity.pem"


def keygen(
    path: Optional[Path] = typer.Option(None, "--path", help="key file (default $SWARMNODE_HOME/identity.pem)"),
) -> None:
    """Create this node's Ed25519 identity (PEM, mode 0600). Refuses to overwrite an existing key."""
    from swarmnode.swarm.identity import Identity

    p = path or default_identity_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    ident = Identity.generate()
    try:
        ident.save(p)
    except FileExistsError as e:
        _fail(f"{e}. Your identity is that file: back it up; delete it only to become a new peer.")
    console.print(f"wrote {p}\npeer id:    {ident.peer_id}\npublic key: {ident.public_key_bytes.hex()}")


def id_cmd(
    path: Optional[Path] = typer.Option(None, "--path", help="key file (default $SWARMNODE_HOME/identity.pem)"),
) -> None:
    """Print the peer id and public key of this node's identity."""
    from swarmnode.swarm.identity import Identity, IdentityError

    p = path or default_identity_path()
    try:
        ident = Identity.load(p)
    except FileNotFoundError:
        _fail(f"no identity at {p}; create one with `swarmnode keygen{f' --path {p}' if path is not None else ''}`")
        return
    except IdentityError as e:
        _fail(str(e))
        return
    console.print(f"peer id:    {ident.peer_id}\npublic key: {ident.public_key_bytes.hex()}\nkey file:   {p}")
