/* Arrow arrays for the C extensions (_digests.c, _produce_send.c), taken through the Arrow C Data Interface: the
 * ArrowSchema and ArrowArray structs of the specification, their import from the PyCapsules of any object's
 * __arrow_c_array__() (pyarrow 14 and later), format checks with errors that name the column, typed views of the
 * buffers, made once per batch and column, and the per-row reads of those views that both extensions' loops use.
 *
 * The interface carries no buffer sizes: a view trusts that the array's buffers hold its offset + length
 * entries and that its last offset lies inside its data, which Arrow's own (cheap) validation checks and the
 * Python callers run first (pyarrow's validate()). What that validation leaves out, every offset in order, is
 * checked here: an out-of-order offset in a batch read back from the WAL would otherwise read outside the data.
 *
 * Include after Python.h (and Py_LIMITED_API): only the limited API is used.
 */
#ifndef RECOVERABLE_SINK_ARROW_READER_H
#define RECOVERABLE_SINK_ARROW_READER_H

#include <stdint.h>
#include <string.h>

/* ---- the C Data Interface (https://arrow.apache.org/docs/format/CDataInterface.html), as the spec writes it -- */
#ifndef ARROW_C_DATA_INTERFACE
#define ARROW_C_DATA_INTERFACE

#define ARROW_FLAG_DICTIONARY_ORDERED 1
#define ARROW_FLAG_NULLABLE 2
#define ARROW_FLAG_MAP_KEYS_SORTED 4

struct ArrowSchema {
    /* Array type description */
    const char *format;
    const char *name;
    const char *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;

    /* Release callback */
    void (*release)(struct ArrowSchema *);
    /* Opaque producer-specific data */
    void *private_data;
};

struct ArrowArray {
    /* Array data description */
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;

    /* Release callback */
    void (*release)(struct ArrowArray *);
    /* Opaque producer-specific data */
    void *private_data;
};

#endif /* ARROW_C_DATA_INTERFACE */

/* ---- import ------------------------------------------------------------------------------------------------- */

/* An imported array, borrowed in place from its capsules: the structs stay owned by the (schema, array) tuple
 * __arrow_c_array__ returned, whose capsule destructors release them. Holding `capsules` keeps the buffers alive;
 * ar_clear drops it. Nothing here calls release itself, so nothing is released twice. */
typedef struct {
    PyObject *capsules;
    const struct ArrowSchema *schema;
    const struct ArrowArray *array;
} ar_ref_t;

static inline void ar_clear(ar_ref_t *ref) {
    Py_CLEAR(ref->capsules);
    ref->schema = NULL;
    ref->array = NULL;
}

/* Import `obj` (anything with __arrow_c_array__) as column `what`; 0, or -1 with a Python error set. */
static inline int ar_import(PyObject *obj, const char *what, ar_ref_t *ref) {
    memset(ref, 0, sizeof *ref);
    PyObject *pair = PyObject_CallMethod(obj, "__arrow_c_array__", NULL);
    if (pair == NULL) {
        if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s: not an Arrow array (it has no __arrow_c_array__)", what);
        }
        return -1;
    }
    PyObject *schema = PyTuple_Check(pair) && PyTuple_Size(pair) == 2 ? PyTuple_GetItem(pair, 0) : NULL;
    PyObject *array = schema != NULL ? PyTuple_GetItem(pair, 1) : NULL;
    if (array == NULL || !PyCapsule_IsValid(schema, "arrow_schema") || !PyCapsule_IsValid(array, "arrow_array")) {
        Py_DECREF(pair);
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: __arrow_c_array__ did not return an (arrow_schema, arrow_array) pair "
                     "of capsules", what);
        return -1;
    }
    ref->schema = PyCapsule_GetPointer(schema, "arrow_schema");
    ref->array = PyCapsule_GetPointer(array, "arrow_array");
    ref->capsules = pair;
    if (ref->schema->release == NULL || ref->array->release == NULL) {
        ar_clear(ref);
        PyErr_Format(PyExc_ValueError, "%s: the exported Arrow array was already released", what);
        return -1;
    }
    return 0;
}

/* ---- typed views ---------------------------------------------------------------------------------------------- */

