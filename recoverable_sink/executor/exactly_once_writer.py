"""The exactly-once partition writer (executor): the at-least-once protocol inside one Kafka transaction per
partition attempt, committed with a marker that names the attempts whose transactions hold the partition.

What changes against :class:`~recoverable_sink.executor.writer.AtLeastOnceWriter`:
- the producer is the partition's own transactional one; opening it fences every earlier attempt on any host,
  and its marker says whether one of them already committed the partition (then the input is only counted);
- under transactions an earlier attempt's records count only if its transaction committed, so the WAL's
  digests are used only for the attempts the marker names;
- the end commits the transaction with the marker; an abort aborts it, whatever Kafka had acknowledged.
"""

from __future__ import annotations

import time

import pyarrow as pa

from recoverable_sink._logging import get_logger
from recoverable_sink.contract import SinkCommitMessage
from recoverable_sink.errors import DeliveryError, FatalProducerError, RecordError, RerunRefusedError
from recoverable_sink.executor.normalise import normalise
from recoverable_sink.executor.resume_plan import Evidence, Prior, attempt_name, judge_skipped
from recoverable_sink.executor.writer import AtLeastOnceWriter, Phase, final_wait_s
from recoverable_sink.identity import record_digests
from recoverable_sink.producer.marker import Marker
from recoverable_sink.producer.protocol import SinkProducer
from recoverable_sink.producer.transactions import PartitionTransaction, read_markers, transactional_id
from recoverable_sink.wal import DONE, AttemptInfo

log = get_logger("writer")


