/* The sink's producer loop in C: Arrow buffers straight into librdkafka, no per-record Python object.
 *
 * Why: with confluent-kafka each record costs a produce() call (argument parsing, a bytes object per key and
 * value, a small state per record for its delivery report) and poll() takes the GIL once per acknowledged
 * record. Here a batch is handed over in one call that holds no GIL, and librdkafka itself keeps only
 * failure reports (delivery.report.only.error), which a C callback collects with the record's position
 * (the message opaque): what succeeded is learnt at drains, as in the Python path.
 *
 * librdkafka is not linked: load() opens the library confluent-kafka ships (the same build its producer
 * uses) or the system's, checks its version and looks up the functions below. They are declared in
 * _rdkafka_api.h, so building needs only a C compiler and Python's headers. The columns come through the Arrow
 * C Data Interface (_arrow_reader.h), and only the limited API of Python 3.10 is used (the stable ABI).
 *
 * librdkafka's log lines are kept here, not written to stderr: its threads cannot call Python, so the lines wait
 * in a bounded queue until take_logs() hands them to the sink's logger (delivery.NativeProducer, at every poll).
 */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "_arrow_reader.h"
#include "_rdkafka_api.h"

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

#define DECLARE(name) static __typeof__(name) *k_##name;
RK_FUNCS(DECLARE)

static int loaded = 0;
static PyObject *KafkaErrorType = NULL, *KafkaExceptionType = NULL, *ProducerType = NULL;

/* ---- errors -------------------------------------------------------------------------------------------- */

/* Raise confluent-kafka's KafkaException(KafkaError(...)), so callers classify errors one way for both paths. */
static PyObject *raise_kafka(int code, const char *text, int fatal, int retriable, int txn_requires_abort) {
    PyObject *kwargs = Py_BuildValue("{s:O,s:O,s:O}", "fatal", fatal ? Py_True : Py_False, "retriable",
                                     retriable ? Py_True : Py_False, "txn_requires_abort",
                                     txn_requires_abort ? Py_True : Py_False);
    PyObject *args = Py_BuildValue("(iN)", code, PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "replace"));
    PyObject *err = (kwargs && args) ? PyObject_Call(KafkaErrorType, args, kwargs) : NULL;
    Py_XDECREF(kwargs);
    Py_XDECREF(args);
    if (err != NULL) {
        PyErr_SetObject(KafkaExceptionType, err);
        Py_DECREF(err);
    }
    return NULL;
}

static PyObject *raise_error(rd_kafka_error_t *error) {
    raise_kafka(k_rd_kafka_error_code(error), k_rd_kafka_error_string(error), k_rd_kafka_error_is_fatal(error),
                k_rd_kafka_error_is_retriable(error), k_rd_kafka_error_txn_requires_abort(error));
    k_rd_kafka_error_destroy(error);
    return NULL;
}

/* ---- failure reports ------------------------------------------------------------------------------------ */

#define TOPIC_NAMES_KEPT 32 /* failures whose topic name is kept, for error messages; the rest keep positions */

typedef struct {
    uint64_t opaque; /* the position the record was sent with: (slot << 32) | row */
    int32_t err;
    int32_t partition;
    char *topic;
} Failure;

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
    int busy; /* a call is using rk without the GIL: close() must not destroy it meanwhile */
    /* Records are handed over without a copy of their values: librdkafka reads each value from the batch's own
     * Arrow buffer until the record is destroyed (acknowledged or failed). The value columns of every send()
     * are kept here until librdkafka's queue is seen empty, or until the handle is destroyed. */
    PyObject *values;
    /* purge() with in-flight requests: their records are destroyed at once, but a request being written to the
     * socket may still read their values; those are then kept until the handle is destroyed. */
    int pinned;
} Producer;

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque) {
    (void)rk;
    Producer *self = opaque;
    if (msg->err == RD_KAFKA_RESP_ERR_NO_ERROR)
        return; /* not expected with delivery.report.only.error; an acknowledgement is learnt at a drain */
    pthread_mutex_lock(&self->lock);
    if (self->count == self->capacity) {
        size_t capacity = self->capacity ? self->capacity * 2 : 64;
        Failure *grown = realloc(self->failures, capacity * sizeof(Failure));
        if (grown == NULL) {
            /* Counted as failed nowhere: the drain would count it acknowledged. Stop instead of lying. */
            fprintf(stderr, "recoverable_sink._produce: out of memory recording a failed delivery\n");
            abort();
        }
        self->failures = grown;
        self->capacity = capacity;
    }
    Failure *f = &self->failures[self->count++];
    f->opaque = (uint64_t)(uintptr_t)msg->_private;
    f->err = msg->err;
    f->partition = msg->partition;
    f->topic = NULL;
    if (self->named < TOPIC_NAMES_KEPT && msg->rkt != NULL) {
        f->topic = strdup(k_rd_kafka_topic_name(msg->rkt));
        self->named++;
    }
    pthread_mutex_unlock(&self->lock);
}

