# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Streaming reader for safetensors shards (private helper of sparkops.appliance).

A safetensors file is: an 8-byte little-endian unsigned header length N, N bytes of a JSON
object (tensor name -> {"dtype", "shape", "data_offsets": [begin, end]}, plus an optional
"__metadata__" object of strings), then the data block; offsets are relative to the start of
the data block. This module reads only the header into memory and hands out byte ranges; the
tensor bytes are moved by the kernel (copy_file_range / sendfile) or through small buffers, so
no tensor or shard is ever held in memory whole.

Every malformed input raises SafetensorsError with a message naming the file and the problem.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import hashlib
import json
import os

# Bytes per element of the dtypes safetensors defines. Sub-byte types (F4, F6) cannot be
# addressed as whole rows and are not supported.
DTYPE_SIZES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}

# The reference implementation refuses headers above 100 MB; so do we (a bigger "header
# length" means the file is not safetensors, and reading it would cost that much memory).
MAX_HEADER_BYTES = 100 * 1000 * 1000

HASH_BUFFER_BYTES = 8 * 1024 * 1024
COPY_CHUNK_BYTES = 256 * 1024 * 1024


class SafetensorsError(Exception):
    """A shard is not valid safetensors, or a set of shards is inconsistent."""


class TensorInfo:
    """One tensor entry of a shard header, with absolute file offsets."""

    __slots__ = ("name", "dtype", "shape", "shard", "begin", "end")

    def __init__(self, name, dtype, shape, shard, begin, end):
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self.shard = shard
        self.begin = begin  # absolute offset in the shard file
        self.end = end

    @property
    def nbytes(self):
        return self.end - self.begin

    @property
    def supported(self):
        return self.dtype in DTYPE_SIZES

    def __repr__(self):
        return "TensorInfo(%r, %s, %r, %r, %d..%d)" % (
            self.name, self.dtype, self.shape, self.shard, self.begin, self.end)


class ShardHeader:
    """The parsed header of one shard."""

    __slots__ = ("path", "size", "mtime_ns", "header_len", "data_start", "tensors", "metadata")

    def __init__(self, path, size, mtime_ns, header_len, tensors, metadata):
        self.path = path
        self.size = size
        self.mtime_ns = mtime_ns
        self.header_len = header_len
        self.data_start = 8 + header_len
        self.tensors = tensors  # list of TensorInfo in header order
        self.metadata = metadata