class ExactlyOnceWriter(AtLeastOnceWriter):
    """One partition attempt in one transaction (see the module's docstring)."""

    FINGERPRINT_WITHOUT_WAL = True  # the marker carries the input's fingerprint even with the WAL off

    txn: PartitionTransaction
    committed: list[Prior]  # the earlier attempts whose committed transactions hold records
    found: Marker | None  # this write's marker for the partition, as open() found it

    def _open_producer(self) -> SinkProducer:
        self.committed = []
        self.txn = PartitionTransaction(self.options, self.ident.write_id, self.ident.partition, self.where,
                                        self.ident.transaction_scope, self.ident.run)
        self.found = self.txn.open(self.plan.topic_option)
        assert self.txn.producer is not None
        return self.txn.producer

    def _recover(self) -> Phase:
        """Plan from this host's WAL and the markers (:mod:`~recoverable_sink.executor.resume_plan`): resume from
        what committed transactions hold, skip a committed partition this host cannot account for record by record
        (its fingerprint is checked at the end), or refuse before anything is sent."""
        priors = self.log.write_priors(self._task())
        self._markers = self._other_markers(priors)
        phase = self._follow(self._planned(priors))
        if phase is Phase.WRITING:
            self.committed = list(self.resume.holders)
            if self.found is not None:
                self.txn.begin()  # open() began none: a transaction of this write committed the partition
        return phase

    def _evidence(self, priors: tuple[Prior, ...], waited_out: bool) -> Evidence:
        return Evidence(task=self._task(), priors=priors, own_marker=self.found, markers=self._markers,
                        later_micro_batch=self.txn.latest_batch, waited_out=waited_out, wal=self.log.path)

    def _other_markers(self, priors: tuple[Prior, ...]) -> dict[int, tuple[Marker, ...]]:
        """This write's markers (for this topic) of the other partitions that other runs' attempts on this host
        wrote: one marker read per partition, only on a re-run."""
        run = self.txn.run
        partitions = sorted({p.partition for p in priors if p.run != run and p.partition != self.ident.partition})
        if run is None or not partitions:
            return {}
        topic = self.plan.topic_option
        found: dict[int, tuple[Marker, ...]] = {}
        for partition in partitions:
            group = transactional_id(self.options, self.ident.transaction_scope, partition)
            markers = read_markers(self.options, group, [topic] if topic else None, self.txn.fail)
            found[partition] = tuple(m for m in markers if m.write_id == self.ident.write_id
                                     and (topic is None or (m.topic or topic) == topic))
        return found

    def _begun(self) -> None:
        """Nothing more: the transaction fences every earlier attempt, and the marker says what they committed."""

    def _release_after_failed_start(self) -> None:
        self.txn.abort()  # no transaction of this attempt stays open behind a failed start
        self.log.drop()

    def _before_send(self) -> None:
        self.txn.sending()

    def _located(self, exc: DeliveryError | RecordError) -> DeliveryError | RecordError:
        hint = ""
        if isinstance(exc, FatalProducerError):
            timed_out = self.txn.timed_out()
            hint = (f"; {timed_out.strip()}" if timed_out else
                    "; under exactly_once this most often means another attempt of this partition (a retry or "
                    "a speculative copy) fenced this one: its transaction is aborted and the other attempt's "
                    "data is the one that counts")
        return type(exc)(f"{self.where}: {self.options.scrub(str(exc))}{hint}")

    def _keep_proof(self, message: SinkCommitMessage) -> None:
        """Commit what this attempt sent with the marker, which then names every attempt whose transaction holds
        records of the partition. Their WAL digests stay as proof (released like at_least_once's); attempts
        whose transactions did not commit are dropped."""
        ledger = self.ledger
        holders = list(self.committed)
        # Between here and commit's return a kill leaves the outcome to the next attempt's init_transactions (it
        # completes a commit under way, or aborts) and its marker read.
        if self.marker_topic is not None and ledger.produced:
            names = [attempt_name(a.key) for a in holders]
            if self.log.key is not None:
                names.append(attempt_name(self.log.key))
            self.txn.commit(self.marker_topic, self.resume.committed_records + ledger.acked,
                            final_wait_s(self.options), names, self.log.path, self.fingerprint)
            self.txn.close()
            sent = True
        else:
            self.txn.abort()  # nothing was sent: no transaction, no new marker
            sent = False
        if holders or self.earlier:
            message.committed_before = True
            log.info("%s: earlier transactions committed %d records of this partition's input; this one sent the "
                     "%d they lacked%s", self.where, message.skipped, ledger.acked,
                     f" ({message.diverged} committed earlier are no longer in the input)" if message.diverged else "")
        if self.log.key is None:
            return
        kept = {a.key for a in holders}
        # Only this run's attempts that did not commit go: an earlier run's stay as proof for the other partitions
        # of this run (and of a later one), whatever their marker says.
        dropped = [p.key for p in self._this_runs(self.log.priors) if p.key not in kept]
        if sent:
            self.log.finish([], dropped=dropped)
        else:
            self.log.purge([self.log.key, *dropped])
        self.log.committed([a.key for a in holders if a.state != DONE])

    def write(self, raw: pa.RecordBatch) -> None:
        if self.phase is Phase.SKIPPING and raw.num_rows:
            # Only counted, and fingerprinted: the end checks it is the input the marker's transactions committed.
            self.fingerprint.add(record_digests(normalise(raw, self.plan), self.plan.topic_option, self.cluster_id))
        super().write(raw)

    def _commit_skipped(self) -> SinkCommitMessage:
        """An earlier transaction holds the partition: nothing was sent. Its input must be the one committed (the
        marker's fingerprint; its count, for a marker without one), or part of the partition would be lost or
        repeated."""
        self.txn.close()
        marker = self.txn.marker
        assert marker is not None
        # A marker without a fingerprint is judged by its count: a task reading a shuffle whose upstream fetch
        # failed can see its input end early, commit that part and only then fail in the JVM; skipping the whole
        # partition would lose the rest.
        refusal = judge_skipped(self._task(), marker, self.fingerprint, self.position, self.log.path)
        if refusal is not None:
            raise RerunRefusedError(refusal.message)
        if marker.run is None or marker.run == self.txn.run:
            # A retry in the run that committed: whatever its run's earlier attempts logged is in Kafka. An earlier
            # run's logs stay, as proof for the partitions of this re-run that take from them.
            self.log.purge([p.key for p in self._this_runs(self.log.priors)])
        self.message.received = self.position
        self.message.committed_before = True
        self.message.offsets_complete = False  # an earlier attempt's transaction wrote them, this one knows not where
        self.message.seconds = time.monotonic() - self.started
        return self.message

    def _this_runs(self, attempts: list[AttemptInfo]) -> list[AttemptInfo]:
        """The attempts of this run (all of them for a task without a run: a writer driven outside Spark)."""
        if self.txn.run is None:
            return attempts
        return [a for a in attempts if a.run == self.txn.run]

    def _waits_on_abort(self) -> bool:
        return False  # the transaction is aborted whatever was acknowledged

    def _release_after_abort(self) -> None:
        self.txn.abort()  # the records stay in the WAL; a re-run under the same id sends them
