/* recoverable_sink._digests: the record digests of a whole Arrow batch in one call, without the GIL.
 *
 * BLAKE2b with a 16-byte digest, written from RFC 7693 (no key, salt or personalisation), over
 * prefix || element for each element of an Arrow binary array (taken through the Arrow C Data Interface,
 * _arrow_reader.h).
 * The same bytes as hashlib.blake2b(prefix + element, digest_size=16).digest(): recoverable_sink.identity
 * falls back to hashlib where this module was not built (spark-submit --py-files), and the unit tests hold
 * the two to the same results. Where the CPU has AVX-512 or AVX2, eight or four records are hashed per pass
 * (digest_lanes8, digest_lanes4), two to three times the records per second of one at a time.
 * Built against the limited API of Python 3.10 (the stable ABI): one build serves every later Python.
 */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include "_arrow_reader.h"

#define BLOCK 128
#define OUT 16

static const uint64_t IV[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL, 0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL,
};

/* The message schedule of RFC 7693 section 2.7; rounds 10 and 11 reuse rows 0 and 1 (r % 10 below). */
static const uint8_t SIGMA[10][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
};

static inline uint64_t rotr(uint64_t x, int n) { return (x >> n) | (x << (64 - n)); }

static inline uint64_t load64(const uint8_t *p) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t x;
    memcpy(&x, p, 8);  /* one unaligned load */
    return x;
#else
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--) x = (x << 8) | p[i];  /* little-endian, whatever the host */
    return x;
#endif
}

#define G(a, b, c, d, x, y)          \
    do {                             \
        a = a + b + (x);             \
        d = rotr(d ^ a, 32);         \
        c = c + d;                   \
        b = rotr(b ^ c, 24);         \
        a = a + b + (y);             \
        d = rotr(d ^ a, 16);         \
        c = c + d;                   \
        b = rotr(b ^ c, 63);         \
    } while (0)

/* The twelve rounds of F on v[16] with message words m[16], spelled out so that every message index is a
 * constant and v stays in registers; G_ is the mixing function (G here, VG for the lanes). */
#define ROUND(G_, r)                                                                  \
    do {                                                                              \
        G_(v[0], v[4], v[8], v[12], m[SIGMA[(r) % 10][0]], m[SIGMA[(r) % 10][1]]);    \
        G_(v[1], v[5], v[9], v[13], m[SIGMA[(r) % 10][2]], m[SIGMA[(r) % 10][3]]);    \
        G_(v[2], v[6], v[10], v[14], m[SIGMA[(r) % 10][4]], m[SIGMA[(r) % 10][5]]);   \
        G_(v[3], v[7], v[11], v[15], m[SIGMA[(r) % 10][6]], m[SIGMA[(r) % 10][7]]);   \
        G_(v[0], v[5], v[10], v[15], m[SIGMA[(r) % 10][8]], m[SIGMA[(r) % 10][9]]);   \
        G_(v[1], v[6], v[11], v[12], m[SIGMA[(r) % 10][10]], m[SIGMA[(r) % 10][11]]); \
        G_(v[2], v[7], v[8], v[13], m[SIGMA[(r) % 10][12]], m[SIGMA[(r) % 10][13]]);  \
        G_(v[3], v[4], v[9], v[14], m[SIGMA[(r) % 10][14]], m[SIGMA[(r) % 10][15]]);  \
    } while (0)
#define TWELVE_ROUNDS(G_)                                                                             \
    do {                                                                                              \
        ROUND(G_, 0); ROUND(G_, 1); ROUND(G_, 2); ROUND(G_, 3); ROUND(G_, 4); ROUND(G_, 5);           \
        ROUND(G_, 6); ROUND(G_, 7); ROUND(G_, 8); ROUND(G_, 9); ROUND(G_, 10); ROUND(G_, 11);         \
    } while (0)

/* F of RFC 7693 section 3.2; `t` counts the message bytes so far (messages here stay far below 2^64). */
static void compress(uint64_t h[8], const uint8_t block[BLOCK], uint64_t t, int last) {
    uint64_t m[16], v[16];
    for (int i = 0; i < 16; i++) m[i] = load64(block + 8 * i);
    for (int i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = IV[i];
    }
    v[12] ^= t;
    if (last) v[14] = ~v[14];
    TWELVE_ROUNDS(G);
    for (int i = 0; i < 8; i++) h[i] ^= v[i] ^ v[i + 8];
}

