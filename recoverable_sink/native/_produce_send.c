/* Records into librdkafka: send() reads a batch's Arrow columns (through _arrow_reader.h) and hands each row to
 * produceva without the GIL, in order; connect() and partition_count() are its metadata requests.
 */
#include "_produce.h"
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "_arrow_reader.h"

/* ---- send's columns -------------------------------------------------------------------------------------- */

enum { COL_VALUE, COL_KEY, COL_TOPIC, COL_PARTITION, COL_TIMESTAMP, COL_HEADERS, COLS };
static const char *const COL_NAMES[COLS] = {"value", "key", "topic", "partition", "timestamp", "headers"};

/* One send()'s columns: their views (_arrow_reader.h), and the imports that keep their buffers alive meanwhile. */
typedef struct {
    Py_ssize_t rows; /* the value's, which every other column has */
    ar_binary_t value, key, topics;
    ar_int_t partitions, timestamps;
    ar_headers_t headers;
    int has[COLS]; /* whether the column was given (the value always is) */
    ar_ref_t refs[COLS];
} Columns;

static void columns_release(Columns *c) {
    for (int col = 0; col < COLS; col++)
        ar_clear(&c->refs[col]);
}

/* The typed view of imported column `col`, checked to have c->rows rows. */
static int column_view(Columns *c, int col) {
    const struct ArrowSchema *s = c->refs[col].schema;
    const struct ArrowArray *a = c->refs[col].array;
    const char *what = COL_NAMES[col];
    switch (col) {
    case COL_VALUE:
        return ar_binary_rows(s, a, c->rows, 1, what, &c->value);
    case COL_KEY:
        return ar_binary_rows(s, a, c->rows, 1, what, &c->key);
    case COL_TOPIC:
        return ar_binary_rows(s, a, c->rows, 1, what, &c->topics);
    case COL_PARTITION:
        return ar_int(s, a, c->rows, 4, what, &c->partitions);
    case COL_TIMESTAMP:
        return ar_int(s, a, c->rows, 8, what, &c->timestamps);
    default:
        return ar_headers(s, a, c->rows, 1, what, &c->headers);
    }
}

/* send()'s Arrow arguments, in COL_ order (None: a column not given), as views of the value's rows; 0, or -1 with a
 * Python error set (the caller releases c either way). */
static int columns_parse(Columns *c, PyObject *const arrays[COLS]) {
    if (ar_import(arrays[COL_VALUE], COL_NAMES[COL_VALUE], &c->refs[COL_VALUE]) < 0)
        return -1;
    c->rows = (Py_ssize_t)c->refs[COL_VALUE].array->length;
    if (c->rows > 0xffffffffLL) { /* a row is the low half of its record's opaque */
        PyErr_SetString(PyExc_ValueError, "value: more rows than fit in 32 bits");
        return -1;
    }
    for (int col = 0; col < COLS; col++) {
        if (col != COL_VALUE && arrays[col] == Py_None)
            continue;
        if (col != COL_VALUE && ar_import(arrays[col], COL_NAMES[col], &c->refs[col]) < 0)
            return -1;
        if (column_view(c, col) < 0)
            return -1;
        c->has[col] = 1;
    }
    return 0;
}

/* The batch's one topic (no topic column) as a handle, made once per send(); NULL with a Python error set. */
static rd_kafka_topic_t *topic_handle(Producer *self, PyObject *topic_obj) {
    const char *name = PyUnicode_AsUTF8AndSize(topic_obj, NULL);
    if (name == NULL)
        return NULL;
    rd_kafka_topic_t *rkt = k_rd_kafka_topic_new(self->rk, name, NULL);
    if (rkt == NULL)
        PyErr_Format(PyExc_ValueError, "cannot use topic %s", name);
    return rkt;
}

/* ---- one row as one message ----------------------------------------------------------------------------------- */

#define TOPIC_MAX 256
#define VU_MAX 8 /* topic, value, key, partition, timestamp, headers, flags, opaque */

/* One row as produceva's arguments. */
typedef struct {
    rd_kafka_vu_t vu[VU_MAX];
    rd_kafka_headers_t *headers; /* NULL for none; ours to destroy until librdkafka accepts the message */
    char topic[TOPIC_MAX];       /* the row's topic from a topic column, NUL-terminated for produceva */
} Message;

