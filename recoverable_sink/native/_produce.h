/* What the _produce extension's translation units share: the Producer object, librdkafka's functions as looked up
 * by load(), the module's globals and the functions one file calls in another. Include first: it sets the
 * limited API (Python 3.10, the stable ABI) before Python.h.
 *
 * The files: _produce.c (the module: load(), errors, the type), _produce_producer.c (the handle's life, reports
 * and log lines), _produce_send.c (Arrow columns into produceva; metadata) and _produce_txn.c (transactions).
 */
#ifndef RECOVERABLE_SINK_PRODUCE_H
#define RECOVERABLE_SINK_PRODUCE_H

#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include "_rdkafka_api.h"

/* Shared between the files but not exported from the module: a hidden name is also reached without the GOT. */
#define RK_PRIVATE __attribute__((visibility("hidden")))

/* ---- librdkafka, opened at run time: k_<name> points at <name> once load() succeeded ------------------------ */

#define RK_FUNCS(X)                                                                                        \
    X(rd_kafka_version) X(rd_kafka_version_str) X(rd_kafka_conf_new) X(rd_kafka_conf_set)                  \
    X(rd_kafka_conf_destroy) X(rd_kafka_conf_set_dr_msg_cb) X(rd_kafka_conf_set_opaque) X(rd_kafka_new)    \
    X(rd_kafka_destroy) X(rd_kafka_conf_set_log_cb) X(rd_kafka_opaque) X(rd_kafka_name)                    \
    X(rd_kafka_topic_new) X(rd_kafka_topic_destroy) X(rd_kafka_topic_name) X(rd_kafka_produceva)           \
    X(rd_kafka_poll) X(rd_kafka_flush) X(rd_kafka_outq_len) X(rd_kafka_purge) X(rd_kafka_fatal_error)      \
    X(rd_kafka_err2str) X(rd_kafka_headers_new) X(rd_kafka_headers_destroy) X(rd_kafka_header_add)         \
    X(rd_kafka_metadata) X(rd_kafka_metadata_destroy) X(rd_kafka_init_transactions)                        \
    X(rd_kafka_begin_transaction) X(rd_kafka_send_offsets_to_transaction) X(rd_kafka_commit_transaction)   \
    X(rd_kafka_abort_transaction) X(rd_kafka_error_code) X(rd_kafka_error_string)                          \
    X(rd_kafka_error_is_fatal) X(rd_kafka_error_is_retriable) X(rd_kafka_error_txn_requires_abort)         \
    X(rd_kafka_error_destroy) X(rd_kafka_consumer_group_metadata_new)                                      \
    X(rd_kafka_consumer_group_metadata_destroy) X(rd_kafka_topic_partition_list_new)                       \
    X(rd_kafka_topic_partition_list_add) X(rd_kafka_topic_partition_list_destroy)

#define RK_DECLARE(name) extern RK_PRIVATE __typeof__(name) *k_##name;
RK_FUNCS(RK_DECLARE)

extern RK_PRIVATE int loaded; /* set once by load(): every k_ pointer is valid */
extern RK_PRIVATE PyObject *KafkaErrorType, *KafkaExceptionType; /* confluent-kafka's, raised by raise_kafka */

/* ---- the Producer object ---------------------------------------------------------------------------------- */

#define TOPIC_NAMES_KEPT 32 /* failures whose topic name is kept, for error messages; the rest keep positions */

typedef struct {
    uint64_t opaque; /* the position the record was sent with: (slot << 32) | row */
    int32_t err;
    int32_t partition;
    char *topic;
} Failure;

/* What was acknowledged to one topic-partition since the last take_written(): its lowest and highest offset and
 * how many records. Kept only when the handle was made with offsets=True (success reports on). */
typedef struct {
    const char *topic;     /* a Topic's name (below), or "" */
    rd_kafka_topic_t *rkt; /* that Topic's handle (or NULL): its address names it alone */
    int32_t partition;
    int64_t first, last, count;
} Written;

/* A topic whose acknowledgements were reported: its name and a reference held on it until the handle closes, so
 * that no other topic can ever have its address. */
typedef struct {
    char *name;
    rd_kafka_topic_t *rkt;
} Topic;

