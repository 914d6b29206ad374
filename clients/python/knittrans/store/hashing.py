"""Content hashes of unit bytes.

One algorithm everywhere (BLAKE2b, 128-bit digest, from the standard library), because hashes are
compared across processes: write-once keys accept a rewrite only when the hashes match, and a
multimodal key embeds the hash of its bytes.
"""

from __future__ import annotations

import hashlib

from knittrans.store.buffers import BufferLike, byte_view

DIGEST_SIZE = 16


def content_hash(data: BufferLike) -> str:
    """Lower-case hex digest of the bytes of ``data`` (a C-contiguous buffer); hashlib releases the GIL."""
    return hashlib.blake2b(byte_view(data), digest_size=DIGEST_SIZE).hexdigest()
