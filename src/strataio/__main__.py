"""``python -m strataio``: the ``strataio`` command (as ``python -m strataio.cli``)."""

import strataio.cli.__main__  # noqa: F401 (running it runs the command)
