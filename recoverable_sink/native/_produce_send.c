/* Records into librdkafka: send() reads a batch's Arrow columns (through _arrow_reader.h) and hands each row to
 * produceva without the GIL, in order; connect() and partition_count() are its metadata requests.
 */
#include "_produce.h"
#include <stdio.h>
#include <string.h>
#include "_arrow_reader.h"

/* ---- Arrow columns ---------------------------------------------------------------------------------------- */

typedef ar_binary_t BinCol; /* a binary or string column (_arrow_reader.h) */
typedef ar_int_t IntCol;    /* an int32 or int64 column */

static const char EMPTY[1] = {0};

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

/* ---- send ------------------------------------------------------------------------------------------------ */

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
PyObject *Producer_send(Producer *self, PyObject *args) {
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

/* ---- metadata -------------------------------------------------------------------------------------------- */

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
PyObject *Producer_connect(Producer *self, PyObject *args) {
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
PyObject *Producer_partition_count(Producer *self, PyObject *args) {
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
