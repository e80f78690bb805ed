/* The _produce module: load() opens librdkafka and checks its version, the Producer type is put together from
 * the methods of the other files (_produce.h), and librdkafka's errors become confluent-kafka's exceptions.
 *
 * The sink's producer loop in C: Arrow buffers straight into librdkafka, no per-record Python object.
 *
 * Why: with confluent-kafka each record costs a produce() call (argument parsing, a bytes object per key and
 * value, a small state per record for its delivery report) and poll() takes the GIL once per acknowledged
 * record. Here a batch is handed over in one call that holds no GIL, and a C callback collects failure reports
 * with the record's position (the message opaque): what succeeded is learnt at drains, as in the Python path.
 * Success reports (offsets=True) are folded in C into each topic-partition's first and last offset and count,
 * for the write's summary; without it librdkafka keeps failure reports only (delivery.report.only.error).
 *
 * librdkafka is not linked: load() opens the library confluent-kafka ships (the same build its producer
 * uses) or the system's, checks its version and looks up the functions of RK_FUNCS. They are declared in
 * _rdkafka_api.h, so building needs only a C compiler and Python's headers. The columns come through the Arrow
 * C Data Interface (_arrow_reader.h), and only the limited API of Python 3.10 is used (the stable ABI).
 *
 * librdkafka's log lines are kept, not written to stderr: its threads cannot call Python, so the lines wait
 * in a bounded queue until take_logs() hands them to the sink's logger (native_producer.NativeProducer, at every poll).
 */
#include "_produce.h"
#include <dlfcn.h>
#include <string.h>

#define RK_DEFINE(name) __typeof__(name) *k_##name;
RK_FUNCS(RK_DEFINE)

int loaded = 0;
PyObject *KafkaErrorType = NULL, *KafkaExceptionType = NULL;
static PyObject *ProducerType = NULL;

/* ---- errors -------------------------------------------------------------------------------------------- */

/* Raise confluent-kafka's KafkaException(KafkaError(...)), so callers classify errors one way for both paths. */
PyObject *raise_kafka(int code, const char *text, int fatal, int retriable, int txn_requires_abort) {
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

PyObject *raise_error(rd_kafka_error_t *error) {
    raise_kafka(k_rd_kafka_error_code(error), k_rd_kafka_error_string(error), k_rd_kafka_error_is_fatal(error),
                k_rd_kafka_error_is_retriable(error), k_rd_kafka_error_txn_requires_abort(error));
    k_rd_kafka_error_destroy(error);
    return NULL;
}

/* ---- the type ---------------------------------------------------------------------------------------------- */

/* Each doc opens with its signature in CPython's __text_signature__ form ("name($self, ...)\n--\n\n"), the
 * parameters its PyArg_ParseTuple format takes: inspect.signature() and help() read it, and
 * tests/unit/native/test_stubs.py checks it against both that format and the stub (_produce.pyi). */
static PyMethodDef Producer_methods[] = {
    {"send", (PyCFunction)Producer_send, METH_VARARGS,
     "send($self, topic, slot, value, key, topics, partitions, timestamps, headers, /)\n--\n\n"
     "Hand Arrow columns' rows to librdkafka, in order."},
    {"poll", (PyCFunction)Producer_poll, METH_VARARGS,
     "poll($self, timeout=0, /)\n--\n\nServe reports, waiting up to timeout seconds."},
    {"flush", (PyCFunction)Producer_flush, METH_VARARGS,
     "flush($self, timeout=-1, /)\n--\n\nWait up to timeout for the queue to empty; returns what is left."},
    {"purge", (PyCFunction)Producer_purge, METH_NOARGS,
     "purge($self, /)\n--\n\nDrop queued and in-flight records (reported failed)."},
    {"close", (PyCFunction)Producer_close, METH_NOARGS, "close($self, /)\n--\n\nDestroy the librdkafka handle."},
    {"take_failures", (PyCFunction)Producer_take_failures, METH_NOARGS,
     "take_failures($self, /)\n--\n\nFailure reports since the last call."},
    {"take_logs", (PyCFunction)Producer_take_logs, METH_NOARGS,
     "take_logs($self, /)\n--\n\nlibrdkafka's log lines since the last call."},
    {"take_written", (PyCFunction)Producer_take_written, METH_NOARGS,
     "take_written($self, /)\n--\n\n"
     "Per topic-partition, the first and last offset and count acknowledged since the last call (offsets=True)."},
    {"partition_count", (PyCFunction)Producer_partition_count, METH_VARARGS,
     "partition_count($self, topic, timeout, /)\n--\n\nA topic's partition count."},
    {"connect", (PyCFunction)Producer_connect, METH_VARARGS,
     "connect($self, timeout, /)\n--\n\nWait until a broker answers; (error code, text)."},
    {"init_transactions", (PyCFunction)Producer_init_transactions, METH_VARARGS,
     "init_transactions($self, timeout, /)\n--\n\nlibrdkafka's init_transactions, waiting up to timeout seconds."},
    {"begin_transaction", (PyCFunction)Producer_begin_transaction, METH_NOARGS,
     "begin_transaction($self, /)\n--\n\nlibrdkafka's begin_transaction."},
    {"commit_transaction", (PyCFunction)Producer_commit_transaction, METH_VARARGS,
     "commit_transaction($self, timeout, /)\n--\n\nlibrdkafka's commit_transaction, waiting up to timeout seconds."},
    {"abort_transaction", (PyCFunction)Producer_abort_transaction, METH_VARARGS,
     "abort_transaction($self, timeout, /)\n--\n\nlibrdkafka's abort_transaction, waiting up to timeout seconds."},
    {"send_marker", (PyCFunction)Producer_send_marker, METH_VARARGS,
     "send_marker($self, group, topic, partition, offset, metadata, timeout, /)\n--\n\n"
     "One consumer-group offset into the open transaction (the commit marker)."},
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

/* load(path) -> librdkafka's version: open the library and look up every function of RK_FUNCS. */
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
    {"load", load, METH_VARARGS, "load($module, path, /)\n--\n\nOpen librdkafka at path; returns its version."},
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
