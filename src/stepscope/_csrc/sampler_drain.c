/* The stack sampler's signal mode, under the GIL (see sampler.h): the engine's rings drained into
 * the columns (busy samples as the handler walked them, idle ticks with the thread's stack now),
 * the engine's thread slots kept up to date, and the watch on code objects freed while a
 * pending sample names them. */
#include "sampler.h"

static int on_busy(void *ctx, int64_t tid, int64_t ts, void *const *codes,
                   const int32_t *positions, int depth, int truncated) {
    Sampler *self = (Sampler *)ctx;
    if ((Py_ssize_t)self->sample_ts.len >= self->max_samples) {
        self->dropped++;
        return 0;
    }
    for (int i = 0; i < depth; i++) {
        /* NULL: the code object was freed before this sample could be drained (see below) */
        if (codes[i] == NULL || Py_TYPE((PyObject *)codes[i]) != &PyCode_Type) {
            self->invalid_codes++;
            return 0;
        }
    }
    int32_t stack = truncated ? sm_intern_stack(self, -1, 0) : -1;
    for (int i = depth - 1; i >= 0 && stack != -2; i--) {
        int32_t fid = sm_intern_frame(self, (PyCodeObject *)codes[i], positions[i]);
        if (fid < 0) {
            return -1;
        }
        stack = sm_intern_stack(self, stack, fid);
    }
    if (stack == -2) {
        return -1;
    }
    return sm_push_sample(self, tid, ts, stack, 0);
}

/* Idle ticks of a thread: its stack now, under the GIL (it was blocked, so it is parked where it
 * blocked), once per tick.  Ticks of a thread that is gone are dropped. */
static int on_idle(void *ctx, int64_t tid, const int64_t *ts, int n) {
    Sampler *self = (Sampler *)ctx;
    PyThreadState *me = PyThreadState_Get();
    PyInterpreterState *interp = PyThreadState_GetInterpreter(me);
    PyThreadState *found = NULL;
    for (PyThreadState *t = PyInterpreterState_ThreadHead(interp); t; t = PyThreadState_Next(t)) {
        if ((int64_t)thread_key(t) == tid) {
            found = t;
            break;
        }
    }
    if (found == NULL) {
        return 0;
    }
    PyFrameObject *frame = PyThreadState_GetFrame(found);
    if (frame == NULL) {
        return 0;
    }
    int32_t stack = sm_stack_of_frame(self, frame);
    if (stack == -2) {
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if ((Py_ssize_t)self->sample_ts.len >= self->max_samples) {
            self->dropped++;
        } else if (sm_push_sample(self, tid, ts[i], stack, 1) < 0) {
            return -1;
        }
    }
    return 0;
}

/* Give every wanted thread but the draining one a slot in the engine. */
void sm_add_threads(Sampler *self) {
    PyInterpreterState *interp = PyThreadState_GetInterpreter(PyThreadState_Get());
    Py_ssize_t refused = 0;
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts; ts = PyThreadState_Next(ts)) {
        uint64_t tid = thread_key(ts);
        if (tid != self->drain_tid && wanted(self, tid) && ss_sig_add_thread((int64_t)tid) < 0) {
            refused++;
        }
    }
    /* the same threads are refused at every pass: keep the most at once, not the sum */
    if (refused > self->no_slot) {
        self->no_slot = refused;
    }
}

static Sampler *watched = NULL; /* the sampler that owns the engine, for the code watcher */

int sm_drain_into(Sampler *self) {
    if (self->draining) {
        return 0;
    }
    self->draining = 1;
    int64_t start = ss_now_ns();
    sm_add_threads(self);
    int rc = ss_sig_drain(self, on_busy, on_idle);
    self->busy_ns += ss_now_ns() - start;
    self->draining = 0;
    return rc;
}

/* -- code objects freed while samples name them ---------------------------------------------
 *
 * The rings hold raw code object pointers from the handler until the next drain (every 10 ms),
 * and the drain keeps a code object alive only from then on.  A code object freed in between
 * (a module's top-level code dies right after the import ran it; exec'd and lambda code dies
 * all the time) would leave a dangling pointer that the drain would read and incref: heap
 * corruption.  So before any code object is freed while signal sampling runs, a pending sample
 * that names it is drained (the drain interns the code object, which takes a reference and so
 * keeps it: the object is resurrected rather than freed, and the samples keep their names).
 * When a drain is already running further up the stack (a collection during the drain freed
 * the code object), the pending samples that name it are dropped instead.  3.12+: a code
 * watcher, which CPython calls in code_dealloc before anything is torn down, with a reference
 * count that a watcher may raise.  3.11 has no code watchers: PyCode_Type's tp_dealloc slot is
 * interposed for the run (code objects have no subtypes and are not collected by the cyclic
 * GC, so every code object is freed through that slot, and resurrecting one needs no more than
 * its reference count). */
