/* The Producer's handle and what librdkafka hands back outside a call: the handle's life (new, init, close,
 * dealloc), poll and flush, the value columns kept while librdkafka may read them, and the failure reports and
 * log lines its callbacks queue from any of its threads until take_failures() and take_logs() collect them.
 */
#include "_produce.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- failure reports and log lines, from librdkafka's threads ------------------------------------------------ */

/* An array with room for one more item: `items` itself while count < *capacity, else grown to twice *capacity
 * (`initial` the first time), or NULL out of memory (the array and *capacity left as they were). */
static void *room_for_one(void *items, size_t count, size_t *capacity, size_t item_size, size_t initial) {
    if (count < *capacity)
        return items;
    size_t grown_capacity = *capacity ? *capacity * 2 : initial;
    void *grown = realloc(items, grown_capacity * item_size);
    if (grown != NULL)
        *capacity = grown_capacity;
    return grown;
}

/* The entry of msg's topic-partition, or NULL. An entry's topic is held (Topic), so an address compared equal is
 * that topic's: a report costs no string comparison (strcmp was a fifth of the task thread's libc time with 100 B
 * records). The last entry used is tried first, as a produce response reports one partition's records together;
 * names are compared only where the report's topic is not an entry's (a handle librdkafka made apart, before 1.5).
 * Called with the lock held. */
static Written *written_entry(Producer *self, const rd_kafka_message_t *msg, const char *topic) {
    if (msg->rkt != NULL && self->written_last < self->written_count) {
        Written *last = &self->written[self->written_last];
        if (last->rkt == msg->rkt && last->partition == msg->partition)
            return last;
    }
    for (size_t i = 0; msg->rkt != NULL && i < self->written_count; i++) {
        if (self->written[i].rkt == msg->rkt && self->written[i].partition == msg->partition) {
            self->written_last = i;
            return &self->written[i];
        }
    }
    for (size_t i = 0; topic != NULL && i < self->written_count; i++) {
        if (self->written[i].partition == msg->partition && strcmp(self->written[i].topic, topic) == 0) {
            self->written_last = i;
            return &self->written[i];
        }
    }
    return NULL;
}

/* The held Topic named `topic`, or NULL. Called with the lock held. */
static Topic *held_topic(Producer *self, const char *topic) {
    for (size_t i = 0; i < self->topics_count; i++)
        if (strcmp(self->topics[i].name, topic) == 0)
            return &self->topics[i];
    return NULL;
}

/* Holds `topic` (a reference taken outside the lock: rd_kafka_topic_new takes librdkafka's own lock, under which its
 * threads may log, and on_log takes ours); 0, or -1 out of memory. */
static int hold_topic(Producer *self, const rd_kafka_message_t *msg, const char *topic) {
    pthread_mutex_lock(&self->lock);
    int held = held_topic(self, topic) != NULL;
    pthread_mutex_unlock(&self->lock);
    if (held)
        return 0;
    char *name = strdup(topic);
    /* The same object as msg->rkt since librdkafka 1.5 (one object per topic name); released at close. */
    rd_kafka_topic_t *rkt = name != NULL && msg->rkt != NULL ? k_rd_kafka_topic_new(self->rk, name, NULL) : NULL;
    int added = 0;
    pthread_mutex_lock(&self->lock);
    if (name != NULL && held_topic(self, topic) == NULL) { /* not held meanwhile by another thread's report */
        Topic *topics = room_for_one(self->topics, self->topics_count, &self->topics_capacity, sizeof(Topic), 4);
        if (topics != NULL) {
            self->topics = topics;
            self->topics[self->topics_count++] = (Topic){.name = name, .rkt = rkt};
            added = 1;
        }
    }
    held = added || held_topic(self, topic) != NULL;
    pthread_mutex_unlock(&self->lock);
    if (!added) {
        free(name);
        if (rkt != NULL)
            k_rd_kafka_topic_destroy(rkt);
    }
    return held ? 0 : -1;
}

static void count_written(Written *w, int64_t offset) {
    if (offset < w->first)
        w->first = offset;
    if (offset > w->last)
        w->last = offset;
    w->count++;
}