/* Copy len bytes at position pos of the concatenation a || b into dst. */
static void gather(uint8_t *dst, const uint8_t *a, size_t alen, const uint8_t *b, size_t pos, size_t len) {
    if (pos < alen) {
        size_t take = alen - pos < len ? alen - pos : len;
        memcpy(dst, a + pos, take);
        dst += take;
        pos += take;
        len -= take;
    }
    if (len) memcpy(dst, b + (pos - alen), len);
}

/* BLAKE2b-128 of a || b (the prefix and one element), into out[16]. */
static void digest2(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen, uint8_t out[OUT]) {
    uint64_t h[8];
    uint8_t block[BLOCK];
    memcpy(h, IV, sizeof h);
    h[0] ^= 0x01010000ULL ^ OUT;  /* parameter block: digest length 16, no key, fanout 1, depth 1 */
    size_t total = alen + blen, pos = 0;
    while (total - pos > BLOCK) {  /* every block but the last, which is compressed as the final one */
        if (pos >= alen) {
            compress(h, b + (pos - alen), pos + BLOCK, 0);  /* wholly inside b: no copy */
        } else {
            gather(block, a, alen, b, pos, BLOCK);
            compress(h, block, pos + BLOCK, 0);
        }
        pos += BLOCK;
    }
    size_t rest = total - pos;  /* 0 (an empty message) to BLOCK */
    gather(block, a, alen, b, pos, rest);
    memset(block + rest, 0, BLOCK - rest);
    compress(h, block, total, 1);
    for (int i = 0; i < OUT; i++) out[i] = (uint8_t)(h[i / 8] >> (8 * (i % 8)));
}

#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
/* Several records at once: lane l of every vector belongs to record l, so each instruction of BLAKE2b's rounds
 * works on independent messages. Two builds of the same rounds (_digests_lanes.h): eight lanes in AVX-512
 * registers, where rotations are one instruction, and four lanes in AVX2 registers, where the rotations by 32,
 * 24 and 16 bits are byte shuffles within a register (GCC lowers a shuffle of a vector wider than the CPU's
 * element by element, so the AVX2 build cannot use eight lanes in two registers with shuffles, and rotations as
 * shifts cost more: docs/performance.md, "Digest extension"). The module picks one when it loads. The
 * digests are the same bytes as digest2's, which the unit tests hold to hashlib's. */
#define MAX_LANES 8
#define VG(a, b, c, d, x, y)         \
    do {                             \
        a = a + b + (x);             \
        d = ROT32(d ^ a);            \
        c = c + d;                   \
        b = ROT24(b ^ c);            \
        a = a + b + (y);             \
        d = ROT16(d ^ a);            \
        c = c + d;                   \
        b = ROT63(b ^ c);            \
    } while (0)

typedef uint64_t lanes8_t __attribute__((vector_size(64)));
#define LANES 8
#define LANES_T lanes8_t
#define LANES_FN digest_lanes8
#define LANES_TARGET "avx512f"
#define VROTR(x, n) (((x) >> (n)) | ((x) << (64 - (n))))  /* one vprorq */
#define ROT32(x) VROTR(x, 32)
#define ROT24(x) VROTR(x, 24)
#define ROT16(x) VROTR(x, 16)
#define ROT63(x) VROTR(x, 63)
#include "_digests_lanes.h"
#undef LANES
#undef LANES_T
#undef LANES_FN
#undef LANES_TARGET
#undef ROT32
#undef ROT24
#undef ROT16
#undef ROT63

typedef uint64_t lanes4_t __attribute__((vector_size(32)));
typedef uint32_t words4_t __attribute__((vector_size(32)));
typedef uint8_t bytes4_t __attribute__((vector_size(32)));
#define LANES 4
#define LANES_T lanes4_t
#define LANES_FN digest_lanes4
#define LANES_TARGET "avx2"
/* Byte b of a rotated word comes from byte (b + n / 8) % 8 of the same word: vpshufd for 32, vpshufb for 24, 16. */
#define BYTE_ROT(w, k) 8 * (w) + (k) % 8, 8 * (w) + (1 + (k)) % 8, 8 * (w) + (2 + (k)) % 8, 8 * (w) + (3 + (k)) % 8, \
                       8 * (w) + (4 + (k)) % 8, 8 * (w) + (5 + (k)) % 8, 8 * (w) + (6 + (k)) % 8, 8 * (w) + (7 + (k)) % 8