/* A log line, from any of librdkafka's threads (or the caller's, in rd_kafka_new): queued for take_logs(). */
static void on_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf) {
    Producer *self = k_rd_kafka_opaque(rk);
    if (self == NULL)
        return;
    int len = snprintf(NULL, 0, "%s [%s] %s", fac, k_rd_kafka_name(rk), buf);
    char *text = len < 0 ? NULL : malloc((size_t)len + 1);
    if (text != NULL)
        snprintf(text, (size_t)len + 1, "%s [%s] %s", fac, k_rd_kafka_name(rk), buf);
    pthread_mutex_lock(&self->lock);
    if (text == NULL || self->logs_count == LOG_LINES_KEPT) {
        self->logs_dropped++;
        free(text);
    } else {
        if (self->logs == NULL)
            self->logs = malloc(LOG_LINES_KEPT * sizeof(LogLine));
        if (self->logs == NULL) {
            self->logs_dropped++;
            free(text);
        } else {
            self->logs[self->logs_count].level = level;
            self->logs[self->logs_count++].text = text;
        }
    }
    pthread_mutex_unlock(&self->lock);
}

/* ---- Arrow columns ---------------------------------------------------------------------------------------- */

typedef ar_binary_t BinCol; /* a binary or string column (_arrow_reader.h) */
typedef ar_int_t IntCol;    /* an int32 or int64 column */

static const char EMPTY[1] = {0};

/* Seconds as librdkafka's milliseconds: negative is "wait forever", and huge values are clamped. */
static int to_ms(double seconds) {
    if (seconds < 0)
        return -1;
    return seconds * 1000 >= (double)INT_MAX ? INT_MAX : (int)(seconds * 1000);
}

static inline int is_valid(const uint8_t *valid, Py_ssize_t i) {
    return valid == NULL || (valid[i >> 3] >> (i & 7)) & 1;
}

/* Row i of a binary column: 0 for null, else 1 with its bytes (an empty value points at EMPTY, not NULL,
 * since librdkafka reads a NULL pointer as a null value). */
static inline int bin_get(const BinCol *c, Py_ssize_t i, const char **ptr, size_t *len) {
    Py_ssize_t j = c->offset + i;
    if (!is_valid(c->valid, j))
        return 0;
    int64_t start, end;
    if (c->wide) {
        start = ((const int64_t *)c->offsets)[j];
        end = ((const int64_t *)c->offsets)[j + 1];
    } else {
        start = ((const int32_t *)c->offsets)[j];
        end = ((const int32_t *)c->offsets)[j + 1];
    }
    *len = (size_t)(end - start);
    *ptr = *len ? (const char *)c->data + start : EMPTY;
    return 1;
}

static inline int int_get(const IntCol *c, Py_ssize_t i, int64_t *value) {
    Py_ssize_t j = c->offset + i;
    if (!is_valid(c->valid, j))
        return 0;
    *value = c->width == 8 ? ((const int64_t *)c->values)[j] : ((const int32_t *)c->values)[j];
    return 1;
}

/* ---- the producer ------------------------------------------------------------------------------------------ */

static int check_loaded(void) {
    if (!loaded) {
        PyErr_SetString(PyExc_RuntimeError, "librdkafka is not loaded: call _produce.load() first");
        return -1;
    }
    return 0;
}

static int check_open(Producer *self) {
    if (self->rk == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the producer is closed");
        return -1;
    }
    return 0;
}

