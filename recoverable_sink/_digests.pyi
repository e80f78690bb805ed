"""Record digests of a whole Arrow batch in one call, without the GIL (the C extension _digests.c)."""

from typing import Protocol

class ArrowArray(Protocol):
    """Anything exporting an Arrow array through the Arrow PyCapsule interface (a pyarrow.Array)."""

    def __arrow_c_array__(self, requested_schema: object | None = None, /) -> tuple[object, object]: ...

# A records() field: the same bytes for every record, or (kind, column name, array): kind 0 a binary or string
# column's value, 1 its length frame, 2 a list<struct<key, value>> column of headers.
Field = bytes | tuple[int, str, ArrowArray]

LANES: int
"""How many records one pass hashes on this CPU (8 with AVX-512, 4 with AVX2, else 1)."""

def batch(prefix: bytes, bodies: ArrowArray, /) -> bytes:
    """BLAKE2b-128 of prefix + element for every element of a binary or string array; 16 bytes each."""

def records(prefix: bytes, count: int, fields: tuple[Field, ...], /) -> bytes:
    """BLAKE2b-128 of prefix + the concatenation of ``fields`` for each of ``count`` records; 16 bytes each."""