#if defined(__clang__) /* the zig (clang) build of the released wheels: the same shuffles, clang's spelling */
#define WORD_SHUFFLE(x, k)                                                                                     \
    ((lanes4_t)__builtin_shufflevector((bytes4_t)(x), (bytes4_t)(x), BYTE_ROT(0, k), BYTE_ROT(1, k),          \
                                       BYTE_ROT(2, k), BYTE_ROT(3, k)))
#define ROT32(x) ((lanes4_t)__builtin_shufflevector((words4_t)(x), (words4_t)(x), 1, 0, 3, 2, 5, 4, 7, 6))
#else
#define WORD_SHUFFLE(x, k)                                                                                     \
    ((lanes4_t)__builtin_shuffle((bytes4_t)(x),                                                               \
                                 (bytes4_t){BYTE_ROT(0, k), BYTE_ROT(1, k), BYTE_ROT(2, k), BYTE_ROT(3, k)}))
#define ROT32(x) ((lanes4_t)__builtin_shuffle((words4_t)(x), (words4_t){1, 0, 3, 2, 5, 4, 7, 6}))
#endif
#define ROT24(x) WORD_SHUFFLE(x, 3)
#define ROT16(x) WORD_SHUFFLE(x, 2)
#define ROT63(x) (((x) >> 63) | ((x) + (x)))
#include "_digests_lanes.h"

/* Without AVX2 the lanes cost more than one record at a time (SSE2 splits every vector, with rotations as two
 * shifts). Set when the module loads: 8, 4 or 0. */
static int lanes = 0;
#else
#define MAX_LANES 0
#endif

static PyObject *batch(PyObject *Py_UNUSED(self), PyObject *args) {
    const char *prefix;
    Py_ssize_t prefix_len;
    PyObject *bodies;
    if (!PyArg_ParseTuple(args, "y#O", &prefix, &prefix_len, &bodies)) return NULL;
    ar_ref_t ref;
    ar_binary_t col;
    if (ar_import(bodies, "bodies", &ref) < 0) return NULL;
    PyObject *result = NULL;
    /* Every offset is checked here, so that the hashing below only reads inside the buffers. */
    if (ar_binary(ref.schema, ref.array, 0, -1, 1, "bodies", &col) < 0) goto done;
    Py_ssize_t count = (Py_ssize_t)col.length;
    int wide = col.wide;
    result = PyBytes_FromStringAndSize(NULL, count * OUT);
    if (result == NULL) goto done;
    uint8_t *out = (uint8_t *)PyBytes_AsString(result);
    const uint8_t *pre = (const uint8_t *)prefix;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t i = 0;
#if MAX_LANES
    for (; lanes && i + lanes <= count; i += lanes) {
        const uint8_t *bodies[MAX_LANES];
        size_t lens[MAX_LANES];
        for (int l = 0; l < lanes; l++) bodies[l] = ar_bytes(&col, wide, i + l, &lens[l]);
        if (lanes == 8)
            digest_lanes8(pre, (size_t)prefix_len, bodies, lens, out + OUT * i);
        else
            digest_lanes4(pre, (size_t)prefix_len, bodies, lens, out + OUT * i);
    }
#endif
    for (; i < count; i++) {
        size_t len;
        const uint8_t *body = ar_bytes(&col, wide, i, &len);
        digest2(pre, (size_t)prefix_len, body, len, out + OUT * i);
    }
    Py_END_ALLOW_THREADS
done:
    ar_clear(&ref);
    return result;
}

/* ---- records(prefix, count, fields): the digests of a batch's records from its columns, with no joined copy --
 * Each record's message is prefix || the concatenation of `fields`, each one of:
 *   bytes                        the same bytes for every record
 *   (0, name, array)             a binary or string column's value (nothing for a null)
 *   (1, name, array)             its length frame: 4 bytes little-endian, 0xFFFFFFFF for a null
 *   (2, name, array)             a list<struct<key, value>> of headers: for each, "h", the key's frame and bytes,
 *                                the value's frame and bytes (nothing for a null list)
 * (arrays: anything with __arrow_c_array__, 32-bit offsets, `count` rows; name: the column, for errors). The same
 * bytes recoverable_sink.identity._bodies builds with Arrow, gathered record by record into a small buffer
 * instead (a few records' worth, in cache): Arrow's joins wrote every record into a new array first, which took
 * as long as hashing it with 100 B values. */
