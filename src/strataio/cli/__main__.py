"""``python -m strataio.cli``: the ``strataio`` command."""

from strataio.cli import main

main(prog_name="strataio")