/* A binary or string column (formats z, u; Z, U with 64-bit offsets). Element i of the view is element
 * offset + i of the buffers; `valid` is NULL when the column has no nulls, `data` never NULL. */
typedef struct {
    const uint8_t *valid;
    const uint8_t *offsets; /* int32, or int64 if wide */
    const uint8_t *data;
    int64_t offset, length;
    int wide;
} ar_binary_t;

/* An int32 (format i) or int64 (format l) column. */
typedef struct {
    const uint8_t *valid;
    const uint8_t *values;
    int64_t offset, length;
    int width;
} ar_int_t;

/* A list<struct<key, value>> column of headers (format +l of +s): row i's items are the key and value elements
 * offsets[offset + i] to offsets[offset + i + 1] (int32), within [0, items). */
typedef struct {
    const uint8_t *valid; /* the list's own: NULL when no row is null */
    const int32_t *offsets;
    int64_t offset, length, items;
    ar_binary_t key, value;
} ar_headers_t;

static const uint8_t AR_EMPTY[1] = {0};

static inline int ar_fail(const char *what, const char *why) {
    PyErr_Format(PyExc_ValueError, "%s: %s", what, why);
    return -1;
}

/* The column's validity bitmap, or NULL when the producer says it has no nulls (a null count of -1 is unknown). */
static inline const uint8_t *ar_validity(const struct ArrowArray *a) {
    return a->null_count == 0 || a->n_buffers < 1 ? NULL : (const uint8_t *)a->buffers[0];
}

static inline int ar_check(const struct ArrowSchema *s, const struct ArrowArray *a, int64_t buffers,
                           int64_t children, const char *what) {
    if (s->dictionary != NULL || a->dictionary != NULL)
        return ar_fail(what, "a dictionary-encoded array is not accepted; decode it first");
    if (a->n_buffers != buffers || a->n_children != children || s->n_children != children)
        return ar_fail(what, "its buffers or children do not match its Arrow format");
    if (a->length < 0 || a->offset < 0)
        return ar_fail(what, "a negative length or offset");
    return 0;
}

/* Whether offsets [first, first + rows] of an offsets buffer are in order and inside [0, limit]: one loop per
 * width, so that no offset is widened or tested for its width. */
#define AR_OFFSETS_OK(name, type, type_max)                                                                   \
    static inline int name(const uint8_t *offsets, int64_t first, int64_t rows, int64_t limit) {              \
        type previous = 0, top = limit > type_max ? type_max : (type)limit;                                   \
        for (int64_t j = first; j <= first + rows; j++) {                                                     \
            type at;                                                                                          \
            memcpy(&at, offsets + sizeof(type) * j, sizeof(type));                                            \
            if (at < previous || at > top)                                                                    \
                return 0;                                                                                     \
            previous = at;                                                                                    \
        }                                                                                                     \
        return 1;                                                                                             \
    }
AR_OFFSETS_OK(ar_offsets_ok32, int32_t, INT32_MAX)
AR_OFFSETS_OK(ar_offsets_ok64, int64_t, INT64_MAX)

/* Rows [base, base + rows) of a binary array (base: a parent struct's offset; rows < 0: all of its rows) as a
 * view, every offset checked to be in order; 64-bit offsets only where wide_ok. */
