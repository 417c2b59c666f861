/*
 * native_tsc._tsc.Ring: a bounded ring of (TSC, tuple id) pairs that profiling
 * channels log into with one C call; a background Python thread drains it.
 *
 * Every method runs with the GIL held and none releases it, so the GIL orders
 * all writers and the drainer: several threads may log into one ring, and no
 * lock is needed. (A free-threaded build would need one: refused below.)
 *
 * Ring full: log() calls the on_full callable (the channel drains the ring into
 * its blocks, in the calling thread) and stores the pair once there is room.
 * With no callable, or if the ring is still full after FULL_TRIES calls (other
 * threads refilled it meanwhile), the pair is dropped and counted in
 * dropped_full: never a silent loss, never an unbounded wait.
 * An id that is not an int64 integer is counted in not_int64 and not stored.
 * After refuse(f), log() returns f() (which raises the channel's error), also when
 * the refusal came while on_full ran: a pair is stored only by a call that returns.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "tsc_counter.h"
#include "tsc_ring.h"

#ifdef Py_GIL_DISABLED
#error "native_tsc.Ring relies on the GIL to order its writers"
#endif

#define RING_MAX_RECORDS (1LL << 26) /* 1 GiB of pairs: a bound on what a caller may ask for */
#define FULL_TRIES 3

typedef struct {
    PyObject_HEAD
    int64_t *pairs; /* 2 * capacity int64: tsc, id, tsc, id, ... */
    Py_ssize_t capacity; /* records */
    Py_ssize_t head;     /* the oldest record held */
    Py_ssize_t len;      /* records held */
    unsigned long long stored, dropped_full, not_int64, counted;
    PyObject *on_full; /* NULL: a full ring drops and counts */
    PyObject *refusal; /* non-NULL: log() returns refusal() instead of storing */
} Ring;

static inline int64_t ring_stamp(void) {
    return cp_transform(cp_raw_read(), cp_virtual.on, cp_virtual.skew_e12, cp_virtual.offset);
}

static int ring_traverse(Ring *self, visitproc visit, void *arg) {
    Py_VISIT(self->on_full);
    Py_VISIT(self->refusal);
    return 0;
}

static int ring_clear(Ring *self) {
    Py_CLEAR(self->on_full);
    Py_CLEAR(self->refusal);
    return 0;
}

static void ring_dealloc(Ring *self) {
    PyObject_GC_UnTrack(self);
    ring_clear(self);
    PyMem_Free(self->pairs);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int ring_init(Ring *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"capacity", NULL};
    long long capacity;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "L", kwlist, &capacity)) {
        return -1;
    }
    if (capacity < 1 || capacity > RING_MAX_RECORDS) {
        PyErr_Format(PyExc_ValueError, "ring capacity %lld: must be between 1 and 2**26 records", capacity);
        return -1;
    }
    if (self->pairs != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a ring is initialised once");
        return -1;
    }
    self->pairs = PyMem_Calloc((size_t)capacity * 2, sizeof(int64_t));
    if (self->pairs == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->capacity = (Py_ssize_t)capacity;
    return 0;
}

/* Make room in a full ring: 0 when there is room or the pair is to be dropped, -1 on error. */
static int ring_make_room(Ring *self) {
    for (int k = 0; k < FULL_TRIES && self->len == self->capacity && self->on_full != NULL; k++) {
        PyObject *f = self->on_full;
        Py_INCREF(f); /* the callable may clear on_full while it runs */
        PyObject *r = PyObject_CallNoArgs(f);
        Py_DECREF(f);
        if (r == NULL) {
            return -1;
        }
        Py_DECREF(r);
    }
    return 0;
}

static PyObject *ring_log(Ring *self, PyObject *t) {
    if (self->refusal != NULL) {
        return PyObject_CallNoArgs(self->refusal);
    }
    int overflow;
    long long id = PyLong_AsLongLongAndOverflow(t, &overflow);
    if (id == -1 && (overflow || PyErr_Occurred())) {
        if (!overflow && !PyErr_ExceptionMatches(PyExc_TypeError)) {
            return NULL; /* not a refusal of the id (MemoryError, KeyboardInterrupt, ...) */
        }
        PyErr_Clear();
        self->not_int64++;
        Py_RETURN_NONE;
    }
    int64_t tsc = ring_stamp(); /* the call's time, before any draining a full ring needs */
    if (self->len == self->capacity) {
        if (ring_make_room(self) < 0) {
            return NULL;
        }
        if (self->refusal != NULL) { /* refused while on_full ran (the file failed, or closed) */
            return PyObject_CallNoArgs(self->refusal);
        }
        if (self->len == self->capacity) {
            self->dropped_full++;
            Py_RETURN_NONE;
        }
    }
    Py_ssize_t i = self->head + self->len;
    if (i >= self->capacity) {
        i -= self->capacity;
    }
    self->pairs[2 * i] = tsc;
    self->pairs[2 * i + 1] = (int64_t)id;
    self->len++;
    self->stored++;
    Py_RETURN_NONE;
}

