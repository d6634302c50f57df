"""Sub-filed N-D datasets stored as Zarr v3 arrays: metadata, codecs, chunk stores, Dataset."""

from strataio.arrays.codecs import CodecPipeline, normalize_codecs
from strataio.arrays.dataset import Dataset, create_dataset, open_dataset
from strataio.arrays.metadata import ArrayMetadata
from strataio.arrays.store import BackendChunkStore, ChunkStore, StoreCapabilities

__all__ = [
    "ArrayMetadata",
    "BackendChunkStore",
    "ChunkStore",
    "CodecPipeline",
    "Dataset",
    "StoreCapabilities",
    "create_dataset",
    "normalize_codecs",
    "open_dataset",
]
