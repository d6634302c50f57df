"""``python -m strataio``: the ``strataio`` command."""

from strataio.cli import main

main(prog_name="strataio")