/* Row i's headers as librdkafka's, which copies their keys and values; NULL where the row has none. */
static rd_kafka_headers_t *row_headers(const ar_headers_t *h, Py_ssize_t i) {
    int64_t first, end;
    if (!ar_header_items(h, i, &first, &end) || end <= first)
        return NULL;
    rd_kafka_headers_t *hdrs = k_rd_kafka_headers_new((size_t)(end - first));
    for (int64_t j = first; j < end; j++) {
        const uint8_t *name = AR_EMPTY, *val = NULL;
        size_t name_len = 0, val_len = 0;
        ar_value(&h->key, h->key.wide, j, &name, &name_len); /* null keys were refused before the WAL */
        ar_value(&h->value, h->value.wide, j, &val, &val_len); /* a null value stays NULL */
        k_rd_kafka_header_add(hdrs, (const char *)name, (ssize_t)name_len, val, val ? (ssize_t)val_len : 0);
    }
    return hdrs;
}

/* Row i of the columns as produceva's arguments in m, with the opaque (slot << 32) | i; rkt is the batch's topic,
 * or NULL to read the row's from the topic column. Returns how many arguments, or 0 where the row's topic is null
 * or too long. */
static size_t message_from_row(Message *m, const Columns *c, Py_ssize_t i, rd_kafka_topic_t *rkt, uint64_t slot) {
    rd_kafka_vu_t *vu = m->vu;
    size_t cnt = 0;
    const uint8_t *ptr;
    size_t len;
    int64_t num;
    if (rkt != NULL) {
        vu[cnt].vtype = RD_KAFKA_VTYPE_RKT;
        vu[cnt++].u.rkt = rkt;
    } else {
        if (!ar_value(&c->topics, c->topics.wide, i, &ptr, &len) || len >= TOPIC_MAX)
            return 0;
        memcpy(m->topic, ptr, len);
        m->topic[len] = 0;
        vu[cnt].vtype = RD_KAFKA_VTYPE_TOPIC;
        vu[cnt++].u.cstr = m->topic;
    }
    if (!ar_value(&c->value, c->value.wide, i, &ptr, &len)) {
        ptr = NULL; /* a null value, which librdkafka tells from an empty one by its NULL pointer */
        len = 0;
    }
    vu[cnt].vtype = RD_KAFKA_VTYPE_VALUE;
    vu[cnt].u.mem.ptr = (void *)ptr;
    vu[cnt++].u.mem.size = len;
    if (c->has[COL_KEY] && ar_value(&c->key, c->key.wide, i, &ptr, &len)) {
        vu[cnt].vtype = RD_KAFKA_VTYPE_KEY;
        vu[cnt].u.mem.ptr = (void *)ptr;
        vu[cnt++].u.mem.size = len;
    }
    if (c->has[COL_PARTITION] && ar_int_value(&c->partitions, i, &num)) {
        vu[cnt].vtype = RD_KAFKA_VTYPE_PARTITION;
        vu[cnt++].u.i32 = (int32_t)num;
    }
    if (c->has[COL_TIMESTAMP] && ar_int_value(&c->timestamps, i, &num)) {
        vu[cnt].vtype = RD_KAFKA_VTYPE_TIMESTAMP;
        vu[cnt++].u.i64 = num;
    }
    m->headers = c->has[COL_HEADERS] ? row_headers(&c->headers, i) : NULL;
    if (m->headers != NULL) {
        vu[cnt].vtype = RD_KAFKA_VTYPE_HEADERS;
        vu[cnt++].u.headers = m->headers;
    }
    /* No RD_KAFKA_MSG_F_COPY: the value is read from the Arrow buffer (kept in self->values), saving a malloc and
     * a memcpy per record on this thread and a free on librdkafka's (docs/performance.md, "Values read in place");
     * librdkafka still copies the key and the headers. */
    vu[cnt].vtype = RD_KAFKA_VTYPE_MSGFLAGS;
    vu[cnt++].u.i = 0;
    vu[cnt].vtype = RD_KAFKA_VTYPE_OPAQUE;
    vu[cnt++].u.ptr = (void *)(uintptr_t)((slot << 32) | (uint64_t)i);
    return cnt;
}

