/*
 * cp_source.factory._ysb: the all-string NDJSON row parser (YSB) in C.
 *
 * The same function as the numba kernel cp_source.factory.ysb_numba._parse, byte for byte: it
 * accepts exactly the rows that one accepts, writes the same offsets and data, and returns -1
 * (leaving `start` as it was) on anything else. A factory worker that uses it needs no JIT: no
 * numba import, no cached machine code to load, no compile, and a warm-up parse of microseconds.
 *
 * Every array comes from the caller. Before the loop their types, shapes, contiguity and the
 * room they give are checked, so the loop needs no bounds check of its own: each data byte
 * written copies one distinct input byte (at most len(buf) per column past start[k]), and at
 * most max_rows + 1 offsets are written per column from r0. The loop runs without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_KEYS 62 /* the seen-key mask is one int64, as in the numba kernel */

/* ---- argument checks ------------------------------------------------------------------------- */

/* Whether a buffer's struct format is a native integer of `itemsize` bytes, signed or not. */
static int format_is(const Py_buffer *v, Py_ssize_t itemsize, int is_signed) {
    const char *f = v->format ? v->format : "B";
    if (*f == '@' || *f == '=')
        f++;
#if PY_LITTLE_ENDIAN
    else if (*f == '<')
        f++;
#endif
    if (f[0] == '\0' || f[1] != '\0' || v->itemsize != itemsize)
        return 0;
    const char *letters = is_signed ? "bhilq" : "BHILQ";
    return strchr(letters, f[0]) != NULL;
}