#define LOG_LINES_KEPT 1000 /* log lines kept between two take_logs(); later ones are counted, not kept */

typedef struct {
    int level; /* syslog's, 0 (emergency) to 7 (debug) */
    char *text;
} LogLine;

typedef struct {
    PyObject_HEAD
    rd_kafka_t *rk;
    pthread_mutex_t lock; /* failures and log lines are appended by whichever thread serves reports or logs */
    Failure *failures;
    size_t count, capacity, named;
    LogLine *logs;
    size_t logs_count, logs_dropped;
    int track_written; /* success reports on: each acknowledged record's offset is noted in written */
    Written *written;
    size_t written_count, written_capacity, written_last;
    int written_lost; /* an entry could not be allocated: what take_written() returns is incomplete */
    Topic *topics; /* of the written entries, kept across take_written() */
    size_t topics_count, topics_capacity;
    int busy; /* a call is using rk without the GIL: close() must not destroy it meanwhile */
    /* Records are handed over without a copy of their values: librdkafka reads each value from the batch's own
     * Arrow buffer until the record is destroyed (acknowledged or failed). The value columns of every send()
     * are kept here until librdkafka's queue is seen empty, or until the handle is destroyed. */
    PyObject *values;
    /* purge() with in-flight requests: their records are destroyed at once, but a request being written to the
     * socket may still read their values; those are then kept until the handle is destroyed. */
    int pinned;
} Producer;

/* ---- helpers of every file -------------------------------------------------------------------------------- */

/* Seconds as librdkafka's milliseconds: negative is "wait forever", and huge values are clamped. */
static inline int to_ms(double seconds) {
    if (seconds < 0)
        return -1;
    return seconds * 1000 >= (double)INT_MAX ? INT_MAX : (int)(seconds * 1000);
}

static inline int check_open(Producer *self) {
    if (self->rk == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the producer is closed");
        return -1;
    }
    return 0;
}

/* errors (_produce.c): set confluent-kafka's KafkaException and return NULL; raise_error destroys error. */
RK_PRIVATE PyObject *raise_kafka(int code, const char *text, int fatal, int retriable, int txn_requires_abort);
RK_PRIVATE PyObject *raise_error(rd_kafka_error_t *error);

/* ---- the methods, gathered into the type in _produce.c ------------------------------------------------------ */

/* _produce_producer.c */
RK_PRIVATE PyObject *Producer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs);
RK_PRIVATE int Producer_init(Producer *self, PyObject *args, PyObject *kwargs);
RK_PRIVATE void Producer_dealloc(Producer *self);
RK_PRIVATE Py_ssize_t Producer_len(Producer *self);
RK_PRIVATE PyObject *Producer_poll(Producer *self, PyObject *args);
RK_PRIVATE PyObject *Producer_flush(Producer *self, PyObject *args);
RK_PRIVATE PyObject *Producer_purge(Producer *self, PyObject *unused);
RK_PRIVATE PyObject *Producer_close(Producer *self, PyObject *unused);
RK_PRIVATE PyObject *Producer_take_failures(Producer *self, PyObject *unused);
RK_PRIVATE PyObject *Producer_take_logs(Producer *self, PyObject *unused);
RK_PRIVATE PyObject *Producer_take_written(Producer *self, PyObject *unused);

/* _produce_send.c */
RK_PRIVATE PyObject *Producer_send(Producer *self, PyObject *args);
RK_PRIVATE PyObject *Producer_connect(Producer *self, PyObject *args);
RK_PRIVATE PyObject *Producer_partition_count(Producer *self, PyObject *args);

/* _produce_txn.c */
RK_PRIVATE PyObject *Producer_init_transactions(Producer *self, PyObject *args);
RK_PRIVATE PyObject *Producer_begin_transaction(Producer *self, PyObject *unused);
RK_PRIVATE PyObject *Producer_commit_transaction(Producer *self, PyObject *args);
RK_PRIVATE PyObject *Producer_abort_transaction(Producer *self, PyObject *args);
RK_PRIVATE PyObject *Producer_send_marker(Producer *self, PyObject *args);

#endif