/* An acknowledged record's offset, into its topic-partition's entry; the first report of a topic holds it. */
static void note_written(Producer *self, const rd_kafka_message_t *msg) {
    pthread_mutex_lock(&self->lock);
    if (msg->offset < 0) { /* acknowledged without an offset (RD_KAFKA_OFFSET_INVALID): the figures are partial */
        self->written_lost = 1;
        pthread_mutex_unlock(&self->lock);
        return;
    }
    Written *w = written_entry(self, msg, NULL);
    if (w != NULL) {
        count_written(w, msg->offset);
        pthread_mutex_unlock(&self->lock);
        return;
    }
    pthread_mutex_unlock(&self->lock);
    const char *topic = msg->rkt != NULL ? k_rd_kafka_topic_name(msg->rkt) : "";
    int held = hold_topic(self, msg, topic);
    pthread_mutex_lock(&self->lock);
    w = written_entry(self, msg, topic);
    Topic *t = held == 0 ? held_topic(self, topic) : NULL;
    Written *written = NULL;
    if (w == NULL && t != NULL)
        written = room_for_one(self->written, self->written_count, &self->written_capacity, sizeof(Written), 8);
    if (written != NULL) {
        self->written = written;
        w = &self->written[self->written_count];
        self->written_last = self->written_count++;
        *w = (Written){.topic = t->name, .rkt = t->rkt, .partition = msg->partition, .first = msg->offset,
                       .last = msg->offset, .count = 0};
    }
    if (w != NULL)
        count_written(w, msg->offset);
    else
        self->written_lost = 1; /* out of memory */
    pthread_mutex_unlock(&self->lock);
}

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque) {
    (void)rk;
    Producer *self = opaque;
    if (msg->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        /* Reported only with offsets=True; an acknowledgement itself is learnt at a drain either way. */
        if (self->track_written)
            note_written(self, msg);
        return;
    }
    pthread_mutex_lock(&self->lock);
    Failure *failures = room_for_one(self->failures, self->count, &self->capacity, sizeof(Failure), 64);
    if (failures == NULL) {
        /* Counted as failed nowhere: the drain would count it acknowledged. Stop instead of lying. */
        fprintf(stderr, "recoverable_sink._produce: out of memory recording a failed delivery\n");
        abort();
    }
    self->failures = failures;
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

/* ---- the handle ------------------------------------------------------------------------------------------- */

static int check_loaded(void) {
    if (!loaded) {
        PyErr_SetString(PyExc_RuntimeError, "librdkafka is not loaded: call _produce.load() first");
        return -1;
    }
    return 0;
}

int Producer_init(Producer *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"config", "offsets", NULL};
    PyObject *config, *key, *value;
    Py_ssize_t pos = 0;
    int offsets = 0;
    char errstr[512];
    if (check_loaded() < 0 ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "O!|p", keywords, &PyDict_Type, &config, &offsets))
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
    /* Failure reports only, unless the written offsets are wanted: then every record is reported, and the C
     * callback folds an acknowledged one into its topic-partition's first and last offset and count. */
    self->track_written = offsets;
    if (k_rd_kafka_conf_set(conf, "delivery.report.only.error", offsets ? "false" : "true", errstr,
                            sizeof errstr) != RD_KAFKA_CONF_OK) {
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

PyObject *Producer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
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

/* The held topics, released while the handle lives (no topic outlives its rd_kafka_t) and outside our lock (see
 * hold_topic); the written entries, which borrow their names, go with them: what is not taken is lost. */
static void release_topics(Producer *self) {
    pthread_mutex_lock(&self->lock);
    Topic *topics = self->topics;
    size_t count = self->topics_count;
    self->topics = NULL;
    self->topics_count = self->topics_capacity = 0;
    free(self->written);
    self->written = NULL;
    self->written_count = self->written_capacity = self->written_last = 0;
    self->written_lost = 0;
    pthread_mutex_unlock(&self->lock);
    for (size_t i = 0; i < count; i++) {
        if (topics[i].rkt != NULL)
            k_rd_kafka_topic_destroy(topics[i].rkt);
        free(topics[i].name);
    }
    free(topics);
}

static void free_logs(LogLine *logs, size_t count) {
    for (size_t i = 0; i < count; i++)
        free(logs[i].text);
    free(logs);
}

static void close_rk(Producer *self) {
    rd_kafka_t *rk = self->rk;
    if (rk != NULL)
        release_topics(self);
    self->rk = NULL;
    if (rk != NULL) {
        Py_BEGIN_ALLOW_THREADS
        k_rd_kafka_destroy(rk);
        Py_END_ALLOW_THREADS
    }
    drop_values(self); /* librdkafka's threads are gone */
    self->pinned = 0;
}

void Producer_dealloc(Producer *self) {
    PyTypeObject *type = Py_TYPE(self);
    close_rk(self);
    Py_CLEAR(self->values);
    free_failures(self->failures, self->count);
    free_logs(self->logs, self->logs_count);
    free(self->written); /* empty: release_topics emptied it, if the handle was ever made */
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

PyObject *Producer_poll(Producer *self, PyObject *args) {
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
 * end, and with them on the last reports come in one batch. Flushing 1 ms at a time notices it within a
 * millisecond, and each call keeps linger.ms waived meanwhile. */
static int flush_finely(rd_kafka_t *rk, int timeout_ms) {
    int64_t deadline = timeout_ms < 0 ? INT64_MAX : monotonic_ms() + timeout_ms;
    for (;;) {
        int64_t left = deadline - monotonic_ms();
        k_rd_kafka_flush(rk, left <= 0 ? 0 : 1);
        int queued = k_rd_kafka_outq_len(rk);
        if (queued == 0 || left <= 1)
            return queued;
    }
}

PyObject *Producer_flush(Producer *self, PyObject *args) {
    double timeout = -1;
    if (!PyArg_ParseTuple(args, "|d", &timeout) || check_open(self) < 0)
        return NULL;
    int queued;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    queued = flush_finely(self->rk, to_ms(timeout));
    Py_END_ALLOW_THREADS
    self->busy--;
    release_values(self);
    if (check_fatal(self) < 0)
        return NULL;
    /* The count the flush ended on (0: every report served). Read again, it would also count a connection error
     * queued since (no broker answering), and a drain whose every report was served would not count as one. */
    return PyLong_FromLong(queued);
}

Py_ssize_t Producer_len(Producer *self) {
    release_values(self);
    return self->rk == NULL ? 0 : k_rd_kafka_outq_len(self->rk);
}

PyObject *Producer_purge(Producer *self, PyObject *unused) {
    if (check_open(self) < 0)
        return NULL;
    self->pinned = 1;
    k_rd_kafka_purge(self->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT | RD_KAFKA_PURGE_F_NON_BLOCKING);
    Py_RETURN_NONE;
}

PyObject *Producer_close(Producer *self, PyObject *unused) {
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "the producer is in use by another thread");
        return NULL;
    }
    close_rk(self);
    Py_RETURN_NONE;
}

/* The failure reports served since the last call: [(opaque, error code, partition, topic or None)]. */
PyObject *Producer_take_failures(Producer *self, PyObject *unused) {
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
PyObject *Producer_take_logs(Producer *self, PyObject *unused) {
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

/* What was acknowledged since the last call, per topic-partition, and whether that is all of it:
 * ([(topic, partition, first offset, last offset, records)], complete). Empty unless made with offsets=True; what
 * is not taken before close() is lost with the handle. */
PyObject *Producer_take_written(Producer *self, PyObject *unused) {
    pthread_mutex_lock(&self->lock);
    PyObject *entries = PyList_New((Py_ssize_t)self->written_count);
    for (size_t i = 0; entries != NULL && i < self->written_count; i++) {
        Written *w = &self->written[i];
        PyObject *item = Py_BuildValue("(siLLL)", w->topic, w->partition, (long long)w->first, (long long)w->last,
                                       (long long)w->count);
        if (item == NULL) {
            Py_CLEAR(entries);
            break;
        }
        PyList_SetItem(entries, (Py_ssize_t)i, item); /* steals item */
    }
    PyObject *out = entries == NULL ? NULL : Py_BuildValue("(NO)", entries, self->written_lost ? Py_False : Py_True);
    if (out != NULL) { /* the entries go, the array and the held topics stay for the next reports */
        self->written_count = self->written_last = 0;
        self->written_lost = 0;
    }
    pthread_mutex_unlock(&self->lock);
    return out;
}