/* ---- the loop -------------------------------------------------------------------------------------------------- */

/* How a send() ended: the rows handed over, and why the next one was not (code 0: every row went out). */
typedef struct {
    Py_ssize_t handed;
    rd_kafka_resp_err_t code;
    char text[512];
} Outcome;

__attribute__((format(printf, 3, 4))) static void refuse(Outcome *o, rd_kafka_resp_err_t code, const char *fmt,
                                                          ...) {
    va_list ap;
    va_start(ap, fmt);
    o->code = code;
    vsnprintf(o->text, sizeof o->text, fmt, ap);
    va_end(ap);
}

/* Hands m (cnt arguments) to librdkafka, waiting while its queue is full so that no row is dropped or reordered;
 * 0, or -1 with the refusal in o (m's headers destroyed). */
static int produce_waiting(Producer *self, Message *m, size_t cnt, Outcome *o) {
    for (;;) {
        rd_kafka_error_t *error = k_rd_kafka_produceva(self->rk, m->vu, cnt);
        if (error == NULL)
            return 0; /* librdkafka owns the headers now */
        rd_kafka_resp_err_t code = k_rd_kafka_error_code(error);
        if (code != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
            refuse(o, code, "%s", k_rd_kafka_error_string(error));
            k_rd_kafka_error_destroy(error);
            if (m->headers != NULL)
                k_rd_kafka_headers_destroy(m->headers);
            return -1;
        }
        k_rd_kafka_error_destroy(error);
        /* Room is made as acknowledgements come back, and a poll ends early only once a report is served: a
         * short wait (docs/performance.md, "Native produce loop"). */
        k_rd_kafka_poll(self->rk, 5);
    }
}

/* Every row in order, without the GIL, until one is refused (o says which and why); rkt, the batch's topic handle
 * or NULL, is destroyed there too. */
static void send_rows(Producer *self, const Columns *c, rd_kafka_topic_t *rkt, uint64_t slot, Outcome *o) {
    Py_ssize_t i = 0;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    Message m;
    for (; i < c->rows; i++) {
        size_t cnt = message_from_row(&m, c, i, rkt, slot);
        if (cnt == 0) {
            refuse(o, RD_KAFKA_RESP_ERR__INVALID_ARG, "the topic is null or longer than %d bytes", TOPIC_MAX - 1);
            break;
        }
        if (produce_waiting(self, &m, cnt, o) < 0)
            break;
    }
    if (rkt != NULL)
        k_rd_kafka_topic_destroy(rkt);
    Py_END_ALLOW_THREADS
    self->busy--;
    o->handed = i;
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
    PyObject *topic_obj, *arrays[COLS];
    unsigned long long slot;
    if (!PyArg_ParseTuple(args, "OKOOOOOO", &topic_obj, &slot, &arrays[COL_VALUE], &arrays[COL_KEY],
                          &arrays[COL_TOPIC], &arrays[COL_PARTITION], &arrays[COL_TIMESTAMP], &arrays[COL_HEADERS]) ||
        check_open(self) < 0)
        return NULL;
    if (slot > 0xffffffffULL)
        return PyErr_Format(PyExc_ValueError, "slot must fit in 32 bits");
    Columns c;
    memset(&c, 0, sizeof c);
    rd_kafka_topic_t *rkt = NULL;
    Outcome o = {0, RD_KAFKA_RESP_ERR_NO_ERROR, ""};
    PyObject *result = NULL;
    if (columns_parse(&c, arrays) < 0)
        goto done;
    /* The value's import holds its buffers: kept until librdkafka has let go of every record (release_values). */
    if (c.rows > 0 && PyList_Append(self->values, c.refs[COL_VALUE].capsules) < 0)
        goto done;
    if (!c.has[COL_TOPIC] && (rkt = topic_handle(self, topic_obj)) == NULL)
        goto done;
    send_rows(self, &c, rkt, slot, &o);
    result = Py_BuildValue("(nis)", o.handed, (int)o.code, o.text);
done:
    columns_release(&c);
    return result;
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
