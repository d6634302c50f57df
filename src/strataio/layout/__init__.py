"""Pure geometry, no I/O: byte extents, N-D sections, chunk grids, datatype flattening."""

from strataio.layout.chunks import ChunkCover, ChunkGrid
from strataio.layout.extents import Extents, section_extents
from strataio.layout.sections import Section

__all__ = ["ChunkCover", "ChunkGrid", "Extents", "Section", "section_extents"]
