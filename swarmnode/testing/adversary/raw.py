"""Raw msgpack below the wire codec: the one module of :mod:`swarmnode.testing` that imports ``msgpack``.

The hostile peer builds what the codec (:mod:`swarmnode.swarm.wire`, protocol/SPEC.md) refuses to build: an
envelope with one signature bit flipped, a body with its keys out of order, a value of the wrong type. It packs
and unpacks those here, without the codec's limits, schema or canonical form, so that the forging stays in one
place (``tests/unit/test_architecture.py`` lists this module as the one deliberate exception to "only the wire codec
imports msgpack"). Never use it to read bytes from a peer: that is :func:`swarmnode.swarm.wire.open_envelope`.
"""

from __future__ import annotations

from typing import Any

import msgpack

__all__ = ["pack", "unpack"]


def pack(obj: Any, *, use_bin_type: bool = True, use_single_float: bool = False) -> bytes:
    """msgpack bytes of ``obj`` (Python values: dict, list, str, bytes, int, float, bool, None).

    ``use_bin_type=False`` writes ``bytes`` as raw strings and ``use_single_float=True`` writes floats as
    float32: both are non-canonical forms the fuzzer sends on purpose.

    Raises:
        OverflowError, TypeError, ValueError: ``obj`` has no msgpack form (an int beyond 64 bits, an object).
    """
    return msgpack.packb(obj, use_bin_type=use_bin_type, use_single_float=use_single_float)


def unpack(b: bytes) -> Any:
    """The Python value of msgpack bytes ``b`` (strings as ``str``, binary as ``bytes``), with msgpack's own
    default limits only.

    Raises:
        ValueError (and msgpack's subclasses of it), TypeError: ``b`` is not one complete msgpack value.
    """
    return msgpack.unpackb(b, raw=False)
