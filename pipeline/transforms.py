"""Edge transforms: what a graph edge does to upstream chunks before the next stage.

A transform takes the chunks batched on one edge (a list of `chunk` size, shorter at the end
of a stream) and returns the chunks to hand to the downstream stage. Graph files name them
as `module:function`.
"""

from __future__ import annotations

from collections.abc import Sequence

from .types import Chunk


def passthrough(chunks: Sequence[Chunk]) -> list[Chunk]:
    """Hand the upstream chunks on unchanged."""
    return list(chunks)
