"""How a task's input ended, as spark_input reads it from the worker's input stream: the stream is found on the
call stack as pyspark's worker holds it (a frame of module pyspark.worker with a local ``infile``)."""

import io

import pytest

from recoverable_sink.executor.spark_input import END_OF_STREAM, InputEnd, how_input_ended


def _as_pyspark_worker(infile):
    """Call how_input_ended from a frame shaped like pyspark.worker's process(), which holds ``infile``."""
    scope = {"__name__": "pyspark.worker", "how_input_ended": how_input_ended}
    exec("def process(infile):\n    return how_input_ended()\n", scope)  # noqa: S102 - a frame of that module
    return scope["process"](infile)


@pytest.mark.parametrize(("after_arrow", "end"), [
    (END_OF_STREAM + b"\x00\x00\x00\x00", InputEnd.COMPLETE),  # Spark's end-of-stream word, then more protocol
    (b"", InputEnd.CUT_SHORT),  # the JVM shut the worker's input down
    (b"\x00\x00\x00\x07", InputEnd.UNKNOWN),  # a protocol this module does not know
])
def test_the_word_after_the_arrow_stream_tells_the_end(after_arrow, end):
    infile = io.BufferedReader(io.BytesIO(after_arrow))
    assert _as_pyspark_worker(infile) is end
    assert infile.read() == after_arrow  # peeked at, never consumed: pyspark reads it itself


def test_outside_a_pyspark_worker_the_end_is_unknown():
    assert how_input_ended() is InputEnd.UNKNOWN
