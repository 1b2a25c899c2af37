/* The function tracer's session (see tracer.h): configure, start (the frames already running
 * pushed as open), stop (the open frames closed), its counters, clear; and the tracer's entry
 * points on the module. */
#include "tracer.h"

static void session_clear(void) {
    for (uint32_t i = 0; i < ss_tracer.n_interned; i++) {
        Py_XDECREF(ss_tracer.interned[i].obj);
        Py_XDECREF(ss_tracer.interned[i].pin);
    }
    free(ss_tracer.interned);
    free(ss_tracer.slots);
    Chunk *c = ss_tracer.fifo_head;
    while (c) {
        Chunk *next = c->next_global;
        free(c);
        c = next;
    }
    c = ss_tracer.free_chunks;
    while (c) {
        Chunk *next = c->next_global;
        free(c);
        c = next;
    }
    ThreadBuf *tb = ss_tracer.threads;
    while (tb) {
        ThreadBuf *next = tb->next;
        Py_DECREF(tb);
        tb = next;
    }
    Py_XDECREF(ss_tracer.filter);
    Py_XDECREF(ss_tracer.ignore);
    Py_XDECREF(ss_tracer.disable);
    Py_XDECREF(ss_tracer.native_ids);
    Py_XDECREF(ss_tracer.hidden);
    Py_XDECREF(ss_tracer.first_error);
    memset(&ss_tracer, 0, sizeof(ss_tracer));
    tr_forget_thread_cache();
}

static PyObject *py_configure(PyObject *mod, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"max_depth", "min_ticks", "trace_c", "drop_oldest", "budget",
                             "filter", "ignore", "disable", "native_ids", "tsc", "hidden",
                             NULL};
    unsigned int max_depth;
    unsigned long long min_ticks, budget;
    int trace_c, drop_oldest, tsc = 0;
    PyObject *filter, *ignore, *disable, *native_ids, *hidden = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "IKppKOO!OO!|pO:_tracer_configure", kwlist,
                                     &max_depth, &min_ticks, &trace_c, &drop_oldest, &budget,
                                     &filter, &PyTuple_Type, &ignore, &disable, &PyDict_Type,
                                     &native_ids, &tsc, &hidden)) {
        return NULL;
    }
    if (hidden != Py_None && !PyCallable_Check(hidden)) {
        PyErr_SetString(PyExc_TypeError, "hidden must be callable or None");
        return NULL;
    }
    if (ss_tracer.active) {
        PyErr_SetString(PyExc_RuntimeError,
                        "the stepscope function tracer is recording; stop it before configuring");
        return NULL;
    }
    if (budget < 1) {
        PyErr_SetString(PyExc_ValueError, "the event budget must be at least 1");
        return NULL;
    }
    if (filter != Py_None && !PyCallable_Check(filter)) {
        PyErr_SetString(PyExc_TypeError, "filter must be callable or None");
        return NULL;
    }
    session_clear();
    ss_tracer.max_depth = max_depth > MAX_RECORD_DEPTH ? MAX_RECORD_DEPTH : max_depth;
    ss_tracer.min_ticks = min_ticks;
    ss_tracer.trace_c = trace_c;
    ss_tracer.tsc = tsc && SS_INLINE_TSC;
    ss_tracer.drop_oldest = drop_oldest;
    ss_tracer.budget = budget;
    uint64_t cap = budget / 8;
    ss_tracer.chunk_cap = (uint32_t)(cap < 1 ? 1 : (cap > 8192 ? 8192 : cap));
    ss_tracer.filter = filter == Py_None ? NULL : Py_NewRef(filter);
    ss_tracer.ignore = Py_NewRef(ignore);
    ss_tracer.disable = Py_NewRef(disable);
    ss_tracer.native_ids = Py_NewRef(native_ids);
    ss_tracer.hidden = hidden == Py_None ? NULL : Py_NewRef(hidden);
    if (tr_slots_grow() < 0) {
        session_clear();
        return PyErr_NoMemory();
    }
    ss_tracer.configured = 1;
    Py_RETURN_NONE;
}

/* Push the frames already running on every thread, outermost first, as open at the start. */
static int snapshot_threads(void) {
    PyInterpreterState *interp = PyInterpreterState_Get();
    PyObject *frames = PyList_New(0);
    if (frames == NULL) {
        return -1;
    }
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts;
         ts = PyThreadState_Next(ts)) {
        ThreadBuf *tb = tr_thread_for(ts);
        if (tb == NULL) {
            tb = tr_thread_new(ts, tr_native_id_of(ts));
            if (tb == NULL) {
                Py_DECREF(frames);
                PyErr_NoMemory();
                return -1;
            }
        }
        if (tb->off) {
            continue;
        }
        if (PyList_SetSlice(frames, 0, PyList_GET_SIZE(frames), NULL) < 0) {
            Py_DECREF(frames);
            return -1;
        }
        PyFrameObject *f = PyThreadState_GetFrame(ts);
        while (f != NULL) {
            if (PyList_Append(frames, (PyObject *)f) < 0) {
                Py_DECREF(f);
                Py_DECREF(frames);
                return -1;
            }
            PyFrameObject *back = PyFrame_GetBack(f);
            Py_DECREF(f);
            f = back;
        }
        for (Py_ssize_t i = PyList_GET_SIZE(frames); i-- > 0;) {
            PyObject *frame = PyList_GET_ITEM(frames, i);
            PyCodeObject *code = PyFrame_GetCode((PyFrameObject *)frame);
            Slot *s = tr_intern_code((PyObject *)code);
            if (s != NULL && s->include) {
                const void *key = ss_tracer.mode == MODE_PROFILE ? (const void *)frame
                                                                 : (const void *)code;
                tr_push_open_frame(tb, key, s->id - 1);
            }
            Py_DECREF(code);
        }
    }
    Py_DECREF(frames);
    return 0;
}