static PyObject *ring_count(Ring *self, PyObject *t) {
    self->counted++;
    Py_RETURN_NONE;
}

static PyObject *ring_add(Ring *self, PyObject *arg) {
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "add(n): n must be at least 0");
        return NULL;
    }
    self->counted += (unsigned long long)n;
    Py_RETURN_NONE;
}

static PyObject *ring_take(Ring *self, PyObject *args) {
    long long most = -1;
    if (!PyArg_ParseTuple(args, "|L", &most)) {
        return NULL;
    }
    Py_ssize_t n = self->len;
    if (most >= 0 && most < n) {
        n = (Py_ssize_t)most;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 16);
    if (out == NULL) {
        return NULL;
    }
    char *dst = PyBytes_AS_STRING(out);
    Py_ssize_t first = self->capacity - self->head; /* records before the wrap */
    if (first > n) {
        first = n;
    }
    memcpy(dst, self->pairs + 2 * self->head, (size_t)first * 16);
    memcpy(dst + first * 16, self->pairs, (size_t)(n - first) * 16);
    self->head += n;
    if (self->head >= self->capacity) {
        self->head -= self->capacity;
    }
    self->len -= n;
    return out;
}

static PyObject *ring_counts(Ring *self, PyObject *unused) {
    return Py_BuildValue("(KnKKK)", self->stored, self->len, self->dropped_full, self->not_int64,
                         self->counted);
}