static int Producer_init(Producer *self, PyObject *args, PyObject *kwargs) {
    PyObject *config, *key, *value;
    Py_ssize_t pos = 0;
    char errstr[512];
    if (check_loaded() < 0 || !PyArg_ParseTuple(args, "O!", &PyDict_Type, &config))
        return -1;
    if (self->rk != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the producer is already initialised");
        return -1;
    }
    rd_kafka_conf_t *conf = k_rd_kafka_conf_new();
    while (PyDict_Next(config, &pos, &key, &value)) {
        const char *k = PyUnicode_AsUTF8AndSize(key, NULL), *v = PyUnicode_AsUTF8AndSize(value, NULL);
        if (k == NULL || v == NULL) {
            k_rd_kafka_conf_destroy(conf);
            return -1;
        }
        if (k_rd_kafka_conf_set(conf, k, v, errstr, sizeof errstr) != RD_KAFKA_CONF_OK) {
            k_rd_kafka_conf_destroy(conf);
            raise_kafka(RD_KAFKA_RESP_ERR__INVALID_ARG, errstr, 0, 0, 0);
            return -1;
        }
    }
    if (k_rd_kafka_conf_set(conf, "delivery.report.only.error", "true", errstr, sizeof errstr) != RD_KAFKA_CONF_OK) {
        k_rd_kafka_conf_destroy(conf);
        raise_kafka(RD_KAFKA_RESP_ERR__INVALID_ARG, errstr, 0, 0, 0);
        return -1;
    }
    k_rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
    k_rd_kafka_conf_set_log_cb(conf, on_log);
    k_rd_kafka_conf_set_opaque(conf, self);
    rd_kafka_t *rk = k_rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr); /* owns conf on success */
    if (rk == NULL) {
        k_rd_kafka_conf_destroy(conf);
        raise_kafka(RD_KAFKA_RESP_ERR__INVALID_ARG, errstr, 0, 0, 0);
        return -1;
    }
    self->rk = rk;
    return 0;
}

static PyObject *Producer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    Producer *self = (Producer *)alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->values = PyList_New(0);
    if (self->values == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    pthread_mutex_init(&self->lock, NULL);
    return (PyObject *)self;
}

static void drop_values(Producer *self) {
    if (self->values != NULL && PyList_Size(self->values) > 0)
        PyList_SetSlice(self->values, 0, PyList_Size(self->values), NULL);
}

/* An empty queue means every record handed over was destroyed: no value is read any more. Not while another
 * thread is in a call (a send may be about to hand over records of the columns it just added). */
static void release_values(Producer *self) {
    if (!self->pinned && !self->busy && self->rk != NULL && PyList_Size(self->values) > 0 &&
        k_rd_kafka_outq_len(self->rk) == 0)
        drop_values(self);
}

static void free_failures(Failure *failures, size_t count) {
    for (size_t i = 0; i < count; i++)
        free(failures[i].topic);
    free(failures);
}

static void free_logs(LogLine *logs, size_t count) {
    for (size_t i = 0; i < count; i++)
        free(logs[i].text);
    free(logs);
}

static void close_rk(Producer *self) {
    rd_kafka_t *rk = self->rk;
    self->rk = NULL;
    if (rk != NULL) {
        Py_BEGIN_ALLOW_THREADS
        k_rd_kafka_destroy(rk);
        Py_END_ALLOW_THREADS
    }
    drop_values(self); /* librdkafka's threads are gone */
    self->pinned = 0;
}

static void Producer_dealloc(Producer *self) {
    PyTypeObject *type = Py_TYPE(self);
    close_rk(self);
    Py_CLEAR(self->values);
    free_failures(self->failures, self->count);
    free_logs(self->logs, self->logs_count);
    pthread_mutex_destroy(&self->lock);
    freefunc free_self = (freefunc)PyType_GetSlot(type, Py_tp_free);
    free_self(self);
    Py_DECREF(type); /* a heap type: each instance holds a reference to it */
}

/* A fatal error (a fenced transactional producer, a broken idempotence guarantee) as a KafkaException. */
static int check_fatal(Producer *self) {
    char errstr[512];
    rd_kafka_resp_err_t err = k_rd_kafka_fatal_error(self->rk, errstr, sizeof errstr);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        raise_kafka(err, errstr, 1, 0, 0);
        return -1;
    }
    return 0;
}

static PyObject *Producer_poll(Producer *self, PyObject *args) {
    double timeout = 0;
    int served;
    if (!PyArg_ParseTuple(args, "|d", &timeout) || check_open(self) < 0)
        return NULL;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    served = k_rd_kafka_poll(self->rk, to_ms(timeout));
    Py_END_ALLOW_THREADS
    self->busy--;
    release_values(self);
    if (check_fatal(self) < 0)
        return NULL;
    return PyLong_FromLong(served);
}

