/* record_function in C: a context manager that costs almost nothing when no window is recording.
 *
 * While a window records, each completed span is appended to the window's sink list as a tuple
 * (name, args, start_ns, end_ns, native_thread_id).  Entered spans are kept on an intrusive list
 * so the window can close the ones still open when it stops.  A generation number ties a span to
 * the window it started in: a span entered in one window and left in another is not recorded.
 * Everything runs with the GIL held.  Twin: stepscope.collectors.annotations.PyRecordFunction. */
#include "stepscope_native.h"

#include "pythread.h"

typedef struct RecordFunction {
    PyObject_HEAD
    PyObject *name;
    PyObject *args;
    int64_t start_ns;
    uint64_t generation;
    unsigned long thread_id;
    struct RecordFunction *prev_open;
    struct RecordFunction *next_open;
    int is_open;
    PyObject *bridge_handle; /* torch's record_function while torch records, else NULL */
} RecordFunction;

static int recording = 0;
static uint64_t generation = 0;
static PyObject *sink = NULL;       /* list of span tuples, owned while recording */
static Py_ssize_t max_spans = 0;    /* 0 = unbounded */
static Py_ssize_t dropped = 0;
static RecordFunction open_head = {0};  /* sentinel of the open-span list */
static PyObject *decorate = NULL;   /* Python callable(name, args, fn) -> wrapper */
static PyObject *bridge_enter = NULL; /* callable(name, args) -> handle, set while torch records */
static PyObject *bridge_exit = NULL;  /* callable(handle) */
static Py_ssize_t bridge_errors = 0;

/* A bridge failure must not break the user's block: count it and switch the bridge off. */
static void bridge_failed(void) {
    PyErr_Clear();
    bridge_errors++;
    Py_CLEAR(bridge_enter);
    Py_CLEAR(bridge_exit);
}

/* gettid() is a system call: remember it per thread. */
static unsigned long native_thread_id(void) {
    static _Thread_local unsigned long cached = 0;
    if (cached == 0) {
        cached = PyThread_get_thread_native_id();
    }
    return cached;
}

static void unlink_open(RecordFunction *self) {
    if (!self->is_open) {
        return;
    }
    self->prev_open->next_open = self->next_open;
    self->next_open->prev_open = self->prev_open;
    self->prev_open = self->next_open = NULL;
    self->is_open = 0;
    Py_DECREF(self); /* the open list held a reference */
}

static PyObject *step_prefix(void) {
    static PyObject *prefix = NULL; /* interned once; STEP_SPAN in collectors/annotations.py */
    if (prefix == NULL) {
        prefix = PyUnicode_InternFromString("ProfilerStep#");
    }
    return prefix;
}

static PyObject *own_work_name(void) {
    static PyObject *own = NULL; /* interned once; OWN_WORK_FRAME in trace/names.py */
    if (own == NULL) {
        own = PyUnicode_InternFromString("[stepscope own work]");
    }
    return own;
}

/* Spans kept over the budget: the step spans (one per step: without them no step is known)
   and stepscope's own work between steps (without it that time is the self time of the hook
   it ran in). */
static int is_kept_over_budget(PyObject *name) {
    PyObject *prefix = step_prefix();
    PyObject *own = own_work_name();
    if (prefix == NULL || own == NULL || !PyUnicode_Check(name)) {
        PyErr_Clear();
        return 0;
    }
    Py_ssize_t found = PyUnicode_Tailmatch(name, prefix, 0, PY_SSIZE_T_MAX, -1);
    if (found < 0) {
        PyErr_Clear();
        return 0;
    }
    if (found == 1) {
        return 1;
    }
    int same = PyUnicode_Compare(name, own);
    if (same == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return same == 0;
}

static int append_span(PyObject *name, PyObject *args, int64_t start, int64_t end,
                       unsigned long tid) {
    if (max_spans > 0 && PyList_GET_SIZE(sink) >= max_spans && !is_kept_over_budget(name)) {
        dropped++;
        return 0;
    }
    PyObject *item = Py_BuildValue("(OOLLk)", name, args, (long long)start, (long long)end, tid);
    if (item == NULL) {
        return -1;
    }
    int rc = PyList_Append(sink, item);
    Py_DECREF(item);
    return rc;
}

static int rf_init(RecordFunction *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"name", "args", NULL};
    PyObject *name, *span_args = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:record_function", kwlist, &name, &span_args)) {
        return -1;
    }
    if (!PyUnicode_Check(name)) {
        PyErr_Format(PyExc_TypeError, "record_function name must be a str, got %.80s",
                     Py_TYPE(name)->tp_name);
        return -1;
    }
    Py_INCREF(name);
    Py_XSETREF(self->name, name);
    Py_INCREF(span_args);
    Py_XSETREF(self->args, span_args);
    return 0;
}