static inline int ar_binary(const struct ArrowSchema *s, const struct ArrowArray *a, int64_t base, int64_t rows,
                            int wide_ok, const char *what, ar_binary_t *out) {
    const char *f = s->format;
    int narrow = strcmp(f, "z") == 0 || strcmp(f, "u") == 0, wide = strcmp(f, "Z") == 0 || strcmp(f, "U") == 0;
    memset(out, 0, sizeof *out);
    if (!narrow && !(wide && wide_ok)) {
        PyErr_Format(PyExc_TypeError, "%s: Arrow format '%s' is not %s", what, f,
                     wide_ok ? "binary or string (z, u, Z, U)" : "binary or string with 32-bit offsets (z, u)");
        return -1;
    }
    if (ar_check(s, a, 3, 0, what) < 0)
        return -1;
    if (rows < 0)
        rows = a->length - base;
    if (base < 0 || base + rows > a->length)
        return ar_fail(what, "shorter than its rows");
    out->valid = ar_validity(a);
    out->offsets = a->buffers[1];
    out->data = a->buffers[2] != NULL ? (const uint8_t *)a->buffers[2] : AR_EMPTY;
    out->offset = a->offset + base;
    out->length = rows;
    out->wide = wide;
    if (rows == 0)
        return 0; /* nothing is read: Arrow Java sends an empty vector with no offsets at all */
    if (out->offsets == NULL)
        return ar_fail(what, "no offsets buffer");
    /* An absent data buffer is an empty one: every value must then be empty. */
    int64_t limit = a->buffers[2] != NULL ? INT64_MAX : 0;
    int ok = wide ? ar_offsets_ok64(out->offsets, out->offset, rows, limit)
                  : ar_offsets_ok32(out->offsets, out->offset, rows, limit);
    return ok ? 0 : ar_fail(what, "offsets out of order or outside its data");
}

/* -1 with a ValueError naming the column unless the array has exactly `rows` rows (the batch's). */
static inline int ar_rows(const struct ArrowArray *a, int64_t rows, const char *what) {
    if (a->length == rows)
        return 0;
    PyErr_Format(PyExc_ValueError, "%s: %lld rows where the batch has %lld", what, (long long)a->length,
                 (long long)rows);
    return -1;
}

/* An int32 (width 4) or int64 (width 8) array of exactly `rows` rows as a view. */
static inline int ar_int(const struct ArrowSchema *s, const struct ArrowArray *a, int64_t rows, int width,
                         const char *what, ar_int_t *out) {
    memset(out, 0, sizeof *out);
    if (strcmp(s->format, width == 4 ? "i" : "l") != 0) {
        PyErr_Format(PyExc_TypeError, "%s: Arrow format '%s' is not %s", what, s->format,
                     width == 4 ? "int32 (i)" : "int64 (l)");
        return -1;
    }
    if (ar_check(s, a, 2, 0, what) < 0)
        return -1;
    if (ar_rows(a, rows, what) < 0)
        return -1;
    out->valid = ar_validity(a);
    out->values = a->buffers[1];
    out->offset = a->offset;
    out->length = rows;
    out->width = width;
    if (rows > 0 && out->values == NULL)
        return ar_fail(what, "no values buffer");
    return 0;
}

/* A top-level binary column of exactly `rows` rows. */
static inline int ar_binary_rows(const struct ArrowSchema *s, const struct ArrowArray *a, int64_t rows,
                                 int wide_ok, const char *what, ar_binary_t *out) {
    if (ar_rows(a, rows, what) < 0)
        return -1;
    return ar_binary(s, a, 0, rows, wide_ok, what, out);
}

/* The struct child named `name` of a struct array (s, a). */
static inline int ar_child(const struct ArrowSchema *s, const struct ArrowArray *a, const char *name,
                           const struct ArrowSchema **cs, const struct ArrowArray **ca) {
    for (int64_t k = 0; k < s->n_children; k++) {
        if (s->children[k]->name != NULL && strcmp(s->children[k]->name, name) == 0) {
            *cs = s->children[k];
            *ca = a->children[k];
            return 0;
        }
    }
    return -1;
}

/* A headers column of exactly `rows` rows: list<struct<key, value>> with binary or string keys and values.
 * The struct's own validity is not read (a header's key and value carry theirs; the sink refuses null keys). */