static int64_t monotonic_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* rd_kafka_flush waits in slices of 10 ms and ends a slice early only for a delivery report; with success reports
 * off (delivery.report.only.error) an emptied queue was noticed up to 10 ms late, at every drain and at every task's
 * end. Flushing 1 ms at a time notices it within a millisecond, and each call keeps linger.ms waived meanwhile. */
static void flush_finely(rd_kafka_t *rk, int timeout_ms) {
    int64_t deadline = timeout_ms < 0 ? INT64_MAX : monotonic_ms() + timeout_ms;
    do {
        int64_t left = deadline - monotonic_ms();
        k_rd_kafka_flush(rk, left <= 0 ? 0 : 1);
        if (left <= 1)
            break;
    } while (k_rd_kafka_outq_len(rk) > 0);
}

static PyObject *Producer_flush(Producer *self, PyObject *args) {
    double timeout = -1;
    if (!PyArg_ParseTuple(args, "|d", &timeout) || check_open(self) < 0)
        return NULL;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    flush_finely(self->rk, to_ms(timeout));
    Py_END_ALLOW_THREADS
    self->busy--;
    release_values(self);
    if (check_fatal(self) < 0)
        return NULL;
    return PyLong_FromLong(k_rd_kafka_outq_len(self->rk));
}

static Py_ssize_t Producer_len(Producer *self) {
    release_values(self);
    return self->rk == NULL ? 0 : k_rd_kafka_outq_len(self->rk);
}

static PyObject *Producer_held(Producer *self, PyObject *unused) {
    return PyLong_FromSsize_t(PyList_Size(self->values));
}

static PyObject *Producer_purge(Producer *self, PyObject *unused) {
    if (check_open(self) < 0)
        return NULL;
    self->pinned = 1;
    k_rd_kafka_purge(self->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT | RD_KAFKA_PURGE_F_NON_BLOCKING);
    Py_RETURN_NONE;
}

static PyObject *Producer_close(Producer *self, PyObject *unused) {
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "the producer is in use by another thread");
        return NULL;
    }
    close_rk(self);
    Py_RETURN_NONE;
}

