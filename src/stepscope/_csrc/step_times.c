/* StepRing: every step's start and end in a bounded ring, one clock reading per call
 * (the C half of stepscope/step_times.py; its twin is PyStepRing there). */
#include "stepscope_native.h"

typedef struct {
    PyObject_HEAD
    Py_ssize_t capacity;
    int64_t *starts;
    int64_t *ends;
    uint8_t *kinds;
    long long count; /* steps ended so far (the ring keeps the last `capacity`) */
    Py_ssize_t slot; /* where the open or next step goes */
    int open;
} StepRing;

static int ring_init(StepRing *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"capacity", NULL};
    Py_ssize_t capacity = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n", keywords, &capacity)) {
        return -1;
    }
    if (capacity < 1) {
        PyErr_Format(PyExc_ValueError, "capacity must be 1 or more, got %zd", capacity);
        return -1;
    }
    PyMem_Free(self->starts);
    PyMem_Free(self->ends);
    PyMem_Free(self->kinds);
    self->starts = PyMem_Calloc((size_t)capacity, sizeof(int64_t));
    self->ends = PyMem_Calloc((size_t)capacity, sizeof(int64_t));
    self->kinds = PyMem_Calloc((size_t)capacity, 1);
    if (self->starts == NULL || self->ends == NULL || self->kinds == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->capacity = capacity;
    self->count = 0;
    self->slot = 0;
    self->open = 0;
    return 0;
}

static void ring_dealloc(StepRing *self) {
    PyMem_Free(self->starts);
    PyMem_Free(self->ends);
    PyMem_Free(self->kinds);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *ring_begin(StepRing *self, PyObject *kind_obj) {
    long kind = PyLong_AsLong(kind_obj);
    if (kind == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (self->capacity < 1) {
        PyErr_SetString(PyExc_RuntimeError, "StepRing was not initialised");
        return NULL;
    }
    self->kinds[self->slot] = (uint8_t)(kind < 0 ? 0 : kind < 2 ? kind : 2);
    self->open = 1;
    self->starts[self->slot] = ss_now_ns();
    Py_RETURN_NONE;
}

static PyObject *ring_end(StepRing *self, PyObject *Py_UNUSED(ignored)) {
    if (self->open) {
        self->ends[self->slot] = ss_now_ns();
        self->open = 0;
        self->count += 1;
        self->slot = (Py_ssize_t)(self->count % self->capacity);
    }
    Py_RETURN_NONE;
}

static PyObject *ring_export(StepRing *self, PyObject *Py_UNUSED(ignored)) {
    Py_ssize_t n = self->capacity;
    return Py_BuildValue("(y#y#y#L)", (const char *)self->starts, n * (Py_ssize_t)sizeof(int64_t),
                         (const char *)self->ends, n * (Py_ssize_t)sizeof(int64_t),
                         (const char *)self->kinds, n, self->count);
}

static PyMethodDef ring_methods[] = {
    {"begin", (PyCFunction)ring_begin, METH_O, "begin(kind): a step starts now (kind 0, 1, 2+)."},
    {"end", (PyCFunction)ring_end, METH_NOARGS, "end(): the open step ends now (none open: nothing)."},
    {"export", (PyCFunction)ring_export, METH_NOARGS,
     "export(): (starts, ends, kinds, count): the ring's int64 ns and uint8 kind columns as bytes, "
     "and the steps ended so far."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject StepRingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stepscope._native.StepRing",
    .tp_basicsize = sizeof(StepRing),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "StepRing(capacity): every step's start and end (monotonic ns) and kind, the last "
              "`capacity` steps kept.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ring_init,
    .tp_dealloc = (destructor)ring_dealloc,
    .tp_methods = ring_methods,
};

int ss_step_times_init(PyObject *module) {
    if (PyType_Ready(&StepRingType) < 0) {
        return -1;
    }
    Py_INCREF(&StepRingType);
    if (PyModule_AddObject(module, "StepRing", (PyObject *)&StepRingType) < 0) {
        Py_DECREF(&StepRingType);
        return -1;
    }
    return 0;
}