#if PY_VERSION_HEX >= 0x030B0000
static void before_code_freed(PyObject *code) {
    Sampler *self = watched;
    if (self == NULL || ss_sig_pending_code(code, 0) == 0) {
        return;
    }
    if (!self->draining) {
#if PY_VERSION_HEX >= 0x030C0000
        PyObject *raised = PyErr_GetRaisedException();
#else
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
#endif
        if (sm_drain_into(self) < 0) {
            PyErr_Clear();
        }
#if PY_VERSION_HEX >= 0x030C0000
        PyErr_SetRaisedException(raised);
#else
        PyErr_Restore(type, value, traceback);
#endif
    }
    /* Left over (a drain further up the stack, or one that failed part way): those samples
     * are dropped by the drain and counted in invalid_codes. */
    ss_sig_pending_code(code, 1);
}
#endif

#if PY_VERSION_HEX >= 0x030C0000
static int watcher_id = -1;

static int on_code_event(PyCodeEvent event, PyCodeObject *code) {
    if (event == PY_CODE_EVENT_DESTROY) {
        before_code_freed((PyObject *)code); /* code_dealloc keeps it if we took a reference */
    }
    return 0;
}
#elif PY_VERSION_HEX >= 0x030B0000
static destructor code_dealloc_original = NULL; /* PyCode_Type's own tp_dealloc */
static int code_guard_in_chain = 0; /* code_dealloc_guard is (or stays) in PyCode_Type's chain */

static void code_dealloc_guard(PyObject *code) {
    if (watched != NULL) {
        Py_SET_REFCNT(code, 1); /* references taken and dropped meanwhile cannot free it twice */
        before_code_freed(code);
        if (Py_REFCNT(code) > 1) { /* the drain kept it: resurrected */
            Py_SET_REFCNT(code, Py_REFCNT(code) - 1);
            return;
        }
        Py_SET_REFCNT(code, 0);
    }
    code_dealloc_original(code);
}
#endif

void sm_watch_codes(Sampler *self) {
    watched = self;
#if PY_VERSION_HEX >= 0x030C0000
    if (watcher_id < 0) {
        watcher_id = PyCode_AddWatcher(on_code_event);
        if (watcher_id < 0) {
            PyErr_Clear(); /* all watcher slots taken: start_signals refuses signal mode */
        }
    }
#elif PY_VERSION_HEX >= 0x030B0000
    if (!code_guard_in_chain) {
        code_dealloc_original = PyCode_Type.tp_dealloc;
        PyCode_Type.tp_dealloc = code_dealloc_guard;
        code_guard_in_chain = 1;
    }
#endif
}

/* 1 when code objects cannot be freed under a pending sample unnoticed. */
int sm_codes_watched(void) {
#if PY_VERSION_HEX >= 0x030C0000
    return watcher_id >= 0;
#else
    return 1;
#endif
}

void sm_unwatch_codes(void) {
    watched = NULL;
#if PY_VERSION_HEX >= 0x030C0000
    if (watcher_id >= 0) {
        if (PyCode_ClearWatcher(watcher_id) < 0) {
            PyErr_Clear();
        }
        watcher_id = -1;
    }
#elif PY_VERSION_HEX >= 0x030B0000
    /* Put the slot back only if it is still ours.  If someone interposed after us, their
     * wrapper calls ours, which stays in the chain for good (inert while `watched` is NULL) and
     * is not installed a second time. */
    if (code_guard_in_chain && PyCode_Type.tp_dealloc == code_dealloc_guard) {
        PyCode_Type.tp_dealloc = code_dealloc_original;
        code_guard_in_chain = 0;
    }
#endif
}

/* In a forked child: the parent's run is not ours (see ss_sig_after_fork_in_child). */
static PyObject *sampler_after_fork_in_child(PyObject *module, PyObject *unused) {
    ss_sig_after_fork_in_child();
    sm_unwatch_codes();
    Py_RETURN_NONE;
}

static PyMethodDef module_functions[] = {
    {"_sampler_after_fork_in_child", sampler_after_fork_in_child, METH_NOARGS,
     "Forget a signal-sampling run inherited from the parent (call in a forked child)."},
    {NULL, NULL, 0, NULL},
};

int sm_drain_add(PyObject *module) {
    return PyModule_AddFunctions(module, module_functions);
}
