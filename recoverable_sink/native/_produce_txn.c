/* Transactions (exactly_once): init, begin, commit and abort, and a consumer group's offset sent into the open
 * transaction (the commit marker), each a librdkafka call made without the GIL; an error raises KafkaException.
 */
#include "_produce.h"
#include <string.h>

#define TXN_CALL(call)                                                                                       \
    do {                                                                                                     \
        rd_kafka_error_t *error;                                                                             \
        self->busy++;                                                                                        \
        Py_BEGIN_ALLOW_THREADS                                                                               \
        error = (call);                                                                                      \
        Py_END_ALLOW_THREADS                                                                                 \
        self->busy--;                                                                                        \
        if (error != NULL)                                                                                   \
            return raise_error(error);                                                                       \
    } while (0)

/* The transaction calls that take a timeout in seconds: init, commit and abort. */
#define TXN_TIMED(method, call)                                                                              \
    PyObject *Producer_##method(Producer *self, PyObject *args) {                                            \
        double timeout;                                                                                      \
        if (!PyArg_ParseTuple(args, "d", &timeout) || check_open(self) < 0)                                  \
            return NULL;                                                                                     \
        TXN_CALL(call(self->rk, to_ms(timeout)));                                                            \
        Py_RETURN_NONE;                                                                                      \
    }
TXN_TIMED(init_transactions, k_rd_kafka_init_transactions)
TXN_TIMED(commit_transaction, k_rd_kafka_commit_transaction)
TXN_TIMED(abort_transaction, k_rd_kafka_abort_transaction)

PyObject *Producer_begin_transaction(Producer *self, PyObject *unused) {
    if (check_open(self) < 0)
        return NULL;
    TXN_CALL(k_rd_kafka_begin_transaction(self->rk));
    Py_RETURN_NONE;
}

/* send_marker(group, topic, partition, offset, metadata, timeout): one consumer-group offset into the open
 * transaction (the commit marker); the group's metadata needs no consumer. */
PyObject *Producer_send_marker(Producer *self, PyObject *args) {
    const char *group, *topic, *metadata;
    int partition;
    long long offset;
    double timeout;
    if (!PyArg_ParseTuple(args, "ssiLsd", &group, &topic, &partition, &offset, &metadata, &timeout) ||
        check_open(self) < 0)
        return NULL;
    rd_kafka_topic_partition_list_t *offsets = k_rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_t *tp = k_rd_kafka_topic_partition_list_add(offsets, topic, partition);
    tp->offset = offset;
    tp->metadata = strdup(metadata); /* freed with the list */
    if (tp->metadata == NULL) {
        k_rd_kafka_topic_partition_list_destroy(offsets);
        return PyErr_NoMemory();
    }
    /* With its NUL, as confluent-kafka writes a commit's metadata and as its readers expect it (they read up to
     * the NUL): without it a marker read back by confluent-kafka runs past its end into whatever follows. */
    tp->metadata_size = strlen(metadata) + 1;
    rd_kafka_consumer_group_metadata_t *cgmd = k_rd_kafka_consumer_group_metadata_new(group);
    rd_kafka_error_t *error;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    error = k_rd_kafka_send_offsets_to_transaction(self->rk, offsets, cgmd, to_ms(timeout));
    Py_END_ALLOW_THREADS
    self->busy--;
    k_rd_kafka_consumer_group_metadata_destroy(cgmd);
    k_rd_kafka_topic_partition_list_destroy(offsets);
    if (error != NULL)
        return raise_error(error);
    Py_RETURN_NONE;
}
