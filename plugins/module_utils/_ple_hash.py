# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The PLE pack's table digest (private helper of sparkops.appliance; docs/ple-format.md).

A table's digest is computed over fixed-size chunks, so that several threads hash one large
table at the same time (hashlib releases the GIL while it hashes a large buffer):

    chunk i   = bytes [i * chunk_bytes, min((i + 1) * chunk_bytes, nbytes)) of the table
    digest    = sha256(sha256(chunk 0) || sha256(chunk 1) || ... || sha256(chunk n-1))

with the chunk digests as raw 32-byte values, n = ceil(nbytes / chunk_bytes) (0 for an empty
table, whose digest is sha256 of nothing). The index names the scheme and the chunk size.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import collections
import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.sparkops.appliance.plugins.module_utils import _safetensors

HASH_SCHEME = "sha256-chunks"
HASH_CHUNK_BYTES = 16 * 1024 * 1024
MAX_WORKERS = 8


def chunk_bounds(begin, end, chunk_bytes=HASH_CHUNK_BYTES):
    """The [begin, end) ranges of the chunks of the bytes [begin, end), in order."""
    return [(b, min(b + chunk_bytes, end)) for b in range(begin, end, chunk_bytes)]


def combine(chunk_digests):
    """The table digest (hex) from its chunks' raw sha256 digests, in order."""
    return hashlib.sha256(b"".join(chunk_digests)).hexdigest()


def default_workers():
    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))


class ChunkHasher:
    """Digests of byte ranges of files by the chunk scheme, on a pool of threads.

    add(path, begin, end) queues the range's chunks and returns a handle; digest(handle) waits
    for them and returns the hex digest (None when stop() was called). At most max_pending
    chunks wait or run at a time: add() blocks on the oldest beyond that, so a caller that
    copies a chunk and then adds it keeps the hash close behind the copy (the bytes are still
    in the page cache) and memory stays bounded (one buffer per worker).
    """

    def __init__(self, workers=None, chunk_bytes=HASH_CHUNK_BYTES, buffer_bytes=None, max_pending=None):
        self.workers = workers or default_workers()
        self.chunk_bytes = chunk_bytes
        self.buffer_bytes = buffer_bytes or _safetensors.HASH_BUFFER_BYTES
        self.max_pending = max_pending or 4 * self.workers
        self.stop_event = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=self.workers)
        self._pending = collections.deque()

    def _hash_chunk(self, path, begin, end):
        return _safetensors.hash_range(path, begin, end, buffer_bytes=self.buffer_bytes,
                                       stop=self.stop_event, raw=True)

    def add_chunk(self, handle, path, begin, end):
        """Queue one chunk of a handle (chunks must be added in order)."""
        while len(self._pending) >= self.max_pending:
            self._pending.popleft().result()
        future = self._pool.submit(self._hash_chunk, path, begin, end)
        self._pending.append(future)
        handle.append(future)

    def add(self, path, begin, end):
        handle = []
        for b, e in chunk_bounds(begin, end, self.chunk_bytes):
            self.add_chunk(handle, path, b, e)
        return handle

    def digest(self, handle):
        digests = [f.result() for f in handle]
        if any(d is None for d in digests):
            return None
        return combine(digests)

    def stop(self):
        self.stop_event.set()

    def close(self):
        """Wait for the running chunks (after stop(), they give up within one buffer)."""
        self._pool.shutdown(wait=True, cancel_futures=self.stop_event.is_set())

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.stop()
        self.close()
        return False


def digest_file_range(path, begin, end, workers=None, chunk_bytes=HASH_CHUNK_BYTES):
    """The digest (hex) of bytes [begin, end) of path, its chunks hashed in parallel."""
    with ChunkHasher(workers=workers, chunk_bytes=chunk_bytes) as hasher:
        return hasher.digest(hasher.add(path, begin, end))