/* Set (or with None clear) one of the ring's callables. */
static PyObject *ring_set_callable(PyObject **slot, PyObject *f) {
    if (f != Py_None && !PyCallable_Check(f)) {
        PyErr_SetString(PyExc_TypeError, "expected a callable or None");
        return NULL;
    }
    PyObject *old = *slot;
    *slot = f == Py_None ? NULL : Py_NewRef(f);
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

static PyObject *ring_set_on_full(Ring *self, PyObject *f) {
    return ring_set_callable(&self->on_full, f);
}

static PyObject *ring_refuse(Ring *self, PyObject *f) {
    return ring_set_callable(&self->refusal, f);
}

static PyObject *ring_get_capacity(Ring *self, void *unused) {
    return PyLong_FromSsize_t(self->capacity);
}

static PyMethodDef ring_methods[] = {
    {"log", (PyCFunction)ring_log, METH_O, "log(t): store (TSC now, t); see the module notes for a full ring."},
    {"count", (PyCFunction)ring_count, METH_O, "count(t): count one call, store nothing (null handler)."},
    {"add", (PyCFunction)ring_add, METH_O, "add(n): count n calls (null handler's batch form)."},
    {"take", (PyCFunction)ring_take, METH_VARARGS,
     "take([most]) -> bytes: the oldest records (all, or at most `most`) as <qq pairs, removed."},
    {"counts", (PyCFunction)ring_counts, METH_NOARGS,
     "counts() -> (stored, held, dropped_full, not_int64, counted), read together."},
    {"set_on_full", (PyCFunction)ring_set_on_full, METH_O, "set_on_full(f or None): called by log() when full."},
    {"refuse", (PyCFunction)ring_refuse, METH_O, "refuse(f or None): log() returns f() instead of storing."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ring_getset[] = {
    {"capacity", (getter)ring_get_capacity, NULL, "records the ring holds at most", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "native_tsc._tsc.Ring",
    .tp_doc = "Ring(capacity): a bounded ring of (TSC, id) pairs filled by log() in one C call.",
    .tp_basicsize = sizeof(Ring),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ring_init,
    .tp_dealloc = (destructor)ring_dealloc,
    .tp_traverse = (traverseproc)ring_traverse,
    .tp_clear = (inquiry)ring_clear,
    .tp_methods = ring_methods,
    .tp_getset = ring_getset,
};

/*
 * narrow_deltas(int64 buffer) -> bytes: u8 width, int64 first value, then the deltas
 * (wrapping, as numpy's diff) in the narrowest of int8/16/32/64 that holds them all:
 * byte for byte what cp_sink.channels.files.narrow_deltas builds with numpy, in two
 * passes and one allocation, with the GIL released (the compression threads run meanwhile).
 */
/* Vectorised loops (gcc's O3 for these two only): they run on whole blocks of ids. */
#define CP_VECTOR __attribute__((optimize("O3")))
#define CP_NARROW_LOOP(T)                                                           \
    for (Py_ssize_t i = 1; i < n; i++) {                                            \
        ((T *)out)[i - 1] = (T)(int64_t)((uint64_t)v[i] - (uint64_t)v[i - 1]);      \
    }

static CP_VECTOR void narrow_write(const int64_t *v, Py_ssize_t n, int width, char *out) {
    switch (width) {
    case 1: CP_NARROW_LOOP(int8_t) break;
    case 2: CP_NARROW_LOOP(int16_t) break;
    case 4: CP_NARROW_LOOP(int32_t) break;
    default: CP_NARROW_LOOP(int64_t) break;
    }
}

static CP_VECTOR int narrow_width(const int64_t *v, Py_ssize_t n) {
    int64_t lo = 0, hi = 0;
    for (Py_ssize_t i = 1; i < n; i++) {
        int64_t d = (int64_t)((uint64_t)v[i] - (uint64_t)v[i - 1]);
        lo = d < lo ? d : lo;
        hi = d > hi ? d : hi;
    }
    if (lo >= INT8_MIN && hi <= INT8_MAX) {
        return 1;
    }
    if (lo >= INT16_MIN && hi <= INT16_MAX) {
        return 2;
    }
    return lo >= INT32_MIN && hi <= INT32_MAX ? 4 : 8;
}

/* The common case (ids logged in order: every delta fits int8) in one pass: write each delta
 * as int8 and OR together what falls outside (d + 128 >= 256 as unsigned); 0 if any did.
 * Branch-free, so it vectorises; on x86-64 an AVX2 clone is picked at load time where the CPU has it. */
#ifdef CP_X86
#define CP_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CP_CLONES
#endif
static CP_VECTOR CP_CLONES int narrow_try_int8(const int64_t *v, Py_ssize_t n, int8_t *out) {
    uint64_t outside = 0;
    for (Py_ssize_t i = 1; i < n; i++) {
        uint64_t d = (uint64_t)v[i] - (uint64_t)v[i - 1];
        out[i - 1] = (int8_t)d;
        outside |= (d + 128) >> 8;
    }
    return outside == 0;
}

/* A bytes object of the encoding at the given width (the body written with the GIL released). */
static PyObject *narrow_bytes(const int64_t *v, Py_ssize_t n, int width) {
    PyObject *out = PyBytes_FromStringAndSize(NULL, 9 + (n > 1 ? (n - 1) * width : 0));
    if (out == NULL) {
        return NULL;
    }
    char *dst = PyBytes_AS_STRING(out);
    int64_t first = n ? v[0] : 0;
    dst[0] = (char)width;
    memcpy(dst + 1, &first, 8); /* little-endian hosts only (x86-64, arm64: see tsc_counter.h) */
    int fits = 1;
    Py_BEGIN_ALLOW_THREADS
    if (width == 1) {
        fits = narrow_try_int8(v, n, (int8_t *)(dst + 9));
    } else {
        narrow_write(v, n, width, dst + 9);
    }
    Py_END_ALLOW_THREADS
    if (!fits) {
        Py_DECREF(out);
        Py_RETURN_NONE; /* the caller measures the width and asks again */
    }
    return out;
}

static PyObject *ring_narrow_deltas(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return NULL;
    }
    const char *f = view.format ? view.format : "B";
    char kind = f[strlen(f) - 1];
    if (view.itemsize != 8 || (kind != 'q' && kind != 'l')) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_TypeError, "narrow_deltas: expected int64 values, got format %s", f);
        return NULL;
    }
    const int64_t *v = (const int64_t *)view.buf;
    Py_ssize_t n = view.len / 8;
    PyObject *out = narrow_bytes(v, n, 1); /* int8 first: one pass when it fits */
    if (out == Py_None) {
        Py_DECREF(out);
        int width;
        Py_BEGIN_ALLOW_THREADS
        width = narrow_width(v, n);
        Py_END_ALLOW_THREADS
        out = narrow_bytes(v, n, width);
    }
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef module_functions[] = {
    {"narrow_deltas", ring_narrow_deltas, METH_O,
     "narrow_deltas(int64 buffer) -> bytes: width, first value, narrowest deltas (GIL released)."},
    {NULL, NULL, 0, NULL},
};

int cp_ring_add_type(PyObject *module) {
    if (PyModule_AddFunctions(module, module_functions) < 0) {
        return -1;
    }
    cp_detect_rdtscp(); /* this file's copy of the flag (see tsc_counter.h) */
    if (PyType_Ready(&RingType) < 0) {
        return -1;
    }
    Py_INCREF(&RingType);
    if (PyModule_AddObject(module, "Ring", (PyObject *)&RingType) < 0) {
        Py_DECREF(&RingType);
        return -1;
    }
    PyModule_AddIntConstant(module, "RING_MAX_RECORDS", RING_MAX_RECORDS);
    return 0;
}
