"""An upgrade in mid-query: a stream that the release before the proof topic was writing is killed in mid-micro-batch
and restarted from its checkpoint under this one, which reads the WAL and the commit markers that release wrote and
finishes the micro-batch: every record once, in both delivery modes.

The earlier release is taken from git (the commit before the proof topic, PREVIOUS_RELEASE) into a directory of its
own and run from there, its package first on the path of the driver and of Spark's Python workers (without its C
extensions: it hashes with hashlib and sends through confluent-kafka's produce(), as under --py-files)."""

import os
import subprocess
import sys
import tarfile
import uuid
from io import BytesIO
from pathlib import Path

import pytest

from recoverable_sink.wal import DONE, open_wal
from testing.chaos.checker import ids_in_topic, verdict
from testing.chaos.lab import kill_group, python_subprocess
from testing.spark import python_env
from testing.stream_job import write_inputs
from testing.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
PREVIOUS_RELEASE = "354d82a"  # main before the partition writer and the proof topic (issues 61 and 62)


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory) -> Path:
    """The earlier release's package, its Spark entry point and test harness, unpacked from git."""
    found = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", PREVIOUS_RELEASE, "recoverable_sink",
                            "pyspark_recoverable_kafka.py", "testing"], capture_output=True, timeout=120)
    if found.returncode != 0:
        pytest.skip(f"the earlier release {PREVIOUS_RELEASE} is not in this checkout's history (a shallow clone?)")
    where = tmp_path_factory.mktemp("previous-release")
    with tarfile.open(fileobj=BytesIO(found.stdout)) as archive:
        archive.extractall(where, filter="data")
    return where



@pytest.mark.parametrize("mode", ["at_least_once", "exactly_once"])
def test_a_stream_killed_under_the_previous_release_is_finished_exactly_by_this_one(kafka, new_topic, tmp_path,
                                                                                    previous_release, mode):
    topic, prefix = new_topic(4), f"up-{uuid.uuid4().hex[:6]}-"
    total = write_inputs(tmp_path / "in", [3000, 3000, 40, 60])
    pause = tmp_path / "paused"
    args = ["-m", "testing.stream_job", "--source", "files", "--input", str(tmp_path / "in"), "--max-per-trigger", "4",
            "--master", "local[4,4]", "--bootstrap", kafka.bootstrap_servers, "--topic", topic,
            "--checkpoint", str(tmp_path / "checkpoint"), "--wal", str(tmp_path / "wal"),
            "--option", f"delivery.guarantee={mode}", "--option", f"transactional.id.prefix={prefix}",
            "--conf", "spark.sql.files.openCostInBytes=134217728"]
    # The earlier release: its own directory first on every path (the driver's, as its working directory, and the
    # workers', through PYTHONPATH), so that nothing of this checkout is imported.
    env = {**python_env(), "PYTHONPATH": str(previous_release)}
    with open(tmp_path / "old.log", "ab") as out:
        old = subprocess.Popen([sys.executable, *args, "--option", "_test.pauseAfterRecords=1000", "--option",
                                f"_test.pauseFile={pause}"], cwd=previous_release, stdout=out,
                               stderr=subprocess.STDOUT, start_new_session=True, env=env)

    def others_done_one_paused() -> bool:
        if old.poll() is not None:
            return True
        return pause.exists() and sum(a.state == DONE for a in open_wal(str(tmp_path / "wal")).attempts()) >= 3

    try:
        wait_until(others_done_one_paused, 240, "three partitions finished and one paused, under the earlier release")
        assert old.poll() is None, (tmp_path / "old.log").read_text()[-3000:]
    finally:
        kill_group(old)
    # The earlier release never marks an attempt published (it had no proof topic): this one would have.
    assert not any(a.published for a in open_wal(str(tmp_path / "wal")).attempts()), \
        "the paused stream ran this checkout's package, not the earlier release's"

    new = python_subprocess(args, tmp_path / "new.log")
    assert new.wait(300) == 0, (tmp_path / "new.log").read_text(errors="replace")[-3000:]
    found = ids_in_topic(kafka.bootstrap_servers, topic, expected=total)
    assert verdict((str(i) for i in range(total)), found) == (0, 0, 0)
    assert os.path.exists(tmp_path / "checkpoint" / "commits" / "0")
