/* Shared declarations of the stepscope._native extension: each part registers itself on the module. */
#ifndef STEPSCOPE_NATIVE_H
#define STEPSCOPE_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* Clock: raw ticks (TSC or CLOCK_MONOTONIC ns) and their conversion to monotonic ns. */
uint64_t ss_ticks(void);
int64_t ss_ticks_to_ns(uint64_t ticks);
int64_t ss_now_ns(void);

/* Per-part initialisers, called from module.c; each returns 0 or -1 with an exception set. */
int ss_clock_init(PyObject *module);
int ss_chrome_writer_init(PyObject *module);
int ss_annotations_init(PyObject *module);
int ss_tracer_init(PyObject *module);
int ss_sampler_init(PyObject *module);
int ss_chrome_columns_init(PyObject *module);
int ss_chrome_args_init(PyObject *module);
int ss_chrome_scanner_init(PyObject *module);
int ss_step_times_init(PyObject *module);
int ss_alloc_hook_init(PyObject *module);
int ss_span_nesting_init(PyObject *module);
int ss_compact_columns_init(PyObject *module);
int ss_compact_args_init(PyObject *module);
int ss_compact_splice_init(PyObject *module);

#endif