enum { F_LITERAL = 3, F_DATA = 0, F_FRAME = 1, F_HEADERS = 2 };
typedef struct {
    int kind;
    const uint8_t *lit; Py_ssize_t lit_len;
    ar_binary_t col;       /* F_DATA, F_FRAME: 32-bit offsets (made with wide_ok 0, read AR_NARROW) */
    ar_headers_t headers;  /* F_HEADERS: keys and values with 32-bit offsets too */
} field_t;
#define MAX_FIELDS 32
typedef struct {
    uint8_t *p;
    size_t len, cap;
} growable_t;
static int reserve(growable_t *b, size_t more) {
    if (b->len + more <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more) cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (p == NULL) return 0;
    b->p = p;
    b->cap = cap;
    return 1;
}
static inline int put(growable_t *b, const void *src, size_t n) {
    if (!reserve(b, n)) return 0;
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
    return 1;
}
static inline int put_frame(growable_t *b, const ar_binary_t *c, Py_ssize_t i) {
    const uint8_t *p;
    size_t len;
    uint32_t n = ar_value(c, AR_NARROW, i, &p, &len) ? (uint32_t)len : 0xFFFFFFFFu;
    uint8_t le[4] = {(uint8_t)n, (uint8_t)(n >> 8), (uint8_t)(n >> 16), (uint8_t)(n >> 24)};
    return put(b, le, 4);
}
static inline int put_data(growable_t *b, const ar_binary_t *c, Py_ssize_t i) {
    const uint8_t *p;
    size_t len;
    return !ar_value(c, AR_NARROW, i, &p, &len) || put(b, p, len);
}
/* Record i's message after the prefix, appended to b. */
static int gather_record(growable_t *b, const field_t *fields, int nfields, Py_ssize_t i) {
    for (int f = 0; f < nfields; f++) {
        const field_t *fd = &fields[f];
        switch (fd->kind) {
        case F_LITERAL:
            if (!put(b, fd->lit, (size_t)fd->lit_len)) return 0;
            break;
        case F_DATA:
            if (!put_data(b, &fd->col, i)) return 0;
            break;
        case F_FRAME:
            if (!put_frame(b, &fd->col, i)) return 0;
            break;
        case F_HEADERS: {
            const ar_headers_t *h = &fd->headers;
            int64_t first, end;
            if (!ar_header_items(h, i, &first, &end)) break;
            for (int64_t j = first; j < end; j++) {
                if (!put(b, "h", 1) || !put_frame(b, &h->key, j) || !put_data(b, &h->key, j) ||
                    !put_frame(b, &h->value, j) || !put_data(b, &h->value, j))
                    return 0;
            }
            break;
        }
        }
    }
    return 1;
}
/* One field of records()' spec into fd; an array field is imported into ref (kept until the digests are made). */
static int parse_field(PyObject *item, Py_ssize_t count, field_t *fd, ar_ref_t *ref) {
    memset(fd, 0, sizeof *fd);
    memset(ref, 0, sizeof *ref);
    if (PyBytes_Check(item)) {
        char *lit;
        fd->kind = F_LITERAL;
        if (PyBytes_AsStringAndSize(item, &lit, &fd->lit_len) < 0) return 0;
        fd->lit = (const uint8_t *)lit;
        return 1;
    }
    long kind = -1;
    const char *name = NULL;
    if (PyTuple_Check(item) && PyTuple_Size(item) == 3) {
        kind = PyLong_AsLong(PyTuple_GetItem(item, 0));
        name = kind == -1 ? NULL : PyUnicode_AsUTF8AndSize(PyTuple_GetItem(item, 1), NULL);
        if (PyErr_Occurred()) return 0;
    }
    if (name == NULL || (kind != F_DATA && kind != F_FRAME && kind != F_HEADERS)) {
        PyErr_SetString(PyExc_ValueError, "a field is neither bytes nor a (kind 0, 1 or 2, name, array) tuple");
        return 0;
    }
    if (ar_import(PyTuple_GetItem(item, 2), name, ref) < 0) return 0;
    fd->kind = (int)kind;
    if (kind != F_HEADERS) return ar_binary_rows(ref->schema, ref->array, count, 0, name, &fd->col) == 0;
    return ar_headers(ref->schema, ref->array, count, 0, name, &fd->headers) == 0;
}
static PyObject *records(PyObject *Py_UNUSED(self), PyObject *args) {
    const char *prefix;
    Py_ssize_t prefix_len, count;
    PyObject *spec;
    if (!PyArg_ParseTuple(args, "y#nO!", &prefix, &prefix_len, &count, &PyTuple_Type, &spec)) return NULL;
    ar_ref_t refs[MAX_FIELDS];
    int nrefs = 0, nfields = (int)PyTuple_Size(spec), ok = 1;
    field_t fields[MAX_FIELDS];
    PyObject *result = NULL;
    if (count < 0 || nfields > MAX_FIELDS) {
        PyErr_SetString(PyExc_ValueError, "a negative count, or too many fields");
        goto done;
    }
    for (int f = 0; f < nfields; f++) {
        if (!parse_field(PyTuple_GetItem(spec, f), count, &fields[f], &refs[nrefs])) {
            ar_clear(&refs[nrefs]);
            goto done;
        }
        if (refs[nrefs].capsules != NULL) nrefs++;
    }
    result = PyBytes_FromStringAndSize(NULL, count * OUT);
    if (result == NULL) goto done;
    uint8_t *out = (uint8_t *)PyBytes_AsString(result);
    const uint8_t *pre = (const uint8_t *)prefix;
    size_t plen = (size_t)prefix_len;
    Py_BEGIN_ALLOW_THREADS
    growable_t b = {NULL, 0, 0};
    int step = 1;
#if MAX_LANES
    step = lanes ? lanes : 1;
#endif
    for (Py_ssize_t i = 0; ok && i < count; i += step) {
        int n = count - i < step ? (int)(count - i) : step;
        size_t starts[MAX_LANES > 0 ? MAX_LANES : 1], lens[MAX_LANES > 0 ? MAX_LANES : 1];
        b.len = 0;
        for (int l = 0; ok && l < n; l++) {
            starts[l] = b.len;
            ok = gather_record(&b, fields, nfields, i + l);
            lens[l] = b.len - starts[l];
        }
        if (!ok) break;
#if MAX_LANES
        if (n == lanes && lanes > 1) {
            const uint8_t *bodies[MAX_LANES];
            for (int l = 0; l < n; l++) bodies[l] = b.p + starts[l];
            if (lanes == 8)
                digest_lanes8(pre, plen, bodies, lens, out + OUT * i);
            else
                digest_lanes4(pre, plen, bodies, lens, out + OUT * i);
            continue;
        }
#endif
        for (int l = 0; l < n; l++) digest2(pre, plen, b.p + starts[l], lens[l], out + OUT * (i + l));
    }
    free(b.p);
    Py_END_ALLOW_THREADS
    if (!ok) {
        Py_CLEAR(result);
        PyErr_NoMemory();
    }
done:
    for (int r = 0; r < nrefs; r++) ar_clear(&refs[r]);
    return result;
}
static PyMethodDef methods[] = {
    /* Each doc opens with its signature in CPython's __text_signature__ form, checked by tests/unit/native. */
    {"batch", batch, METH_VARARGS,
     "batch($module, prefix, bodies, /)\n--\n\n"
     "BLAKE2b-128 of prefix + element for every element of `bodies`, an Arrow binary or string array (anything\n"
     "with __arrow_c_array__); 16 bytes per element, concatenated."},
    {"records", records, METH_VARARGS,
     "records($module, prefix, count, fields, /)\n--\n\n"
     "BLAKE2b-128 of prefix + the concatenation of `fields` for each of `count` records, gathered from Arrow\n"
     "arrays (see the comment above records in _digests.c); 16 bytes per record, concatenated."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "_digests", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__digests(void) {
    int n = 0;
#if MAX_LANES
    __builtin_cpu_init();
    lanes = __builtin_cpu_supports("avx512f") ? 8 : __builtin_cpu_supports("avx2") ? 4 : 0;
    n = lanes;
#endif
    PyObject *m = PyModule_Create(&module);
    /* How many records one pass hashes on this CPU (1: one at a time), for tests and benchmarks to report. */
    if (m != NULL && PyModule_AddIntConstant(m, "LANES", n ? n : 1) < 0) Py_CLEAR(m);
    return m;
}
