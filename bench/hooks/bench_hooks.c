/* The benchmarks' native hooks: the module _bench_hooks, built for bench/ only (build.py), never
 * part of the stepscope package.
 *
 * bench/bench_tracer.py measures the function tracer against a floor: a C hook on the same
 * events that does nothing (a profile function on 3.10/3.11, sys.monitoring callbacks on 3.12+),
 * and the cost of a read of the tracer's clock.  clock.c is compiled in from the package's
 * sources, so the reads are the tracer's own ss_ticks(); call _clock_configure with the source
 * stepscope.clock chose before timing them. */
#include "stepscope_native.h"

#include <frameobject.h>

#define SS_LEGACY_PROFILE (PY_VERSION_HEX < 0x030C0000)

#if SS_LEGACY_PROFILE
static int noop_profile_cb(PyObject *obj, PyFrameObject *frame, int what, PyObject *arg) {
    return 0;
}
#endif

/* 3.10/3.11: install (true) or remove (false) a profile function that does nothing, on the calling
 * thread. */
static PyObject *floor_profile(PyObject *mod, PyObject *arg) {
#if SS_LEGACY_PROFILE
    int on = PyObject_IsTrue(arg);
    if (on < 0) {
        return NULL;
    }
    PyEval_SetProfile(on ? noop_profile_cb : NULL, NULL);
    Py_RETURN_NONE;
#else
    PyErr_SetString(PyExc_RuntimeError, "use the sys.monitoring no-op callback on Python 3.12+");
    return NULL;
#endif
}

/* A sys.monitoring callback that does nothing, whatever the event. */
static PyObject *mon_noop(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    Py_RETURN_NONE;
}

/* `n` reads of the tracer's clock in a C loop (what a recorded call pays twice). */
static PyObject *clock_reads(PyObject *mod, PyObject *arg) {
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred()) {
        return NULL;
    }
    uint64_t sum = 0;
    for (long long i = 0; i < n; i++) {
        sum += ss_ticks();
    }
    return PyLong_FromUnsignedLongLong(sum & 1);
}

static PyMethodDef hook_methods[] = {
    {"floor_profile", floor_profile, METH_O,
     "floor_profile(on): install or remove a no-op profile function (3.10/3.11)."},
    {"mon_noop", (PyCFunction)(void (*)(void))mon_noop, METH_FASTCALL,
     "A sys.monitoring callback that does nothing (3.12+)."},
    {"clock_reads", clock_reads, METH_O, "clock_reads(n): read the tracer's clock n times."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef hooks_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_bench_hooks",
    .m_doc = "Native hooks of stepscope's benchmarks (not part of the package).",
    .m_size = -1,
    .m_methods = hook_methods,
};

PyMODINIT_FUNC PyInit__bench_hooks(void) {
    PyObject *module = PyModule_Create(&hooks_module);
    if (module == NULL) {
        return NULL;
    }
    if (ss_clock_init(module) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