static PyObject *py_start(PyObject *mod, PyObject *arg) {
    const char *mode = PyUnicode_AsUTF8(arg);
    if (mode == NULL) {
        return NULL;
    }
    if (!ss_tracer.configured) {
        PyErr_SetString(PyExc_RuntimeError, "configure the function tracer before starting it");
        return NULL;
    }
    if (ss_tracer.active) {
        PyErr_SetString(PyExc_RuntimeError, "the stepscope function tracer is already recording");
        return NULL;
    }
    if (strcmp(mode, "monitoring") == 0) {
        ss_tracer.mode = MODE_MONITORING;
    } else if (strcmp(mode, "profile") == 0 && SS_LEGACY_PROFILE) {
        ss_tracer.mode = MODE_PROFILE;
    } else {
        PyErr_Format(PyExc_ValueError, "unsupported tracer mode %R on this Python", arg);
        return NULL;
    }
    ss_tracer.start_ticks = now_ticks();
    if (snapshot_threads() < 0) {
        return NULL;
    }
#if SS_LEGACY_PROFILE
    if (ss_tracer.mode == MODE_PROFILE) {
        for (ThreadBuf *tb = ss_tracer.threads; tb; tb = tb->next) {
            if (tr_install_profile(tb, tb->tstate, 1) < 0) {
                tr_uninstall_profiles();
                return NULL;
            }
        }
    }
#endif
    ss_tracer.active = 1;
    Py_RETURN_NONE;
}

static PyObject *stats_dict(void) {
    const Session *t = &ss_tracer;
    return Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:I,s:I,s:K,s:K,s:K,s:K,s:O,s:I}", "events", t->kept, "dropped",
        t->dropped, "chunk_bytes", t->chunk_bytes, "peak_chunk_bytes", t->peak_chunk_bytes,
        "budget", t->budget, "threads", t->n_threads, "interned", t->n_interned, "unbalanced",
        t->unbalanced, "lost", t->lost, "displaced", t->displaced, "filter_errors",
        t->filter_errors, "first_filter_error", t->first_error ? t->first_error : Py_None,
        "record_bytes", (unsigned int)sizeof(Record));
}

static PyObject *py_stop(PyObject *mod, PyObject *unused) {
    if (!ss_tracer.active) {
        PyErr_SetString(PyExc_RuntimeError, "the stepscope function tracer is not recording");
        return NULL;
    }
    ss_tracer.end_ticks = now_ticks();
#if SS_LEGACY_PROFILE
    if (ss_tracer.mode == MODE_PROFILE) {
        tr_uninstall_profiles();
    }
#endif
    ss_tracer.active = 0;
    for (ThreadBuf *tb = ss_tracer.threads; tb; tb = tb->next) {
        tr_close_frames(tb, ss_tracer.end_ticks);
    }
    return stats_dict();
}

static PyObject *py_stats(PyObject *mod, PyObject *unused) {
    return stats_dict();
}

/* Interned targets by id: code objects and C-function names; None for excluded ones. */
static PyObject *py_interned(PyObject *mod, PyObject *unused) {
    PyObject *out = PyList_New(ss_tracer.n_interned);
    if (out == NULL) {
        return NULL;
    }
    for (uint32_t i = 0; i < ss_tracer.n_interned; i++) {
        PyObject *v = ss_tracer.interned[i].include ? ss_tracer.interned[i].obj : Py_None;
        PyList_SET_ITEM(out, i, Py_NewRef(v));
    }
    return out;
}

static PyObject *py_clear(PyObject *mod, PyObject *unused) {
    if (ss_tracer.active) {
        PyErr_SetString(PyExc_RuntimeError, "stop the function tracer before clearing it");
        return NULL;
    }
    session_clear();
    Py_RETURN_NONE;
}

static PyObject *py_active(PyObject *mod, PyObject *unused) {
    return PyBool_FromLong(ss_tracer.active);
}

static PyMethodDef tracer_methods[] = {
    {"_tracer_configure", (PyCFunction)(void (*)(void))py_configure,
     METH_VARARGS | METH_KEYWORDS, "Set the tracer's filters and budget for the next window."},
    {"_tracer_start", py_start, METH_O,
     "Start recording ('monitoring' on 3.12+, 'profile' on 3.10/3.11)."},
    {"_tracer_stop", py_stop, METH_NOARGS, "Stop recording; closes open frames; returns stats."},
    {"_tracer_stats", py_stats, METH_NOARGS, "Counters of the current session."},
    {"_tracer_interned", py_interned, METH_NOARGS, "Interned code objects / C names by id."},
    {"_tracer_clear", py_clear, METH_NOARGS, "Free every buffer and interned reference."},
    {"_tracer_active", py_active, METH_NOARGS, "Whether the tracer is recording."},
    {NULL, NULL, 0, NULL},
};

int ss_tracer_init(PyObject *module) {
    if (PyModule_AddIntConstant(module, "TRACER_RECORD_BYTES", (long)sizeof(Record)) < 0) {
        return -1;
    }
    if (PyModule_AddFunctions(module, tracer_methods) < 0 || tr_events_add(module) < 0) {
        return -1;
    }
    return tr_export_add(module);
}