static void rf_dealloc(RecordFunction *self) {
    Py_XDECREF(self->bridge_handle);
    Py_XDECREF(self->name);
    Py_XDECREF(self->args);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *rf_enter(RecordFunction *self, PyObject *unused) {
    if (recording && !self->is_open) {
        self->start_ns = ss_now_ns();
        self->generation = generation;
        self->thread_id = native_thread_id();
        /* push at the tail of the open list */
        self->prev_open = open_head.prev_open;
        self->next_open = &open_head;
        open_head.prev_open->next_open = self;
        open_head.prev_open = self;
        self->is_open = 1;
        Py_INCREF(self);
    }
    /* Another profiler records (torch's, see collectors/torch.py): open its record_function
       too, whether or not a stepscope window records. */
    if (bridge_enter != NULL && self->bridge_handle == NULL) {
        PyObject *bridge_args[2] = {self->name, self->args != NULL ? self->args : Py_None};
        self->bridge_handle = PyObject_Vectorcall(bridge_enter, bridge_args, 2, NULL);
        if (self->bridge_handle == NULL) {
            bridge_failed();
        }
    }
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *rf_exit(RecordFunction *self, PyObject *const *args, Py_ssize_t nargs) {
    if (self->bridge_handle != NULL) {
        PyObject *handle = self->bridge_handle;
        self->bridge_handle = NULL;
        if (bridge_exit != NULL) {
            PyObject *r = PyObject_CallOneArg(bridge_exit, handle);
            if (r == NULL) {
                bridge_failed();
            }
            Py_XDECREF(r);
        }
        Py_DECREF(handle);
    }
    if (self->is_open) {
        int64_t end = ss_now_ns();
        int record = recording && self->generation == generation;
        PyObject *name = self->name, *span_args = self->args;
        unsigned long tid = self->thread_id;
        int64_t start = self->start_ns;
        Py_INCREF(self);
        unlink_open(self);
        int rc = record ? append_span(name, span_args, start, end, tid) : 0;
        Py_DECREF(self);
        if (rc < 0) {
            return NULL;
        }
    }
    Py_RETURN_FALSE;
}

static PyObject *rf_call(RecordFunction *self, PyObject *args, PyObject *kwds) {
    PyObject *fn;
    if (kwds != NULL && PyDict_GET_SIZE(kwds) != 0) {
        PyErr_SetString(PyExc_TypeError, "record_function used as a decorator takes one function");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O:record_function", &fn)) {
        return NULL;
    }
    if (decorate == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "stepscope annotations are not initialised");
        return NULL;
    }
    return PyObject_CallFunctionObjArgs(decorate, self->name, self->args, fn, NULL);
}

static PyObject *rf_get_name(RecordFunction *self, void *closure) {
    Py_INCREF(self->name);
    return self->name;
}

static PyObject *rf_get_args(RecordFunction *self, void *closure) {
    Py_INCREF(self->args);
    return self->args;
}

static PyMethodDef rf_methods[] = {
    {"__enter__", (PyCFunction)rf_enter, METH_NOARGS, "Open the span (recorded if a window is on)."},
    {"__exit__", (PyCFunction)(void (*)(void))rf_exit, METH_FASTCALL, "Close the span."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef rf_getset[] = {
    {"name", (getter)rf_get_name, NULL, "Span name.", NULL},
    {"args", (getter)rf_get_args, NULL, "Span args (or None).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RecordFunctionType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "stepscope._native.RecordFunction",
    .tp_basicsize = sizeof(RecordFunction),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "record_function(name, args=None): a span around a block (context manager/decorator).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)rf_init,
    .tp_dealloc = (destructor)rf_dealloc,
    .tp_call = (ternaryfunc)rf_call,
    .tp_methods = rf_methods,
    .tp_getset = rf_getset,
};

static PyObject *py_start(PyObject *self, PyObject *args) {
    PyObject *list;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "O!n", &PyList_Type, &list, &limit)) {
        return NULL;
    }
    if (recording) {
        PyErr_SetString(PyExc_RuntimeError, "annotations are already recording a window");
        return NULL;
    }
    Py_INCREF(list);
    Py_XSETREF(sink, list);
    max_spans = limit;
    dropped = 0;
    generation++;
    recording = 1;
    Py_RETURN_NONE;
}

/* Stops recording: closes spans still open (appending them with end = now) and returns
 * (number of spans closed at the window end, number dropped over the budget). */
static PyObject *py_stop(PyObject *self, PyObject *unused) {
    if (!recording) {
        return Py_BuildValue("(nn)", (Py_ssize_t)0, (Py_ssize_t)0);
    }
    int64_t end = ss_now_ns();
    Py_ssize_t closed = 0;
    RecordFunction *rf = open_head.next_open;
    while (rf != &open_head) {
        RecordFunction *next = rf->next_open;
        if (rf->generation == generation) {
            PyObject *flagged = PyDict_New();
            if (flagged == NULL) {
                return NULL;
            }
            if (rf->args != Py_None && PyDict_Check(rf->args) &&
                PyDict_Update(flagged, rf->args) < 0) {
                Py_DECREF(flagged);
                return NULL;
            }
            if (PyDict_SetItemString(flagged, "stepscope.open_at_window_end", Py_True) < 0 ||
                append_span(rf->name, flagged, rf->start_ns, end, rf->thread_id) < 0) {
                Py_DECREF(flagged);
                return NULL;
            }
            Py_DECREF(flagged);
            closed++;
        }
        /* Spans left open are forgotten: their later __exit__ records nothing. */
        unlink_open(rf);
        rf = next;
    }
    recording = 0;
    Py_CLEAR(sink);
    return Py_BuildValue("(nn)", closed, dropped);
}

/* Appends an already-timed span to the window being recorded (no-op when none is). */
static PyObject *py_emit(PyObject *self, PyObject *args) {
    PyObject *name, *span_args;
    long long start, end;
    if (!PyArg_ParseTuple(args, "UOLL", &name, &span_args, &start, &end)) {
        return NULL;
    }
    if (!recording) {
        Py_RETURN_FALSE;
    }
    if (append_span(name, span_args, start, end, native_thread_id()) < 0) {
        return NULL;
    }
    Py_RETURN_TRUE;
}

static PyObject *py_is_recording(PyObject *self, PyObject *unused) {
    return PyBool_FromLong(recording);
}

static PyObject *py_set_bridge(PyObject *self, PyObject *args) {
    PyObject *enter, *exit_fn;
    if (!PyArg_ParseTuple(args, "OO", &enter, &exit_fn)) {
        return NULL;
    }
    if (enter == Py_None || exit_fn == Py_None) {
        Py_CLEAR(bridge_enter);
        Py_CLEAR(bridge_exit);
    } else {
        Py_INCREF(enter);
        Py_XSETREF(bridge_enter, enter);
        Py_INCREF(exit_fn);
        Py_XSETREF(bridge_exit, exit_fn);
    }
    Py_ssize_t errors = bridge_errors;
    bridge_errors = 0;
    return PyLong_FromSsize_t(errors);
}

static PyObject *py_set_decorator(PyObject *self, PyObject *fn) {
    Py_INCREF(fn);
    Py_XSETREF(decorate, fn);
    Py_RETURN_NONE;
}

static PyMethodDef annotation_methods[] = {
    {"_annotations_start", py_start, METH_VARARGS,
     "_annotations_start(sink: list, max_spans: int): record completed spans into sink."},
    {"_annotations_stop", py_stop, METH_NOARGS,
     "Stop recording; returns (closed_at_window_end, dropped)."},
    {"_annotations_recording", py_is_recording, METH_NOARGS, "Whether a window is recording."},
    {"_annotations_emit", py_emit, METH_VARARGS,
     "_annotations_emit(name, args, start_ns, end_ns): add a timed span to the recording window "
     "(on the calling thread); returns whether a window took it."},
    {"_annotations_set_bridge", py_set_bridge, METH_VARARGS,
     "_annotations_set_bridge(enter, exit) (or None, None): also open another profiler's "
     "record_function for each recorded block; returns the bridge errors since the last call."},
    {"_annotations_set_decorator", py_set_decorator, METH_O,
     "Set the Python helper used when record_function decorates a function."},
    {NULL, NULL, 0, NULL},
};

int ss_annotations_init(PyObject *module) {
    open_head.prev_open = open_head.next_open = &open_head;
    if (PyType_Ready(&RecordFunctionType) < 0) {
        return -1;
    }
    Py_INCREF(&RecordFunctionType);
    if (PyModule_AddObject(module, "RecordFunction", (PyObject *)&RecordFunctionType) < 0) {
        Py_DECREF(&RecordFunctionType);
        return -1;
    }
    return PyModule_AddFunctions(module, annotation_methods);
}
