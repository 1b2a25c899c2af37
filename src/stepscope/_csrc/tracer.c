/* The function tracer's event path (see tracer.h): both ways in (sys.monitoring callbacks, the
 * 3.10/3.11 profile function), the per-thread stacks of open frames and the record buffers they
 * close into.  Kept in one file so the hot helpers inline into the callbacks. */
#include "tracer.h"

Session ss_tracer;

/* The (method def, receiver, module) of a C callable worth tracing, or 0 for anything else. */
static int c_callable_parts(PyObject *callable, PyObject *arg0, PyMethodDef **ml,
                            PyObject **self, PyObject **module) {
    if (PyCFunction_Check(callable)) {
        PyCFunctionObject *f = (PyCFunctionObject *)callable;
        *ml = f->m_ml;
        *self = f->m_self;
        *module = f->m_module;
        return 1;
    }
    if (Py_IS_TYPE(callable, &PyMethodDescr_Type)) {
        PyMethodDescrObject *d = (PyMethodDescrObject *)callable;
        *ml = d->d_method;
        *self = (arg0 != NULL && PyObject_TypeCheck(arg0, d->d_common.d_type)) ? arg0 : NULL;
        *module = NULL;
        if (*self == NULL) {
            return 0;
        }
        return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Record buffers                                                                             */

static Chunk *chunk_new(ThreadBuf *tb) {
    Chunk *c = ss_tracer.free_chunks;
    if (c != NULL) {
        ss_tracer.free_chunks = c->next_global;
    } else {
        size_t bytes = sizeof(Chunk) + (size_t)ss_tracer.chunk_cap * sizeof(Record);
        c = malloc(bytes);
        if (c == NULL) {
            return NULL;
        }
        ss_tracer.chunk_bytes += bytes;
        if (ss_tracer.chunk_bytes > ss_tracer.peak_chunk_bytes) {
            ss_tracer.peak_chunk_bytes = ss_tracer.chunk_bytes;
        }
    }
    c->next_global = NULL;
    c->next_thread = NULL;
    c->owner = tb;
    c->count = 0;
    if (ss_tracer.fifo_tail) {
        ss_tracer.fifo_tail->next_global = c;
    } else {
        ss_tracer.fifo_head = c;
    }
    ss_tracer.fifo_tail = c;
    if (tb->last) {
        tb->last->next_thread = c;
    } else {
        tb->first = c;
    }
    tb->last = c;
    return c;
}

/* "oldest" policy: free whole chunks from the front of the creation queue until there is room. */
static void evict_oldest(void) {
    while (ss_tracer.kept >= ss_tracer.budget && ss_tracer.fifo_head != NULL) {
        Chunk *c = ss_tracer.fifo_head;
        ThreadBuf *tb = c->owner;
        ss_tracer.fifo_head = c->next_global;
        if (ss_tracer.fifo_head == NULL) {
            ss_tracer.fifo_tail = NULL;
        }
        ss_tracer.dropped += c->count;
        ss_tracer.kept -= c->count;
        tb->count -= c->count;
        c->count = 0;
        c->next_global = NULL;
        if (c == tb->last) {
            /* The thread's only chunk: reuse it in place, now the newest. */
            if (ss_tracer.fifo_tail) {
                ss_tracer.fifo_tail->next_global = c;
            } else {
                ss_tracer.fifo_head = c;
            }
            ss_tracer.fifo_tail = c;
        } else {
            tb->first = c->next_thread;
            c->next_global = ss_tracer.free_chunks;
            ss_tracer.free_chunks = c;
        }
    }
}

static inline void append_record(ThreadBuf *tb, uint64_t start, uint64_t dur, uint32_t id,
                                 uint32_t depth, uint32_t flags) {
    if (ss_tracer.drop_oldest && ss_tracer.kept >= ss_tracer.budget) {
        evict_oldest();
        if (ss_tracer.kept >= ss_tracer.budget) {
            ss_tracer.dropped++;
            return;
        }
    }
    Chunk *c = tb->last;
    if (c == NULL || c->count == ss_tracer.chunk_cap) {
        c = chunk_new(tb);
        if (c == NULL) {
            ss_tracer.dropped++;
            return;
        }
    }
    if (dur > MAX_DUR_TICKS) {
        dur = MAX_DUR_TICKS;
    }
    Record *r = &c->records[c->count++];
    r->start_lo = (uint32_t)start;
    r->start_hi = (uint32_t)(start >> 32);
    r->dur_lo = (uint32_t)dur;
    r->dur_hi = (uint16_t)(dur >> 32);
    r->depth = (uint16_t)depth;
    r->code_flags = (id << 2) | (flags & REC_FLAGS_MASK);
    ss_tracer.kept++;
    tb->count++;
}

/* ---------------------------------------------------------------------------------------- */
/* Per-thread stacks                                                                          */

static int stack_grow(ThreadBuf *tb) {
    uint32_t cap = tb->stack_cap ? tb->stack_cap * 2 : 128;
    Frame *grown = PyMem_RawRealloc(tb->stack, cap * sizeof(Frame));
    if (grown == NULL) {
        return -1;
    }
    tb->stack = grown;
    tb->stack_cap = cap;
    return 0;
}

static inline void push_frame(ThreadBuf *tb, const void *key, uint32_t id, uint32_t flags,
                              uint64_t start) {
    uint32_t d = tb->depth;
    if (d == tb->stack_cap && stack_grow(tb) < 0) {
        ss_tracer.lost++; /* its return will not match and is ignored */
        return;
    }
    if (d >= ss_tracer.max_depth) {
        flags |= FRAME_SKIP;
    } else if (!ss_tracer.drop_oldest) {
        /* Only this policy drops frames: a dropped caller drops its callees too. */
        if ((d > 0 && (tb->stack[d - 1].flags & FRAME_DROPPED)) ||
            ss_tracer.kept + ss_tracer.reserved >= ss_tracer.budget) {
            flags |= FRAME_DROPPED;
        } else {
            ss_tracer.reserved++; /* a slot for its record when it closes */
        }
    }
    Frame *f = &tb->stack[d];
    f->key = key;
    f->id = id;
    f->flags = flags;
    f->start = start;
    tb->depth = d + 1;
}

static inline void close_top(ThreadBuf *tb, uint64_t now, uint32_t extra_flags) {
    Frame *f = &tb->stack[--tb->depth];
    if (f->flags & FRAME_SKIP) {
        return;
    }
    uint64_t dur = now > f->start ? now - f->start : 0;
    if (f->flags & FRAME_DROPPED) {
        if (dur >= ss_tracer.min_ticks) {
            ss_tracer.dropped++;
        }
        return;
    }
    if (!ss_tracer.drop_oldest) {
        ss_tracer.reserved--;
    }
    if (dur < ss_tracer.min_ticks) {
        return;
    }
    append_record(tb, f->start, dur, f->id, tb->depth, f->flags | extra_flags);
}

/* A return that does not match the top frame: close the frames above its own, if it is on the
 * stack near the top; otherwise it belongs to a frame never pushed and is ignored. */
static void pop_unbalanced(ThreadBuf *tb, const void *key, uint64_t now) {
    uint32_t d = tb->depth;
    uint32_t lowest = d > SEARCH_LIMIT ? d - SEARCH_LIMIT : 0;
    for (uint32_t i = d; i-- > lowest;) {
        if (tb->stack[i].key == key) {
            ss_tracer.unbalanced += d - 1 - i;
            while (tb->depth > i) {
                close_top(tb, now, 0);
            }
            return;
        }
    }
}

/* A frame already running when recording starts (open at the start). */
void tr_push_open_frame(ThreadBuf *tb, const void *key, uint32_t id) {
    push_frame(tb, key, id, REC_OPEN_AT_START, ss_tracer.start_ticks);
}

/* Close every frame still open (at the end), innermost first. */
void tr_close_frames(ThreadBuf *tb, uint64_t now) {
    while (tb->depth) {
        close_top(tb, now, REC_OPEN_AT_END);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Threads                                                                                    */

static PyTypeObject ThreadBufType;

ThreadBuf *tr_thread_new(PyThreadState *ts, unsigned long native_tid) {
    ThreadBuf *tb = PyObject_New(ThreadBuf, &ThreadBufType);
    if (tb == NULL) {
        PyErr_Clear();
        return NULL;
    }
    tb->next = ss_tracer.threads;
    tb->tstate = ts;
    tb->ts_id = ts ? ts->id : 0;
    tb->native_tid = native_tid;
    tb->stack = NULL;
    tb->depth = 0;
    tb->stack_cap = 0;
    tb->first = NULL;
    tb->last = NULL;
    tb->count = 0;
    tb->prev_func = NULL;
    tb->prev_obj = NULL;
    tb->installed = 0;
    tb->off = 0;
    if (ss_tracer.hidden != NULL) { /* once per thread and window: asking Python is affordable */
        PyObject *ids = PyObject_CallNoArgs(ss_tracer.hidden);
        PyObject *key = PyLong_FromUnsignedLong(native_tid);
        if (ids != NULL && key != NULL) {
            int found = PySequence_Contains(ids, key);
            tb->off = found > 0;
        }
        Py_XDECREF(ids);
        Py_XDECREF(key);
        PyErr_Clear();
    }
    ss_tracer.threads = tb; /* the list's reference */
    ss_tracer.n_threads++;
    return tb;
}

static void threadbuf_dealloc(PyObject *self) {
    ThreadBuf *tb = (ThreadBuf *)self;
    PyMem_RawFree(tb->stack);
    Py_XDECREF(tb->prev_obj);
    PyObject_Free(self);
}

static PyTypeObject ThreadBufType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "stepscope._native._TracerThread",
    .tp_basicsize = sizeof(ThreadBuf),
    .tp_dealloc = threadbuf_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Per-thread state of the function tracer (internal).",
};

ThreadBuf *tr_thread_for(PyThreadState *ts) {
    for (ThreadBuf *tb = ss_tracer.threads; tb; tb = tb->next) {
        if (tb->tstate == ts && tb->ts_id == ts->id) {
            return tb;
        }
    }
    return NULL;
}

unsigned long tr_native_id_of(PyThreadState *ts) {
#if PY_VERSION_HEX >= 0x030B0000
    if (ts->native_thread_id) {
        return ts->native_thread_id;
    }
#endif
    if (ss_tracer.native_ids != NULL) {
        PyObject *key = PyLong_FromUnsignedLong(ts->thread_id);
        if (key != NULL) {
            PyObject *val = PyDict_GetItemWithError(ss_tracer.native_ids, key);
            Py_DECREF(key);
            if (val != NULL) {
                unsigned long v = PyLong_AsUnsignedLong(val);
                if (!PyErr_Occurred()) {
                    return v;
                }
            }
        }
        PyErr_Clear();
    }
    return ts->thread_id;
}

/* The calling thread's buffer, cached in a thread-local tagged with the session generation (a
 * new thread starts with an empty cache).  The initial-exec model makes the hot read one load;
 * asking CPython for the thread state costs a __tls_get_addr call from a shared libpython. */
#if defined(__GNUC__) && defined(__linux__) && (defined(__x86_64__) || defined(__aarch64__))
#define SS_TLS __thread __attribute__((tls_model("initial-exec")))
#else
#define SS_TLS _Thread_local
#endif
static SS_TLS ThreadBuf *tls_buf;
static SS_TLS uint64_t tls_generation;
static uint64_t generation = 1; /* bumped whenever the session's buffers are freed */

static ThreadBuf *current_thread_slow(void) {
    PyThreadState *ts = PyThreadState_Get();
    ThreadBuf *tb = tr_thread_for(ts);
    if (tb == NULL) {
        tb = tr_thread_new(ts, PyThread_get_thread_native_id());
        if (tb == NULL) {
            return NULL;
        }
    }
    tls_buf = tb;
    tls_generation = generation;
    return tb;
}

static inline ThreadBuf *current_thread(void) {
    if (tls_generation == generation) {
        return tls_buf;
    }
    return current_thread_slow();
}

/* The session's buffers were freed: every thread's cached buffer is stale. */
void tr_forget_thread_cache(void) {
    generation++;
}

/* ---------------------------------------------------------------------------------------- */
/* Event handlers shared by both ways in                                                      */

/* `key` identifies the frame on the stack: the code object under sys.monitoring (that is all
 * its events carry), the frame object under the profile function (exact, and its return then
 * needs no code lookup). */
static inline int on_py_start(ThreadBuf *tb, const void *key, PyObject *code) {
    if (tb->off) {
        return 1; /* not 0: that would DISABLE the code on every thread */
    }
    Slot *s = slot_find(code, NULL);
    if (s->id == 0) {
        s = tr_intern_code(code);
        if (s == NULL) {
            return 1;
        }
    }
    if (!s->include) {
        return 0;
    }
    push_frame(tb, key, s->id - 1, 0, now_ticks());
    return 1;
}

/* A return that does not match the top frame: 0 when the code is excluded (the caller may
 * DISABLE the event), else the frames down to its own are closed if it is on the stack. */
static int on_py_end_unmatched(ThreadBuf *tb, const void *key, PyObject *code, uint64_t now) {
    Slot *s = slot_find(code, NULL);
    if (s->id == 0) {
        return 1; /* never started inside the window */
    }
    if (!s->include) {
        return 0;
    }
    pop_unbalanced(tb, key, now);
    return 1;
}

static inline int on_py_end(ThreadBuf *tb, PyObject *code, uint64_t now) {
    if (tb->off) {
        return 1;
    }
    uint32_t d = tb->depth;
    if (d && tb->stack[d - 1].key == code) {
        close_top(tb, now, 0);
        return 1;
    }
    return on_py_end_unmatched(tb, code, code, now);
}

static inline void on_c_start(ThreadBuf *tb, PyObject *callable, PyObject *arg0) {
    PyMethodDef *ml;
    PyObject *self, *module;
    if (tb->off || !c_callable_parts(callable, arg0, &ml, &self, &module)) {
        return;
    }
    Slot *s = tr_intern_c(ml, self, module);
    if (s == NULL || !s->include) {
        return;
    }
    push_frame(tb, ml, s->id - 1, 0, now_ticks());
}

static inline void on_c_end(ThreadBuf *tb, PyObject *callable, PyObject *arg0, uint64_t now) {
    PyMethodDef *ml;
    PyObject *self, *module;
    if (tb->off || !c_callable_parts(callable, arg0, &ml, &self, &module)) {
        return;
    }
    uint32_t d = tb->depth;
    if (d && tb->stack[d - 1].key == ml) {
        close_top(tb, now, 0);
        return;
    }
    pop_unbalanced(tb, ml, now);
}

/* ---------------------------------------------------------------------------------------- */
/* sys.monitoring callbacks (3.12+)                                                           */

static PyObject *mon_py_start(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (!ss_tracer.active || nargs < 1) {
        Py_RETURN_NONE;
    }
    ThreadBuf *tb = current_thread();
    if (tb != NULL && !on_py_start(tb, args[0], args[0])) {
        return Py_NewRef(ss_tracer.disable);
    }
    Py_RETURN_NONE;
}

static PyObject *mon_py_throw(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (!ss_tracer.active || nargs < 1) {
        Py_RETURN_NONE;
    }
    ThreadBuf *tb = current_thread();
    if (tb != NULL) {
        on_py_start(tb, args[0], args[0]);
    }
    Py_RETURN_NONE;
}

static PyObject *mon_py_return(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t now = now_ticks();
    if (!ss_tracer.active || nargs < 1) {
        Py_RETURN_NONE;
    }
    ThreadBuf *tb = current_thread();
    if (tb != NULL && !on_py_end(tb, args[0], now)) {
        return Py_NewRef(ss_tracer.disable);
    }
    Py_RETURN_NONE;
}

static PyObject *mon_py_unwind(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t now = now_ticks();
    if (!ss_tracer.active || nargs < 1) {
        Py_RETURN_NONE;
    }
    ThreadBuf *tb = current_thread();
    if (tb != NULL) {
        on_py_end(tb, args[0], now); /* PY_UNWIND cannot be disabled */
    }
    Py_RETURN_NONE;
}

static PyObject *mon_call(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (!ss_tracer.active || nargs < 4) {
        Py_RETURN_NONE;
    }
    ThreadBuf *tb = current_thread();
    if (tb != NULL) {
        on_c_start(tb, args[2], args[3]);
    }
    Py_RETURN_NONE;
}

static PyObject *mon_c_end(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t now = now_ticks();
    if (!ss_tracer.active || nargs < 4) {
        Py_RETURN_NONE;
    }
    ThreadBuf *tb = current_thread();
    if (tb != NULL) {
        on_c_end(tb, args[2], args[3], now);
    }
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------- */
/* Profile function (3.10/3.11)                                                               */

#if SS_LEGACY_PROFILE
static int profile_cb(PyObject *obj, PyFrameObject *frame, int what, PyObject *arg) {
    ThreadBuf *tb = (ThreadBuf *)obj;
    switch (what) {
    case PyTrace_CALL: {
        if (tb->prev_func && tb->prev_func(tb->prev_obj, frame, what, arg) < 0) {
            return -1;
        }
        if (ss_tracer.active) {
            PyCodeObject *code = PyFrame_GetCode(frame);
            on_py_start(tb, frame, (PyObject *)code);
            Py_DECREF(code);
        }
        return 0;
    }
    case PyTrace_RETURN: {
        if (ss_tracer.active) {
            uint64_t now = now_ticks();
            uint32_t d = tb->depth;
            if (d && tb->stack[d - 1].key == (const void *)frame) {
                close_top(tb, now, 0);
            } else {
                PyCodeObject *code = PyFrame_GetCode(frame);
                on_py_end_unmatched(tb, frame, (PyObject *)code, now);
                Py_DECREF(code);
            }
        }
        break;
    }
    case PyTrace_C_CALL:
        if (tb->prev_func && tb->prev_func(tb->prev_obj, frame, what, arg) < 0) {
            return -1;
        }
        if (ss_tracer.active && ss_tracer.trace_c) {
            on_c_start(tb, arg, NULL);
        }
        return 0;
    case PyTrace_C_RETURN:
    case PyTrace_C_EXCEPTION:
        if (ss_tracer.active && ss_tracer.trace_c) {
            on_c_end(tb, arg, NULL, now_ticks());
        }
        break;
    default:
        break;
    }
    if (tb->prev_func) {
        return tb->prev_func(tb->prev_obj, frame, what, arg);
    }
    return 0;
}

int tr_install_profile(ThreadBuf *tb, PyThreadState *ts, int chain) {
    if (chain && ts->c_profilefunc != NULL && ts->c_profilefunc != profile_cb) {
        tb->prev_func = ts->c_profilefunc;
        tb->prev_obj = Py_XNewRef(ts->c_profileobj);
    }
    if (_PyEval_SetProfile(ts, profile_cb, (PyObject *)tb) < 0) {
        return -1;
    }
    tb->installed = 1;
    return 0;
}

void tr_uninstall_profiles(void) {
    PyInterpreterState *interp = PyInterpreterState_Get();
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts;
         ts = PyThreadState_Next(ts)) {
        ThreadBuf *tb = tr_thread_for(ts);
        if (tb == NULL || !tb->installed) {
            continue;
        }
        if (ts->c_profilefunc == profile_cb && ts->c_profileobj == (PyObject *)tb) {
            PyObject *prev = tb->prev_obj; /* _PyEval_SetProfile takes its own reference */
            if (_PyEval_SetProfile(ts, tb->prev_func, prev) < 0) {
                PyErr_Clear();
            }
        } else {
            ss_tracer.displaced++; /* someone replaced us; leave theirs in place */
        }
        tb->installed = 0;
    }
    for (ThreadBuf *tb = ss_tracer.threads; tb; tb = tb->next) {
        tb->installed = 0;
        Py_CLEAR(tb->prev_obj);
        tb->prev_func = NULL;
    }
}
#endif

/* threading.setprofile target on 3.10/3.11: swaps itself for the C profile function in each
 * new thread, then handles the event it was called for. */
static PyObject *py_thread_hook(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
#if SS_LEGACY_PROFILE
    PyThreadState *ts = PyThreadState_Get();
    if (!ss_tracer.active || ss_tracer.mode != MODE_PROFILE || nargs < 2) {
        if (_PyEval_SetProfile(ts, NULL, NULL) < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    ThreadBuf *tb = tr_thread_for(ts);
    if (tb == NULL) {
        tb = tr_thread_new(ts, PyThread_get_thread_native_id());
        if (tb == NULL) {
            Py_RETURN_NONE;
        }
    }
    if (tr_install_profile(tb, ts, 0) < 0) {
        return NULL;
    }
    if (PyFrame_Check(args[0]) && PyUnicode_Check(args[1]) &&
        PyUnicode_CompareWithASCIIString(args[1], "call") == 0) {
        PyCodeObject *code = PyFrame_GetCode((PyFrameObject *)args[0]);
        on_py_start(tb, args[0], (PyObject *)code);
        Py_DECREF(code);
    }
#endif
    Py_RETURN_NONE;
}

static PyMethodDef event_methods[] = {
    {"_tracer_thread_hook", (PyCFunction)(void (*)(void))py_thread_hook, METH_FASTCALL,
     "threading.setprofile target that installs the C profile function in new threads."},
    {"_mon_py_start", (PyCFunction)(void (*)(void))mon_py_start, METH_FASTCALL,
     "sys.monitoring PY_START/PY_RESUME callback."},
    {"_mon_py_throw", (PyCFunction)(void (*)(void))mon_py_throw, METH_FASTCALL,
     "sys.monitoring PY_THROW callback."},
    {"_mon_py_return", (PyCFunction)(void (*)(void))mon_py_return, METH_FASTCALL,
     "sys.monitoring PY_RETURN/PY_YIELD callback."},
    {"_mon_py_unwind", (PyCFunction)(void (*)(void))mon_py_unwind, METH_FASTCALL,
     "sys.monitoring PY_UNWIND callback."},
    {"_mon_call", (PyCFunction)(void (*)(void))mon_call, METH_FASTCALL,
     "sys.monitoring CALL callback (C functions)."},
    {"_mon_c_end", (PyCFunction)(void (*)(void))mon_c_end, METH_FASTCALL,
     "sys.monitoring C_RETURN/C_RAISE callback."},
    {NULL, NULL, 0, NULL},
};

int tr_events_add(PyObject *module) {
    if (PyType_Ready(&ThreadBufType) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(module, event_methods);
}
