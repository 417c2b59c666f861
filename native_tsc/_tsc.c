/*
 * native_tsc._tsc: read the CPU timestamp counter from Python.
 *
 * The counter read and the transform live in tsc_counter.h. A process may
 * carry a virtual TSC domain (a known affine transform of the real counter):
 * it exists to test cross-node translation on one machine against ground truth.
 * The Ring type (profiling channels' log() in one C call) lives in _ring.c.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <time.h>
#include <sched.h>

#include "tsc_counter.h"
#include "tsc_ring.h"

/* The virtual domain; _ring.c reads it too (one extension, two files). */
cp_virtual_domain cp_virtual = {0, 0, 0};


static inline uint64_t raw_read_cpu(unsigned int *cpu) {
#ifdef CP_X86
    if (cp_have_rdtscp) {
        unsigned int aux;
        uint64_t t = __rdtscp(&aux);
        /* Linux stores (numa node << 12) | cpu in TSC_AUX. */
        *cpu = aux & 0xfff;
        return t;
    }
#endif
    int c = sched_getcpu();
    *cpu = c < 0 ? 0 : (unsigned int)c;
    return cp_raw_read();
}

static inline int64_t transform(uint64_t raw) {
    return cp_transform(raw, cp_virtual.on, cp_virtual.skew_e12, cp_virtual.offset);
}

static PyObject *tsc_now(PyObject *self, PyObject *unused) {
    return PyLong_FromLongLong(transform(cp_raw_read()));
}

static PyObject *tsc_now_cpu(PyObject *self, PyObject *unused) {
    unsigned int cpu;
    uint64_t t = raw_read_cpu(&cpu);
    return Py_BuildValue("(LI)", (long long)transform(t), cpu);
}

static PyObject *tsc_raw(PyObject *self, PyObject *unused) {
    return PyLong_FromUnsignedLongLong(cp_raw_read());
}

static PyObject *tsc_clock_pair(PyObject *self, PyObject *unused) {
    struct timespec ts;
    uint64_t a = cp_raw_read();
    clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
    uint64_t b = cp_raw_read();
    uint64_t mid = a + (b - a) / 2;
    long long ns = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    return Py_BuildValue("(LLL)", (long long)transform(mid), ns, (long long)(b - a));
}

static PyObject *tsc_transform(PyObject *self, PyObject *arg) {
    long long raw = PyLong_AsLongLong(arg);
    if (raw == -1 && PyErr_Occurred()) {
        return NULL;
    }
    return PyLong_FromLongLong(transform((uint64_t)raw));
}

static PyObject *tsc_set_transform(PyObject *self, PyObject *args) {
    long long skew_e12, offset;
    if (!PyArg_ParseTuple(args, "LL", &skew_e12, &offset)) {
        return NULL;
    }
    if (skew_e12 <= -1000000000000LL) {
        PyErr_SetString(PyExc_ValueError, "skew must be above -1e6 ppm");
        return NULL;
    }
    cp_virtual.skew_e12 = skew_e12;
    cp_virtual.offset = offset;
    cp_virtual.on = 1;
    Py_RETURN_NONE;
}

static PyObject *tsc_clear_transform(PyObject *self, PyObject *unused) {
    cp_virtual.on = 0;
    cp_virtual.skew_e12 = 0;
    cp_virtual.offset = 0;
    Py_RETURN_NONE;
}

static PyObject *tsc_cpuid_invariant(PyObject *self, PyObject *unused) {
#ifdef CP_X86
    unsigned int eax, ebx, ecx, edx;
    if (!__get_cpuid(0x80000000, &eax, &ebx, &ecx, &edx) || eax < 0x80000007) {
        Py_RETURN_FALSE;
    }
    __cpuid(0x80000007, eax, ebx, ecx, edx);
    return PyBool_FromLong((edx >> 8) & 1);
#else
    /* The arm64 generic timer is architecturally constant-rate. */
    Py_RETURN_TRUE;
#endif
}

static PyObject *tsc_cpuid_hz(PyObject *self, PyObject *unused) {
#ifdef CP_X86
    unsigned int eax, ebx, ecx, edx;
    if (__get_cpuid_max(0, NULL) < 0x15) {
        return PyLong_FromLong(0);
    }
    __cpuid(0x15, eax, ebx, ecx, edx);
    if (eax == 0 || ebx == 0 || ecx == 0) {
        return PyLong_FromLong(0);
    }
    return PyLong_FromUnsignedLongLong((unsigned long long)ecx * ebx / eax);
#else
    uint64_t f;
    __asm__ __volatile__("mrs %0, cntfrq_el0" : "=r"(f));
    return PyLong_FromUnsignedLongLong(f);
#endif
}

static PyMethodDef methods[] = {
    {"now", tsc_now, METH_NOARGS, "now() -> int: the TSC (virtual domain applied)."},
    {"now_cpu", tsc_now_cpu, METH_NOARGS, "now_cpu() -> (tsc, cpu)."},
    {"raw", tsc_raw, METH_NOARGS, "raw() -> int: the TSC with no virtual transform."},
    {"clock_pair", tsc_clock_pair, METH_NOARGS,
     "clock_pair() -> (tsc, monotonic_raw_ns, gap_cycles) read back to back."},
    {"transform", tsc_transform, METH_O, "transform(raw) -> int: apply the virtual transform."},
    {"set_transform", tsc_set_transform, METH_VARARGS,
     "set_transform(skew_e12, offset): virtual domain for this process."},
    {"clear_transform", tsc_clear_transform, METH_NOARGS, "Remove the virtual transform."},
    {"cpuid_invariant", tsc_cpuid_invariant, METH_NOARGS,
     "CPUID 0x80000007 EDX bit 8 (invariant TSC)."},
    {"cpuid_hz", tsc_cpuid_hz, METH_NOARGS,
     "TSC frequency from CPUID 0x15 (CNTFRQ_EL0 on arm64), 0 when not given."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_tsc", "Timestamp-counter reads in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__tsc(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    cp_detect_rdtscp();
    if (cp_ring_add_type(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#ifdef CP_X86
    PyModule_AddStringConstant(m, "BACKEND", cp_have_rdtscp ? "rdtscp" : "lfence-rdtsc");
#else
    PyModule_AddStringConstant(m, "BACKEND", "cntvct");
#endif
    return m;
}
