"""The package's one compiled piece (everything else is in pyproject.toml).

``strataio.storage._filebatch`` reads a range of each of many files in one call (see
``PosixBackend.readinto_ranges_versioned``). It is optional: where it cannot be built (no C
compiler, not Linux) the install goes on and the same loop runs in Python.
"""

import sys

from setuptools import Extension, setup

ext_modules = []
if sys.platform.startswith("linux"):
    ext_modules.append(
        Extension(
            "strataio.storage._filebatch",
            ["src/strataio/storage/_filebatch.c"],
            optional=True,
            extra_compile_args=["-O2"],
        )
    )

setup(ext_modules=ext_modules)