/* The failure reports served since the last call: [(opaque, error code, partition, topic or None)]. */
static PyObject *Producer_take_failures(Producer *self, PyObject *unused) {
    /* Built under the lock and cleared only once built: a failure report lost here would let the next drain
     * count its record as acknowledged. */
    pthread_mutex_lock(&self->lock);
    PyObject *out = PyList_New((Py_ssize_t)self->count);
    for (size_t i = 0; out != NULL && i < self->count; i++) {
        Failure *f = &self->failures[i];
        PyObject *item = Py_BuildValue("(Kiiz)", (unsigned long long)f->opaque, f->err, f->partition, f->topic);
        if (item == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SetItem(out, (Py_ssize_t)i, item); /* steals item */
    }
    if (out != NULL) {
        free_failures(self->failures, self->count);
        self->failures = NULL;
        self->count = self->capacity = self->named = 0;
    }
    pthread_mutex_unlock(&self->lock);
    return out;
}

/* The log lines queued since the last call: [(syslog level, text)], then one saying how many were dropped. */
static PyObject *Producer_take_logs(Producer *self, PyObject *unused) {
    pthread_mutex_lock(&self->lock);
    PyObject *out = PyList_New(0);
    for (size_t i = 0; out != NULL && i <= self->logs_count; i++) {
        PyObject *text;
        if (i < self->logs_count)
            text = PyUnicode_DecodeUTF8(self->logs[i].text, (Py_ssize_t)strlen(self->logs[i].text), "replace");
        else if (self->logs_dropped)
            text = PyUnicode_FromFormat("LOG: %zu more lines than the %d kept between two polls were dropped",
                                        self->logs_dropped, LOG_LINES_KEPT);
        else
            break;
        PyObject *item = Py_BuildValue("(iN)", i < self->logs_count ? self->logs[i].level : 4, text);
        if (item == NULL || PyList_Append(out, item) < 0)
            Py_CLEAR(out);
        Py_XDECREF(item);
    }
    if (out != NULL) {
        free_logs(self->logs, self->logs_count);
        self->logs = NULL;
        self->logs_count = self->logs_dropped = 0;
    }
    pthread_mutex_unlock(&self->lock);
    return out;
}

#define TOPIC_MAX 256

/* One send()'s columns: their views, and the imports that keep their buffers alive meanwhile. */
typedef struct {
    BinCol value, key, topics;
    IntCol partitions, timestamps;
    ar_headers_t headers;
    int has_key, has_topics, has_partitions, has_timestamps, has_headers;
    ar_ref_t refs[6];
} Columns;

static void columns_release(Columns *c) {
    for (int r = 0; r < 6; r++)
        ar_clear(&c->refs[r]);
}

/* send(topic, slot, value, key, topics, partitions, timestamps, headers) -> (handed, error code, text)
 *
 * Hands every row of the value array to librdkafka in order, each with the opaque (slot << 32) | row. The
 * columns are Arrow arrays (anything with __arrow_c_array__) of the value's length, or None: binary or string
 * value, key and topic; int32 partition; int64 timestamp (milliseconds); list<struct<key, value>> headers.
 * When librdkafka's queue is full it serves reports and retries the same row, so nothing is dropped and order
 * is kept. Stops at the first row librdkafka refuses for another reason: `handed` rows went out, the refused
 * row and those after it did not (error code 0: all went out). */
static PyObject *Producer_send(Producer *self, PyObject *args) {
    PyObject *topic_obj, *value_a, *key_a, *topics_a, *partitions_a, *timestamps_a, *headers_a;
    unsigned long long slot;
    Columns c;
    memset(&c, 0, sizeof c);
    if (!PyArg_ParseTuple(args, "OKOOOOOO", &topic_obj, &slot, &value_a, &key_a, &topics_a, &partitions_a,
                          &timestamps_a, &headers_a) ||
        check_open(self) < 0)
        return NULL;
    if (slot > 0xffffffffULL)
        return PyErr_Format(PyExc_ValueError, "slot must fit in 32 bits");
    if (ar_import(value_a, "value", &c.refs[0]) < 0)
        goto fail;
    Py_ssize_t n = (Py_ssize_t)c.refs[0].array->length;
    if (n > 0xffffffffLL) {
        PyErr_SetString(PyExc_ValueError, "value: more rows than fit in 32 bits");
        goto fail;
    }
    if (ar_binary_rows(c.refs[0].schema, c.refs[0].array, n, 1, "value", &c.value) < 0)
        goto fail;
    if (key_a != Py_None) {
        if (ar_import(key_a, "key", &c.refs[1]) < 0 ||
            ar_binary_rows(c.refs[1].schema, c.refs[1].array, n, 1, "key", &c.key) < 0)
            goto fail;
        c.has_key = 1;
    }
    if (topics_a != Py_None) {
        if (ar_import(topics_a, "topic", &c.refs[2]) < 0 ||
            ar_binary_rows(c.refs[2].schema, c.refs[2].array, n, 1, "topic", &c.topics) < 0)
            goto fail;
        c.has_topics = 1;
    }
    if (partitions_a != Py_None) {
        if (ar_import(partitions_a, "partition", &c.refs[3]) < 0 ||
            ar_int(c.refs[3].schema, c.refs[3].array, n, 4, "partition", &c.partitions) < 0)
            goto fail;
        c.has_partitions = 1;
    }
    if (timestamps_a != Py_None) {
        if (ar_import(timestamps_a, "timestamp", &c.refs[4]) < 0 ||
            ar_int(c.refs[4].schema, c.refs[4].array, n, 8, "timestamp", &c.timestamps) < 0)
            goto fail;
        c.has_timestamps = 1;
    }
    if (headers_a != Py_None) {
        if (ar_import(headers_a, "headers", &c.refs[5]) < 0 ||
            ar_headers(c.refs[5].schema, c.refs[5].array, n, 1, "headers", &c.headers) < 0)
            goto fail;
        c.has_headers = 1;
    }
    /* The value's import holds its buffers: kept until librdkafka has let go of every record (release_values). */
    if (n > 0 && PyList_Append(self->values, c.refs[0].capsules) < 0)
        goto fail;
    rd_kafka_topic_t *rkt = NULL;
    if (!c.has_topics) {
        const char *name = PyUnicode_AsUTF8AndSize(topic_obj, NULL);
        if (name == NULL)
            goto fail;
        rkt = k_rd_kafka_topic_new(self->rk, name, NULL);
        if (rkt == NULL) {
            PyErr_Format(PyExc_ValueError, "cannot use topic %s", name);
            goto fail;
        }
    }

    Py_ssize_t i = 0;
    rd_kafka_resp_err_t stop = RD_KAFKA_RESP_ERR_NO_ERROR;
    char stop_text[512] = "";
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    char topic_name[TOPIC_MAX];
    for (; i < n; i++) {
        rd_kafka_vu_t vu[8];
        size_t cnt = 0;
        const char *ptr;
        size_t len;
        int64_t num;
        if (rkt != NULL) {
            vu[cnt].vtype = RD_KAFKA_VTYPE_RKT;
            vu[cnt++].u.rkt = rkt;
        } else {
            if (!bin_get(&c.topics, i, &ptr, &len) || len >= TOPIC_MAX) {
                stop = RD_KAFKA_RESP_ERR__INVALID_ARG;
                snprintf(stop_text, sizeof stop_text, "the topic is null or longer than %d bytes", TOPIC_MAX - 1);
                break;
            }
            memcpy(topic_name, ptr, len);
            topic_name[len] = 0;
            vu[cnt].vtype = RD_KAFKA_VTYPE_TOPIC;
            vu[cnt++].u.cstr = topic_name;
        }
        vu[cnt].vtype = RD_KAFKA_VTYPE_VALUE;
        if (bin_get(&c.value, i, &ptr, &len)) {
            vu[cnt].u.mem.ptr = (void *)ptr;
            vu[cnt++].u.mem.size = len;
        } else {
            vu[cnt].u.mem.ptr = NULL;
            vu[cnt++].u.mem.size = 0;
        }
        if (c.has_key && bin_get(&c.key, i, &ptr, &len)) {
            vu[cnt].vtype = RD_KAFKA_VTYPE_KEY;
            vu[cnt].u.mem.ptr = (void *)ptr;
            vu[cnt++].u.mem.size = len;
        }
        if (c.has_partitions && int_get(&c.partitions, i, &num)) {
            vu[cnt].vtype = RD_KAFKA_VTYPE_PARTITION;
            vu[cnt++].u.i32 = (int32_t)num;
        }
        if (c.has_timestamps && int_get(&c.timestamps, i, &num)) {
            vu[cnt].vtype = RD_KAFKA_VTYPE_TIMESTAMP;
            vu[cnt++].u.i64 = num;
        }
        rd_kafka_headers_t *hdrs = NULL;
        if (c.has_headers && is_valid(c.headers.valid, c.headers.offset + i)) {
            const int32_t *o = c.headers.offsets + c.headers.offset;
            if (o[i + 1] > o[i]) {
                hdrs = k_rd_kafka_headers_new((size_t)(o[i + 1] - o[i]));
                for (int32_t h = o[i]; h < o[i + 1]; h++) {
                    const char *name = EMPTY, *val = NULL;
                    size_t name_len = 0, val_len = 0;
                    bin_get(&c.headers.key, h, &name, &name_len); /* null keys were refused before the WAL */
                    if (!bin_get(&c.headers.value, h, &val, &val_len))
                        val = NULL;
                    k_rd_kafka_header_add(hdrs, name, (ssize_t)name_len, val, val ? (ssize_t)val_len : 0);
                }
                vu[cnt].vtype = RD_KAFKA_VTYPE_HEADERS;
                vu[cnt++].u.headers = hdrs;
            }
        }
        /* No RD_KAFKA_MSG_F_COPY: the value is read from the Arrow buffer (kept in self->values). A copy per
         * record cost a malloc and a memcpy of the value on this thread and its free on librdkafka's: one batch
         * of 10,000 records handed over took 6.0 -> 3.5 ms with 1 KB values, 25 -> 3.5 ms with 10 KB (the key and
         * the headers are still copied by librdkafka). */
        vu[cnt].vtype = RD_KAFKA_VTYPE_MSGFLAGS;
        vu[cnt++].u.i = 0;
        vu[cnt].vtype = RD_KAFKA_VTYPE_OPAQUE;
        vu[cnt++].u.ptr = (void *)(uintptr_t)((slot << 32) | (uint64_t)i);
        for (;;) {
            rd_kafka_error_t *error = k_rd_kafka_produceva(self->rk, vu, cnt);
            if (error == NULL)
                break; /* librdkafka owns the headers now */
            rd_kafka_resp_err_t code = k_rd_kafka_error_code(error);
            if (code == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
                k_rd_kafka_error_destroy(error);
                /* Room is made as acknowledgements come back, and these make no report to end the wait early
                 * (delivery.report.only.error): a short wait. At 50 ms a 32 MB queue (kafka.buffer.memory,
                 * the Java client's default) of 10 KB values cost 8% against the default queue, at 5 ms 4%. */
                k_rd_kafka_poll(self->rk, 5);
                continue;
            }
            stop = code;
            snprintf(stop_text, sizeof stop_text, "%s", k_rd_kafka_error_string(error));
            k_rd_kafka_error_destroy(error);
            if (hdrs != NULL)
                k_rd_kafka_headers_destroy(hdrs);
            break;
        }
        if (stop != RD_KAFKA_RESP_ERR_NO_ERROR)
            break;
    }
    if (rkt != NULL)
        k_rd_kafka_topic_destroy(rkt);
    Py_END_ALLOW_THREADS
    self->busy--;
    columns_release(&c);
    return Py_BuildValue("(nis)", i, (int)stop, stop_text);
fail:
    columns_release(&c);
    return NULL;
}

/* A metadata request for one topic (rkt) or none (NULL), without the GIL. */
static rd_kafka_resp_err_t fetch_metadata(Producer *self, rd_kafka_topic_t *rkt, double timeout,
                                          const struct rd_kafka_metadata **md) {
    rd_kafka_resp_err_t err;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    err = k_rd_kafka_metadata(self->rk, 0, rkt, md, to_ms(timeout));
    Py_END_ALLOW_THREADS
    self->busy--;
    return err;
}

/* connect(timeout) -> (error code, text): waits until a broker answers a metadata request (of no topic).
 * A transactional producer looks for its coordinator as soon as init_transactions() is called; with no broker
 * connected yet librdkafka retries only after 500 ms, so calling this first saves that wait. */
static PyObject *Producer_connect(Producer *self, PyObject *args) {
    double timeout;
    if (!PyArg_ParseTuple(args, "d", &timeout) || check_open(self) < 0)
        return NULL;
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t err = fetch_metadata(self, NULL, timeout, &md);
    if (md != NULL)
        k_rd_kafka_metadata_destroy(md);
    return Py_BuildValue("(is)", (int)err, err == RD_KAFKA_RESP_ERR_NO_ERROR ? "" : k_rd_kafka_err2str(err));
}

/* partition_count(topic, timeout) -> (count, error code, text): count -1 when the topic has an error. */
static PyObject *Producer_partition_count(Producer *self, PyObject *args) {
    const char *topic;
    double timeout;
    if (!PyArg_ParseTuple(args, "sd", &topic, &timeout) || check_open(self) < 0)
        return NULL;
    rd_kafka_topic_t *rkt = k_rd_kafka_topic_new(self->rk, topic, NULL);
    if (rkt == NULL)
        return Py_BuildValue("(iis)", -1, RD_KAFKA_RESP_ERR__INVALID_ARG, "invalid topic name");
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t err = fetch_metadata(self, rkt, timeout, &md);
    k_rd_kafka_topic_destroy(rkt);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
        return raise_kafka(err, k_rd_kafka_err2str(err), 0, 1, 0);
    PyObject *out;
    if (md->topic_cnt < 1)
        out = Py_BuildValue("(iis)", -1, RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC, "no metadata");
    else if (md->topics[0].err != RD_KAFKA_RESP_ERR_NO_ERROR)
        out = Py_BuildValue("(iis)", -1, md->topics[0].err, k_rd_kafka_err2str(md->topics[0].err));
    else
        out = Py_BuildValue("(iis)", md->topics[0].partition_cnt, 0, "");
    k_rd_kafka_metadata_destroy(md);
    return out;
}

/* ---- transactions (exactly_once) ---------------------------------------------------------------------------- */

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
    static PyObject *Producer_##method(Producer *self, PyObject *args) {                                    \
        double timeout;                                                                                      \
        if (!PyArg_ParseTuple(args, "d", &timeout) || check_open(self) < 0)                                  \
            return NULL;                                                                                     \
        TXN_CALL(call(self->rk, to_ms(timeout)));                                                            \
        Py_RETURN_NONE;                                                                                      \
    }
