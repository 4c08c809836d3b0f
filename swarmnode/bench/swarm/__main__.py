"""``python -m swarmnode.bench.swarm worker|hostile SPEC.json``: one process of a benchmark arm (see :mod:`.cli`)."""

import sys

from swarmnode.bench.swarm.cli import role_main

sys.exit(role_main())
