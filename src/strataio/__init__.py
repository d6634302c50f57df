"""strataio: parallel I/O of scientific arrays across a storage hierarchy."""

from strataio.arrays import Dataset, create_dataset, open_dataset
from strataio.arrays.chunk_cache import chunk_cache
from strataio.collective.file import File
from strataio.collective.irregular import IndexSchedule
from strataio.collective.loopcache import LoopCache
from strataio.errors import StrataError
from strataio.session import Session

__version__ = "0.1.0"

__all__ = [
    "Dataset",
    "File",
    "IndexSchedule",
    "LoopCache",
    "Session",
    "StrataError",
    "__version__",
    "chunk_cache",
    "create_dataset",
    "open_dataset",
]