static inline int ar_headers(const struct ArrowSchema *s, const struct ArrowArray *a, int64_t rows, int wide_ok,
                             const char *what, ar_headers_t *out) {
    memset(out, 0, sizeof *out);
    if (strcmp(s->format, "+l") != 0 || s->n_children != 1 || strcmp(s->children[0]->format, "+s") != 0) {
        PyErr_Format(PyExc_TypeError, "%s: Arrow format '%s' is not a list of structs (+l of +s)", what, s->format);
        return -1;
    }
    if (ar_check(s, a, 2, 1, what) < 0)
        return -1;
    const struct ArrowSchema *is = s->children[0], *ks, *vs;
    const struct ArrowArray *ia = a->children[0], *ka, *va;
    if (ar_check(is, ia, 1, is->n_children, what) < 0)
        return -1;
    if (ar_child(is, ia, "key", &ks, &ka) < 0 || ar_child(is, ia, "value", &vs, &va) < 0) {
        PyErr_Format(PyExc_TypeError, "%s: its structs have no key or no value field", what);
        return -1;
    }
    if (ar_rows(a, rows, what) < 0)
        return -1;
    out->valid = ar_validity(a);
    out->offset = a->offset;
    out->length = rows;
    out->items = ia->length;
    if (rows > 0) {
        if (a->buffers[1] == NULL)
            return ar_fail(what, "no offsets buffer");
        out->offsets = (const int32_t *)a->buffers[1];
        int32_t previous = 0;
        for (int64_t j = a->offset; j <= a->offset + rows; j++) {
            if (out->offsets[j] < previous || out->offsets[j] > out->items)
                return ar_fail(what, "offsets out of order or outside its items");
            previous = out->offsets[j];
        }
    }
    /* The struct's children start at its own offset: its item j is their element ia->offset + j. */
    if (ar_binary(ks, ka, ia->offset, out->items, wide_ok, "header keys", &out->key) < 0 ||
        ar_binary(vs, va, ia->offset, out->items, wide_ok, "header values", &out->value) < 0)
        return -1;
    return 0;
}

/* ---- per-row reads of the views (inside the loops, without the GIL) ------------------------------------------ */

/* Bit j of a validity bitmap, j counted from the buffer's start (the array's offset included); NULL: no nulls. */
static inline int ar_bit(const uint8_t *bitmap, int64_t j) {
    return bitmap == NULL || (bitmap[j >> 3] >> (j & 7)) & 1;
}

/* Entry j of an offsets buffer, int32 or int64 if wide; memcpy, since nothing promises an aligned buffer. */
static inline int64_t ar_offset(const uint8_t *offsets, int wide, int64_t j) {
    if (wide) {
        int64_t x;
        memcpy(&x, offsets + 8 * j, 8);
        return x;
    }
    int32_t x;
    memcpy(&x, offsets + 4 * j, 4);
    return x;
}

#define AR_NARROW 0 /* `wide` for a view made with wide_ok 0: the compiler then drops the width test per row */

/* Row i's bytes in a binary view, its validity not read: *len bytes at the pointer returned, never NULL (an absent
 * data buffer is AR_EMPTY), since librdkafka takes a NULL for a null. `wide` is the view's c->wide or AR_NARROW. */
static inline const uint8_t *ar_bytes(const ar_binary_t *c, int wide, int64_t i, size_t *len) {
    int64_t start = ar_offset(c->offsets, wide, c->offset + i);
    *len = (size_t)(ar_offset(c->offsets, wide, c->offset + i + 1) - start);
    return c->data + start;
}

/* Row i of a binary view: 0 for a null (*ptr and *len untouched), else 1 with its bytes as ar_bytes gives them. */
static inline int ar_value(const ar_binary_t *c, int wide, int64_t i, const uint8_t **ptr, size_t *len) {
    if (!ar_bit(c->valid, c->offset + i))
        return 0;
    *ptr = ar_bytes(c, wide, i, len);
    return 1;
}

/* Row i of an int32 or int64 view: 0 for a null, else 1 with its value. */
static inline int ar_int_value(const ar_int_t *c, int64_t i, int64_t *value) {
    int64_t j = c->offset + i;
    if (!ar_bit(c->valid, j))
        return 0;
    if (c->width == 8) {
        memcpy(value, c->values + 8 * j, 8);
    } else {
        int32_t x;
        memcpy(&x, c->values + 4 * j, 4);
        *value = x;
    }
    return 1;
}

/* Row i of a headers view: 0 for a null list, else 1 with its items, [*first, *end) of h->key and h->value. */
static inline int ar_header_items(const ar_headers_t *h, int64_t i, int64_t *first, int64_t *end) {
    int64_t j = h->offset + i;
    if (!ar_bit(h->valid, j))
        return 0;
    *first = h->offsets[j];
    *end = h->offsets[j + 1];
    return 1;
}

#endif