TXN_TIMED(init_transactions, k_rd_kafka_init_transactions)
TXN_TIMED(commit_transaction, k_rd_kafka_commit_transaction)
TXN_TIMED(abort_transaction, k_rd_kafka_abort_transaction)

static PyObject *Producer_begin_transaction(Producer *self, PyObject *unused) {
    if (check_open(self) < 0)
        return NULL;
    TXN_CALL(k_rd_kafka_begin_transaction(self->rk));
    Py_RETURN_NONE;
}

/* send_offset(group, topic, partition, offset, metadata, timeout): one consumer-group offset into the open
 * transaction (the commit marker); the group's metadata needs no consumer. */
static PyObject *Producer_send_offset(Producer *self, PyObject *args) {
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

static PyMethodDef Producer_methods[] = {
    {"send", (PyCFunction)Producer_send, METH_VARARGS, "Hand Arrow columns' rows to librdkafka, in order."},
    {"poll", (PyCFunction)Producer_poll, METH_VARARGS, "Serve reports, waiting up to timeout seconds."},
    {"flush", (PyCFunction)Producer_flush, METH_VARARGS, "Wait up to timeout for the queue to empty; returns what is left."},
    {"purge", (PyCFunction)Producer_purge, METH_NOARGS, "Drop queued and in-flight records (reported failed)."},
    {"close", (PyCFunction)Producer_close, METH_NOARGS, "Destroy the librdkafka handle."},
    {"held", (PyCFunction)Producer_held, METH_NOARGS, "How many sends' value columns librdkafka may still read."},
    {"take_failures", (PyCFunction)Producer_take_failures, METH_NOARGS, "Failure reports since the last call."},
    {"take_logs", (PyCFunction)Producer_take_logs, METH_NOARGS, "librdkafka's log lines since the last call."},
    {"partition_count", (PyCFunction)Producer_partition_count, METH_VARARGS, "A topic's partition count."},
    {"connect", (PyCFunction)Producer_connect, METH_VARARGS, "Wait until a broker answers; (error code, text)."},
    {"init_transactions", (PyCFunction)Producer_init_transactions, METH_VARARGS, NULL},
    {"begin_transaction", (PyCFunction)Producer_begin_transaction, METH_NOARGS, NULL},
    {"commit_transaction", (PyCFunction)Producer_commit_transaction, METH_VARARGS, NULL},
    {"abort_transaction", (PyCFunction)Producer_abort_transaction, METH_VARARGS, NULL},
    {"send_offset", (PyCFunction)Producer_send_offset, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Producer_slots[] = {
    {Py_tp_doc, "A librdkafka producer fed from Arrow arrays; only failures are reported."},
    {Py_tp_new, Producer_new},
    {Py_tp_init, Producer_init},
    {Py_tp_dealloc, Producer_dealloc},
    {Py_tp_methods, Producer_methods},
    {Py_sq_length, Producer_len},
    {0, NULL},
};

static PyType_Spec Producer_spec = {
    .name = "recoverable_sink._produce.Producer",
    .basicsize = sizeof(Producer),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .slots = Producer_slots,
};

/* ---- the module ------------------------------------------------------------------------------------------- */

/* load(path) -> librdkafka's version: open the library and look up every function used here. */
static PyObject *load(PyObject *module, PyObject *args) {
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path))
        return NULL;
    if (loaded)
        return PyUnicode_FromString(k_rd_kafka_version_str());
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL)
        return PyErr_Format(PyExc_OSError, "cannot open %s: %s", path, dlerror());
#define LOOKUP(name)                                                                                         \
    k_##name = (__typeof__(name) *)dlsym(lib, #name);                                                        \
    if (k_##name == NULL) {                                                                                  \
        dlclose(lib);                                                                                        \
        return PyErr_Format(PyExc_OSError, "%s has no %s", path, #name);                                     \
    }
    RK_FUNCS(LOOKUP)
    if (k_rd_kafka_version() < RK_MIN_VERSION) {
        PyErr_Format(PyExc_OSError, "%s is librdkafka %s; the native producer needs 1.4.0 or later", path,
                     k_rd_kafka_version_str());
        dlclose(lib);
        return NULL;
    }
    loaded = 1; /* the library stays open for the life of the process */
    return PyUnicode_FromString(k_rd_kafka_version_str());
}

static PyMethodDef module_methods[] = {
    {"load", load, METH_VARARGS, "Open librdkafka at path; returns its version."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, .m_name = "_produce", .m_size = -1,
                                        .m_methods = module_methods};

PyMODINIT_FUNC PyInit__produce(void) {
    PyObject *kafka = PyImport_ImportModule("confluent_kafka");
    if (kafka == NULL)
        return NULL;
    KafkaErrorType = PyObject_GetAttrString(kafka, "KafkaError");
    KafkaExceptionType = PyObject_GetAttrString(kafka, "KafkaException");
    Py_DECREF(kafka);
    if (KafkaErrorType == NULL || KafkaExceptionType == NULL)
        return NULL;
    if (ProducerType == NULL && (ProducerType = PyType_FromSpec(&Producer_spec)) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Producer", ProducerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
