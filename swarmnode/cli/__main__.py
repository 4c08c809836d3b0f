"""``python -m swarmnode.cli``: the ``swarmnode`` command."""

from swarmnode.cli import main

main()
