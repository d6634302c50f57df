"""The package's compiled pieces (everything else is in pyproject.toml).

``strataio.storage._filebatch`` reads a range of each of many files in one call (see
``PosixBackend.readinto_ranges_versioned``); ``strataio.storage._mapcopy`` copies a file's
cached pages through a mapping (see ``strataio.storage.mapped``). Both are optional: where
they cannot be built (no C compiler, not Linux) the install goes on, the first loop runs in
Python and large reads go through ``preadv``.
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
    ext_modules.append(
        Extension(
            "strataio.storage._mapcopy",
            ["src/strataio/storage/_mapcopy.c"],
            optional=True,
            extra_compile_args=["-O2"],
        )
    )

setup(ext_modules=ext_modules)