/* Get a C-contiguous buffer of `ndim` dimensions of native integers, or raise naming `name`. */
static int get_array(PyObject *obj, Py_buffer *v, const char *name, int ndim, Py_ssize_t itemsize,
                     int is_signed, int writable) {
    const char *kind = itemsize == 1 ? "uint8" : (itemsize == 4 ? "int32" : "int64");
    int flags = PyBUF_STRIDES | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, v, flags) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "parse: %s must be a %s%s array (got %.100s)", name,
                     writable ? "writable " : "", kind, Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (v->ndim != ndim || !format_is(v, itemsize, is_signed) || !PyBuffer_IsContiguous(v, 'C')) {
        PyErr_Format(PyExc_TypeError, "parse: %s must be a C-contiguous %d-D %s array (got %d-D, format %s)",
                     name, ndim, kind, v->ndim, v->format ? v->format : "B");
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

typedef struct {
    const uint8_t *buf, *keys;
    const int64_t *key_off;
    int32_t *offsets; /* nk rows of orow entries */
    uint8_t *data;    /* nk rows of drow bytes */
    int64_t *start;
    Py_ssize_t n, nkeys, orow, drow, max_rows, r0;
    int nk;
} Args;

/* The room the caller's arrays give, and key offsets inside `keys`; else raise (ValueError). */
static int check_room(const Args *a, Py_ssize_t off_rows, Py_ssize_t data_rows, Py_ssize_t start_len) {
    if (a->nk > MAX_KEYS)
        return PyErr_Format(PyExc_ValueError, "parse: at most %d keys (key_off has %d)", MAX_KEYS, a->nk),
               -1;
    if (off_rows != a->nk || data_rows != a->nk || start_len != a->nk)
        return PyErr_Format(PyExc_ValueError,
                            "parse: offsets, data and start need one row per key (%d keys; got %zd, %zd, %zd)",
                            a->nk, off_rows, data_rows, start_len),
               -1;
    if (a->max_rows < 0 || a->r0 < 0 || a->r0 > a->orow - 1 || a->max_rows > a->orow - 1 - a->r0)
        return PyErr_Format(PyExc_ValueError,
                            "parse: offsets has %zd columns, too few for r0 %zd + max_rows %zd + 1",
                            a->orow, a->r0, a->max_rows),
               -1;
    for (int k = 0; k <= a->nk; k++)
        if (a->key_off[k] < (k ? a->key_off[k - 1] : 0) || a->key_off[k] > a->nkeys)
            return PyErr_Format(PyExc_ValueError, "parse: key_off[%d] is outside keys or decreasing", k), -1;
    for (int k = 0; k < a->nk; k++)
        if (a->start[k] < 0 || a->start[k] > a->drow - a->n || a->start[k] > INT32_MAX - a->n)
            return PyErr_Format(PyExc_ValueError,
                                "parse: data has %zd columns, too few for start[%d] %lld + %zd payload bytes "
                                "(or past int32 offsets)",
                                a->drow, k, (long long)a->start[k], a->n),
                   -1;
    return 0;
}

/* ---- the parser (the numba kernel's loop, statement for statement) ----------------------------- */

#define SPACE(c) ((c) == 32 || (c) == 9 || (c) == 13) /* inside a row: no newline */

static int key_is(const Args *a, Py_ssize_t s, Py_ssize_t ln, int k) {
    int64_t lo = a->key_off[k];
    return a->key_off[k + 1] - lo == ln && memcmp(a->buf + s, a->keys + lo, (size_t)ln) == 0;
}

/* Which key a quoted name at buf[i] (after its opening quote) is, the index after it in *end; -1 if
 * none. Keys usually come in schema order: the expected one (`field`) is matched in place first. */
static int match_key(const Args *a, Py_ssize_t i, int field, Py_ssize_t *end) {
    const uint8_t *buf = a->buf;
    Py_ssize_t n = a->n, ks = i;
    if (field < a->nk) {
        int64_t lo = a->key_off[field], ln = a->key_off[field + 1] - lo;
        if (ks + ln < n && buf[ks + ln] == 34 && memcmp(buf + ks, a->keys + lo, (size_t)ln) == 0) {
            *end = ks + ln;
            return field;
        }
    }
    while (i < n && buf[i] != 34) {
        uint8_t c = buf[i];
        if (c == 92 || c < 32 || c >= 128)
            return -1;
        i++;
    }
    if (i >= n)
        return -1;
    *end = i;
    for (int k = 0; k < a->nk; k++)
        if (key_is(a, ks, i - ks, k))
            return k;
    return -1;
}

static Py_ssize_t parse_rows(const Args *a, int64_t *pos) {
    const uint8_t *buf = a->buf;
    Py_ssize_t n = a->n, i = 0, row = 0;
    uint64_t full = (a->nk ? (((uint64_t)1 << a->nk) - 1) : 0);
    for (int k = 0; k < a->nk; k++)
        pos[k] = a->start[k];
    for (;;) {
        while (i < n && (SPACE(buf[i]) || buf[i] == 10))
            i++;
        if (i >= n)
            break;
        if (row >= a->max_rows || buf[i] != 123) /* '{' */
            return -1;
        i++;
        uint64_t seen = 0;
        int field = 0;
        for (;;) {
            while (i < n && SPACE(buf[i]))
                i++;
            if (i >= n || buf[i] != 34) /* '"' */
                return -1;
            i++;
            int k = match_key(a, i, field, &i);
            if (k < 0 || (seen >> k) & 1)
                return -1;
            i++;
            while (i < n && SPACE(buf[i]))
                i++;
            if (i >= n || buf[i] != 58) /* ':' */
                return -1;
            i++;
            while (i < n && SPACE(buf[i]))
                i++;
            if (i >= n || buf[i] != 34)
                return -1;
            i++;
            int64_t p = pos[k];
            uint8_t *out = a->data + (Py_ssize_t)k * a->drow;
            a->offsets[(Py_ssize_t)k * a->orow + a->r0 + row] = (int32_t)p;
            while (i < n) {
                uint8_t c = buf[i];
                if (c == 34)
                    break;
                if (c == 92 || c < 32 || c >= 128)
                    return -1;
                out[p++] = c;
                i++;
            }
            if (i >= n)
                return -1;
            pos[k] = p;
            seen |= (uint64_t)1 << k;
            field++;
            i++;
            while (i < n && SPACE(buf[i]))
                i++;
            if (i >= n)
                return -1;
            if (buf[i] == 44) { /* ',' */
                i++;
                continue;
            }
            if (buf[i] == 125) { /* '}' */
                i++;
                break;
            }
            return -1;
        }
        if (seen != full)
            return -1;
        while (i < n && SPACE(buf[i]))
            i++;
        if (i < n && buf[i] != 10)
            return -1;
        row++;
    }
    for (int k = 0; k < a->nk; k++) {
        a->offsets[(Py_ssize_t)k * a->orow + a->r0 + row] = (int32_t)pos[k];
        a->start[k] = pos[k];
    }
    return row;
}

/* ---- the Python face --------------------------------------------------------------------------- */

static PyObject *ysb_parse(PyObject *self, PyObject *args) {
    PyObject *o[6];
    Py_ssize_t max_rows, r0;
    if (!PyArg_ParseTuple(args, "OOOnOOOn:parse", &o[0], &o[1], &o[2], &max_rows, &o[3], &o[4], &o[5], &r0))
        return NULL;
    static const char *names[6] = {"buf", "keys", "key_off", "offsets", "data", "start"};
    static const int ndims[6] = {1, 1, 1, 2, 2, 1}, sizes[6] = {1, 1, 8, 4, 1, 8};
    static const int signs[6] = {0, 0, 1, 1, 0, 1}, writes[6] = {0, 0, 0, 1, 1, 1};
    Py_buffer v[6];
    int got = 0;
    PyObject *result = NULL;
    for (; got < 6; got++)
        if (get_array(o[got], &v[got], names[got], ndims[got], sizes[got], signs[got],
                      writes[got]) < 0)
            goto done;
    Args a = {
        .buf = v[0].buf, .keys = v[1].buf, .key_off = v[2].buf, .offsets = v[3].buf, .data = v[4].buf,
        .start = v[5].buf, .n = v[0].shape[0], .nkeys = v[1].shape[0], .orow = v[3].shape[1],
        .drow = v[4].shape[1], .max_rows = max_rows, .r0 = r0, .nk = 0,
    };
    if (v[2].shape[0] < 1 || v[2].shape[0] - 1 > MAX_KEYS) {
        PyErr_Format(PyExc_ValueError, "parse: key_off must hold 1 to %d entries (got %zd)", MAX_KEYS + 1,
                     v[2].shape[0]);
        goto done;
    }
    a.nk = (int)(v[2].shape[0] - 1);
    if (check_room(&a, v[3].shape[0], v[4].shape[0], v[5].shape[0]) < 0)
        goto done;
    int64_t pos[MAX_KEYS];
    Py_ssize_t rows;
    Py_BEGIN_ALLOW_THREADS
    rows = parse_rows(&a, pos);
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(rows);
done:
    while (got-- > 0)
        PyBuffer_Release(&v[got]);
    return result;
}

static PyMethodDef methods[] = {
    {"parse", ysb_parse, METH_VARARGS,
     "parse(buf, keys, key_off, max_rows, offsets, data, start, r0) -> rows or -1\n\n"
     "Parse all-string NDJSON rows: column k's values go to data[k, start[k]:], its Arrow offsets to\n"
     "offsets[k, r0:]. Returns the row count (start advanced), or -1 (start unchanged) when the\n"
     "payload needs the generic parser. Raises TypeError/ValueError for arrays that do not fit."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cp_source.factory._ysb",
    "The factory's all-string NDJSON (YSB) row parser in C (no JIT at start).", -1, methods,
};

PyMODINIT_FUNC PyInit__ysb(void) { return PyModule_Create(&module); }
