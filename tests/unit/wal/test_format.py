"""The WAL's encodings: segments built in place, their checksums."""


import struct
import zlib

import pyarrow as pa
import pytest

from recoverable_sink.identity import record_digests
from recoverable_sink.wal import format as wal_format
from recoverable_sink.wal.format import encode_segment, segment_value
from tests.unit.wal.helpers import batch


def ipc_stream(b):
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, b.schema) as writer:
        writer.write_batch(b)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("b", [
    batch([b"a", b"", None, b"x" * 1000], keys=[b"k", None, b"", b"k2"]),
    batch([b"v%d" % i for i in range(1000)]).slice(3, 501),
    batch([b"x" * 70_000]),
], ids=["nulls-and-empties", "sliced", "one-large"])
def test_a_segment_built_in_place_has_the_bytes_of_the_stream_wrapped_afterwards(b):
    """The on-disk format is unchanged by building the segment in one buffer: a WAL written by an earlier
    release reads the same, and this one's the same for it."""
    digests = record_digests(b, "t", "c")
    value, payload_len = segment_value(77, digests, b)
    payload = ipc_stream(b)
    assert payload_len == len(payload)
    assert value.to_pybytes() == encode_segment(77, digests, payload, 0)


def test_segment_checksums_are_zlibs_crc32_whichever_implementation_computed_them():
    """The WAL checksums with zlib-ng where installed and zlib where not (--py-files): a WAL written by
    one must read under the other, so the header holds zlib's CRC32 of the rest of the segment."""
    b = batch([b"x" * 5000, b"", None], keys=[b"k", None, b""])
    value = segment_value(9, record_digests(b, "t", "c"), b)[0].to_pybytes()
    size = wal_format.SEG_HEADER.size
    count, first, payload_len, flags = wal_format.SEG_HEADER.unpack_from(value)[2:]
    assert wal_format.SEG_HEADER.unpack_from(value)[1] == \
        zlib.crc32(value[size:], zlib.crc32(struct.pack("<IQQI", count, first, payload_len, flags)))
    assert wal_format.crc32.__module__.startswith("zlib_ng"), "make setup installs zlib-ng: a quiet fallback?"
