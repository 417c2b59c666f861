/*
 * What native_tsc/_tsc.c and native_tsc/_ring.c (one extension, two files) share:
 * the process's virtual TSC domain, so a ring stamps exactly as now() does,
 * and the function that adds the Ring type to the module.
 */
#ifndef CP_TSC_RING_H
#define CP_TSC_RING_H

#include <Python.h>
#include <stdint.h>

typedef struct {
    int on;
    int64_t offset;
    int64_t skew_e12;
} cp_virtual_domain;

/* Defined in _tsc.c; hidden so it never clashes with another module's symbols. */
extern cp_virtual_domain cp_virtual __attribute__((visibility("hidden")));

int cp_ring_add_type(PyObject *module) __attribute__((visibility("hidden")));

#endif