def _read_exact(fd, n, offset):
    """Read exactly n bytes at offset (n is small: header sizes only)."""
    chunks = []
    got = 0
    while got < n:
        chunk = os.pread(fd, n - got, offset + got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _element_count(shape):
    count = 1
    for dim in shape:
        count *= dim
    return count


def read_header(path):
    """Parse and validate the header of the shard at path; return a ShardHeader.

    Checks: the file is long enough, the header length lies inside the file and below the
    reference limit, the header is a UTF-8 JSON object, every entry has a string dtype, a
    shape of non-negative integers and integer data offsets with begin <= end inside the data
    block (else "truncated"), the byte count matches shape x dtype size for known dtypes, and
    no two tensors' byte ranges overlap.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise SafetensorsError("%s: cannot open: %s" % (path, exc.strerror))
    try:
        st = os.fstat(fd)
        size = st.st_size
        if size < 8:
            raise SafetensorsError(
                "%s: not a safetensors file: %d bytes, shorter than the 8-byte header length"
                % (path, size))
        header_len = int.from_bytes(_read_exact(fd, 8, 0), "little")
        if header_len > MAX_HEADER_BYTES:
            raise SafetensorsError(
                "%s: not a safetensors file: header length %d is above the %d-byte limit"
                % (path, header_len, MAX_HEADER_BYTES))
        if 8 + header_len > size:
            raise SafetensorsError(
                "%s: header length %d runs past the end of the file (%d bytes): truncated or "
                "not a safetensors file" % (path, header_len, size))
        raw = _read_exact(fd, header_len, 8)
    finally:
        os.close(fd)

    if not raw.lstrip(b" ").startswith(b"{"):
        raise SafetensorsError("%s: not a safetensors file: the header is not a JSON object" % path)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SafetensorsError("%s: not a safetensors file: header is not valid JSON (%s)"
                               % (path, exc))
    if not isinstance(header, dict):
        raise SafetensorsError("%s: not a safetensors file: the header is not a JSON object" % path)

    data_start = 8 + header_len
    data_len = size - data_start
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise SafetensorsError("%s: __metadata__ is not a JSON object" % path)

    tensors = []
    for name, entry in header.items():
        where = "%s: tensor %r" % (path, name)
        if not isinstance(entry, dict):
            raise SafetensorsError("%s: entry is not a JSON object" % where)
        dtype = entry.get("dtype")
        shape = entry.get("shape")
        offsets = entry.get("data_offsets")
        if not isinstance(dtype, str):
            raise SafetensorsError("%s: dtype missing or not a string" % where)
        if (not isinstance(shape, list)
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise SafetensorsError("%s: shape %r is not a list of non-negative integers"
                                   % (where, shape))
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
            raise SafetensorsError("%s: data_offsets %r is not a pair of integers" % (where, offsets))
        begin, end = offsets
        if begin < 0 or end < begin:
            raise SafetensorsError("%s: data_offsets [%d, %d] are out of range (begin must be >= 0 "
                                   "and <= end)" % (where, begin, end))
        if end > data_len:
            raise SafetensorsError(
                "%s: data_offsets [%d, %d] run past the end of the data block (%d bytes): the "
                "shard is truncated or its offsets are out of range" % (where, begin, end, data_len))
        if dtype in DTYPE_SIZES:
            want = _element_count(shape) * DTYPE_SIZES[dtype]
            if end - begin != want:
                raise SafetensorsError(
                    "%s: %d bytes in data_offsets but shape %r x %s needs %d bytes"
                    % (where, end - begin, shape, dtype, want))
        tensors.append(TensorInfo(name, dtype, shape, path, data_start + begin, data_start + end))

    ordered = sorted((t for t in tensors if t.nbytes), key=lambda t: t.begin)
    for prev, cur in zip(ordered, ordered[1:]):
        if cur.begin < prev.end:
            raise SafetensorsError(
                "%s: tensors %r and %r overlap (bytes %d..%d and %d..%d of the data block)"
                % (path, prev.name, cur.name, prev.begin - data_start, prev.end - data_start,
                   cur.begin - data_start, cur.end - data_start))
    return ShardHeader(path, size, st.st_mtime_ns, header_len, tensors, metadata)


def read_shards(paths):
    """Parse every shard; return (headers, {name: TensorInfo}). Duplicate names fail."""
    headers = []
    by_name = {}
    for path in paths:
        hdr = read_header(path)
        for info in hdr.tensors:
            other = by_name.get(info.name)
            if other is not None:
                raise SafetensorsError("tensor %r appears in two shards: %s and %s"
                                       % (info.name, other.shard, info.shard))
            by_name[info.name] = info
        headers.append(hdr)
    return headers, by_name


def hash_range(path, begin, end, buffer_bytes=HASH_BUFFER_BYTES, stop=None, raw=False):
    """sha256 hex digest (raw: the 32 bytes) of bytes [begin, end) of path, read through one reused buffer.

    stop: an optional threading.Event; when set, the hash is abandoned (returns None).
    """
    digest = hashlib.sha256()
    buf = bytearray(min(buffer_bytes, max(end - begin, 1)))
    view = memoryview(buf)
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            os.posix_fadvise(fd, begin, end - begin, os.POSIX_FADV_SEQUENTIAL)
        except (AttributeError, OSError):
            pass
        pos = begin
        while pos < end:
            if stop is not None and stop.is_set():
                return None
            want = min(len(buf), end - pos)
            got = os.preadv(fd, [view[:want]], pos)
            if got <= 0:
                raise SafetensorsError("%s: unexpected end of file at byte %d (expected %d)"
                                       % (path, pos, end))
            digest.update(view[:got])
            pos += got
    finally:
        os.close(fd)
    return digest.digest() if raw else digest.hexdigest()


class RangeCopier:
    """Copy byte ranges between open file descriptors without passing them through Python.

    Tries os.copy_file_range (in-kernel, as cp does), then os.sendfile, then a buffered
    read/write loop; the first method that works is kept for the next calls.
    """

    def __init__(self, buffer_bytes=HASH_BUFFER_BYTES):
        self._method = "copy_file_range" if hasattr(os, "copy_file_range") else "sendfile"
        self._buffer_bytes = buffer_bytes
        self._buf = None

    @property
    def method(self):
        return self._method

    def copy(self, src_fd, src_off, dst_fd, dst_off, count):
        while count > 0:
            step = min(count, COPY_CHUNK_BYTES)
            done = self._copy_some(src_fd, src_off, dst_fd, dst_off, step)
            if done == 0:
                raise SafetensorsError("unexpected end of source file at byte %d" % src_off)
            src_off += done
            dst_off += done
            count -= done

    def _copy_some(self, src_fd, src_off, dst_fd, dst_off, count):
        if self._method == "copy_file_range":
            try:
                return os.copy_file_range(src_fd, dst_fd, count, src_off, dst_off)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP,
                                     errno.EPERM):
                    raise
                self._method = "sendfile"
        if self._method == "sendfile":
            try:
                os.lseek(dst_fd, dst_off, os.SEEK_SET)
                return os.sendfile(dst_fd, src_fd, src_off, count)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                self._method = "readwrite"
        if self._buf is None:
            self._buf = bytearray(self._buffer_bytes)
        view = memoryview(self._buf)
        got = os.preadv(src_fd, [view[:min(count, len(self._buf))]], src_off)
        written = 0
        while written < got:
            written += os.pwrite(dst_fd, view[written:got], dst_off + written)
        return got
