/* Deterministic Python function tracer (pure-Python twin: stepscope.collectors.python_twin).
 *
 * Events reach the tracer in one of two ways, chosen by the interpreter version:
 *  - 3.12+: sys.monitoring callbacks (the mon_* functions, registered from Python on a free
 *    tool id); code that the filter excludes is answered with DISABLE once and never seen again;
 *  - 3.10/3.11: a C profile function installed with _PyEval_SetProfile on every thread state,
 *    chaining to whatever profile function was there before (so cProfile keeps working).
 * Both feed the same per-thread state: a stack of open frames, and chunks of 20-byte records
 * appended when a frame closes (so records are in post-order).  Each code object or C function
 * is interned once (one reference held) with its include/exclude decision.  Times stay raw clock
 * ticks until export, which rebuilds the call tree, numbers the spans in pre-order and converts
 * ticks to ns.  Every piece of state is touched with the GIL held; the only call into Python on
 * the event path is the filter, once per new code object. */
#include "stepscope_native.h"

#include <frameobject.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define SS_INLINE_TSC 1
#else
#define SS_INLINE_TSC 0
#endif

#define SS_LEGACY_PROFILE (PY_VERSION_HEX < 0x030C0000)

/* Flags kept in records (and exported). */
#define REC_OPEN_AT_START 0x1
#define REC_OPEN_AT_END 0x2
#define REC_FLAGS_MASK 0x3
/* Flags of open frames only. */
#define FRAME_SKIP 0x100    /* deeper than max_depth: tracked for balance, never recorded */
#define FRAME_DROPPED 0x200 /* over the event budget ("newest" policy), with all its callees */

#define MAX_RECORD_DEPTH 0xFFFF
#define SEARCH_LIMIT 256 /* how far down the stack an unbalanced return is matched */

enum { MODE_IDLE = 0, MODE_PROFILE = 1, MODE_MONITORING = 2 };

/* One closed call in 20 bytes (4-byte words only, so arrays pack without padding). */
typedef struct {
    uint32_t start_lo; /* start, ticks */
    uint32_t start_hi;
    uint32_t dur_lo;   /* duration, ticks: 48 bits, over a day */
    uint16_t dur_hi;
    uint16_t depth;
    uint32_t code_flags; /* intern id << 2 | record flags */
} Record;

#define MAX_DUR_TICKS (((uint64_t)1 << 48) - 1)

static inline uint64_t rec_start(const Record *r) {
    return ((uint64_t)r->start_hi << 32) | r->start_lo;
}

static inline uint64_t rec_dur(const Record *r) {
    return ((uint64_t)r->dur_hi << 32) | r->dur_lo;
}

typedef struct Chunk {
    struct Chunk *next_global; /* creation order across threads: the eviction queue */
    struct Chunk *next_thread;
    struct ThreadBuf *owner;
    uint32_t count;
    Record records[];
} Chunk;

typedef struct {
    const void *key; /* code object or PyMethodDef */
    uint64_t start;
    uint32_t id;
    uint32_t flags;
} Frame;

typedef struct ThreadBuf {
    PyObject_HEAD
    struct ThreadBuf *next; /* session list; the list owns one reference */
    PyThreadState *tstate;
    uint64_t ts_id;
    unsigned long native_tid;
    Frame *stack;
    uint32_t depth;
    uint32_t stack_cap;
    Chunk *first;
    Chunk *last;
    uint64_t count;
    Py_tracefunc prev_func; /* profile function found installed (chained, restored at stop) */
    PyObject *prev_obj;
    int installed;
    int off; /* one of stepscope's own threads: nothing recorded (see `hidden`) */
} ThreadBuf;

typedef struct {
    const void *k1;
    const void *k2;
    uint32_t id; /* intern id + 1; 0 marks an empty slot */
    uint32_t include;
} Slot;

typedef struct {
    PyObject *obj;  /* code object, or the C function's display name (str) */
    PyObject *pin;  /* keeps a C method key's type alive, or NULL */
    int include;
} Interned;

typedef struct {
    int configured;
    int active;
    int mode;
    /* options */
    uint32_t max_depth;
    uint64_t min_ticks;
    int trace_c;
    int tsc; /* the clock reads the TSC: read it here directly (same ticks as ss_ticks) */
    int drop_oldest;
    uint64_t budget;
    uint32_t chunk_cap;
    PyObject *filter;   /* callable(code or module name) -> bool, or NULL: include all */
    PyObject *ignore;   /* tuple of code objects never recorded (the collector's own) */
    PyObject *disable;  /* sys.monitoring.DISABLE */
    PyObject *native_ids; /* dict: thread ident -> native id (3.10 fallback) */
    PyObject *hidden;     /* callable -> native ids of stepscope's own threads, or NULL */
    /* interning */
    Slot *slots;
    size_t slots_cap;
    Interned *interned;
    uint32_t n_interned;
    uint32_t interned_cap;
    /* threads */
    ThreadBuf *threads;
    uint32_t n_threads;
    /* budget and buffers */
    uint64_t kept;
    uint64_t reserved;
    uint64_t dropped;
    Chunk *fifo_head;
    Chunk *fifo_tail;
    Chunk *free_chunks;
    uint64_t chunk_bytes;
    uint64_t peak_chunk_bytes;
    /* window */
    uint64_t start_ticks;
    uint64_t end_ticks;
    /* trouble counters */
    uint64_t unbalanced;
    uint64_t lost;
    uint64_t displaced;
    uint64_t filter_errors;
    PyObject *first_error;
} Session;

static Session S;

static inline uint64_t now_ticks(void) {
#if SS_INLINE_TSC
    if (S.tsc) {
        return __rdtsc();
    }
#endif
    return ss_ticks();
}

static PyTypeObject ThreadBufType;

/* ---------------------------------------------------------------------------------------- */
/* Interning                                                                                 */

static inline size_t slot_hash(const void *k1, const void *k2) {
    uint64_t h = ((uint64_t)(uintptr_t)k1 >> 4) ^ ((uint64_t)(uintptr_t)k2 * 0x9E3779B97F4A7C15ull);
    h *= 0xBF58476D1CE4E5B9ull;
    return (size_t)(h ^ (h >> 31));
}

static inline Slot *slot_find(const void *k1, const void *k2) {
    size_t mask = S.slots_cap - 1;
    size_t i = slot_hash(k1, k2) & mask;
    for (;;) {
        Slot *s = &S.slots[i];
        if (s->id == 0 || (s->k1 == k1 && s->k2 == k2)) {
            return s;
        }
        i = (i + 1) & mask;
    }
}

static int slots_grow(void) {
    size_t cap = S.slots_cap ? S.slots_cap * 2 : 1024;
    Slot *fresh = calloc(cap, sizeof(Slot));
    if (fresh == NULL) {
        return -1;
    }
    Slot *old = S.slots;
    size_t old_cap = S.slots_cap;
    S.slots = fresh;
    S.slots_cap = cap;
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i].id) {
            *slot_find(old[i].k1, old[i].k2) = old[i];
        }
    }
    free(old);
    return 0;
}

static int in_ignore_set(PyObject *code) {
    if (S.ignore == NULL) {
        return 0;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(S.ignore);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyTuple_GET_ITEM(S.ignore, i) == code) {
            return 1;
        }
    }
    return 0;
}

/* The pending exception as one object (cleared from the thread). */
static PyObject *take_exception(void) {
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
#endif
}

/* Ask the filter; a failing filter includes the target and is reported at stop. */
static int ask_filter(PyObject *target) {
    if (S.filter == NULL) {
        return 1;
    }
    PyObject *res = PyObject_CallOneArg(S.filter, target);
    if (res == NULL) {
        S.filter_errors++;
        if (S.first_error == NULL) {
            S.first_error = take_exception();
        } else {
            PyErr_Clear();
        }
        return 1;
    }
    int include = PyObject_IsTrue(res);
    Py_DECREF(res);
    if (include < 0) {
        PyErr_Clear();
        S.filter_errors++;
        return 1;
    }
    return include;
}

/* Add a key (caller decided `include` first; the filter may have let other threads run). */
static Slot *intern_insert(const void *k1, const void *k2, PyObject *obj, PyObject *pin,
                           int include) {
    Slot *s = slot_find(k1, k2);
    if (s->id) {
        return s; /* another thread interned it while the filter ran */
    }
    if ((S.n_interned + 1) * 2 > S.slots_cap) {
        if (slots_grow() < 0) {
            return NULL;
        }
        s = slot_find(k1, k2);
    }
    if (S.n_interned >= (1u << 30) - 1) {
        return NULL; /* ids must fit the record's 30 bits */
    }
    if (S.n_interned == S.interned_cap) {
        uint32_t cap = S.interned_cap ? S.interned_cap * 2 : 512;
        Interned *grown = realloc(S.interned, cap * sizeof(Interned));
        if (grown == NULL) {
            return NULL;
        }
        S.interned = grown;
        S.interned_cap = cap;
    }
    Interned *e = &S.interned[S.n_interned];
    e->obj = Py_NewRef(obj);
    e->pin = Py_XNewRef(pin);
    e->include = include;
    s->k1 = k1;
    s->k2 = k2;
    s->include = (uint32_t)include;
    s->id = ++S.n_interned;
    return s;
}

static Slot *intern_code(PyObject *code) {
    Slot *s = slot_find(code, NULL);
    if (s->id) {
        return s;
    }
    int include = in_ignore_set(code) ? 0 : ask_filter(code);
    return intern_insert(code, NULL, code, NULL, include);
}

/* A type's module (its __module__, or "builtins"). */
static PyObject *type_module(PyTypeObject *type) {
    PyObject *mod = PyObject_GetAttrString((PyObject *)type, "__module__");
    if (mod == NULL || !PyUnicode_Check(mod)) {
        Py_XDECREF(mod);
        PyErr_Clear();
        return PyUnicode_FromString("builtins");
    }
    return mod;
}

/* C callables: keyed by (method def, receiver type); named "<built-in function NAME>" or
 * "<built-in method NAME of MODULE.QUALNAME object>" (no module for builtins).  The extension's
 * own functions are never recorded. */
static Slot *intern_c(PyMethodDef *ml, PyObject *self, PyObject *module) {
    PyTypeObject *type = (self == NULL || PyModule_Check(self)) ? NULL : Py_TYPE(self);
    Slot *s = slot_find(ml, type);
    if (s->id) {
        return s;
    }
    PyObject *name = NULL;
    PyObject *mod_name = NULL;
    if (type == NULL) {
        name = PyUnicode_FromFormat("<built-in function %s>", ml->ml_name);
        mod_name = (module != NULL && PyUnicode_Check(module)) ? Py_NewRef(module)
                                                                : PyUnicode_FromString("builtins");
    } else {
        mod_name = type_module(type);
        PyObject *qualname = PyObject_GetAttrString((PyObject *)type, "__qualname__");
        if (qualname != NULL && PyUnicode_Check(qualname) && mod_name != NULL) {
            if (PyUnicode_CompareWithASCIIString(mod_name, "builtins") == 0) {
                name = PyUnicode_FromFormat("<built-in method %s of %U object>", ml->ml_name,
                                            qualname);
            } else {
                name = PyUnicode_FromFormat("<built-in method %s of %U.%U object>", ml->ml_name,
                                            mod_name, qualname);
            }
        }
        Py_XDECREF(qualname);
    }
    if (name == NULL || mod_name == NULL) {
        Py_XDECREF(name);
        Py_XDECREF(mod_name);
        PyErr_Clear();
        return NULL;
    }
    int include = PyUnicode_CompareWithASCIIString(mod_name, "stepscope._native") != 0 &&
                  ask_filter(mod_name);
    Py_DECREF(mod_name);
    s = intern_insert(ml, type, name, (PyObject *)type, include);
    Py_DECREF(name);
    return s;
}

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
    Chunk *c = S.free_chunks;
    if (c != NULL) {
        S.free_chunks = c->next_global;
    } else {
        size_t bytes = sizeof(Chunk) + (size_t)S.chunk_cap * sizeof(Record);
        c = malloc(bytes);
        if (c == NULL) {
            return NULL;
        }
        S.chunk_bytes += bytes;
        if (S.chunk_bytes > S.peak_chunk_bytes) {
            S.peak_chunk_bytes = S.chunk_bytes;
        }
    }
    c->next_global = NULL;
    c->next_thread = NULL;
    c->owner = tb;
    c->count = 0;
    if (S.fifo_tail) {
        S.fifo_tail->next_global = c;
    } else {
        S.fifo_head = c;
    }
    S.fifo_tail = c;
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
    while (S.kept >= S.budget && S.fifo_head != NULL) {
        Chunk *c = S.fifo_head;
        ThreadBuf *tb = c->owner;
        S.fifo_head = c->next_global;
        if (S.fifo_head == NULL) {
            S.fifo_tail = NULL;
        }
        S.dropped += c->count;
        S.kept -= c->count;
        tb->count -= c->count;
        c->count = 0;
        c->next_global = NULL;
        if (c == tb->last) {
            /* The thread's only chunk: reuse it in place, now the newest. */
            if (S.fifo_tail) {
                S.fifo_tail->next_global = c;
            } else {
                S.fifo_head = c;
            }
            S.fifo_tail = c;
        } else {
            tb->first = c->next_thread;
            c->next_global = S.free_chunks;
            S.free_chunks = c;
        }
    }
}

static inline void append_record(ThreadBuf *tb, uint64_t start, uint64_t dur, uint32_t id,
                                 uint32_t depth, uint32_t flags) {
    if (S.drop_oldest && S.kept >= S.budget) {
        evict_oldest();
        if (S.kept >= S.budget) {
            S.dropped++;
            return;
        }
    }
    Chunk *c = tb->last;
    if (c == NULL || c->count == S.chunk_cap) {
        c = chunk_new(tb);
        if (c == NULL) {
            S.dropped++;
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
    S.kept++;
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
        S.lost++; /* its return will not match and is ignored */
        return;
    }
    if (d >= S.max_depth) {
        flags |= FRAME_SKIP;
    } else if (!S.drop_oldest) {
        /* Only this policy drops frames: a dropped caller drops its callees too. */
        if ((d > 0 && (tb->stack[d - 1].flags & FRAME_DROPPED)) ||
            S.kept + S.reserved >= S.budget) {
            flags |= FRAME_DROPPED;
        } else {
            S.reserved++; /* a slot for its record when it closes */
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
        if (dur >= S.min_ticks) {
            S.dropped++;
        }
        return;
    }
    if (!S.drop_oldest) {
        S.reserved--;
    }
    if (dur < S.min_ticks) {
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
            S.unbalanced += d - 1 - i;
            while (tb->depth > i) {
                close_top(tb, now, 0);
            }
            return;
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Threads                                                                                    */

static ThreadBuf *thread_new(PyThreadState *ts, unsigned long native_tid) {
    ThreadBuf *tb = PyObject_New(ThreadBuf, &ThreadBufType);
    if (tb == NULL) {
        PyErr_Clear();
        return NULL;
    }
    tb->next = S.threads;
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
    if (S.hidden != NULL) { /* once per thread and window: asking Python is affordable */
        PyObject *ids = PyObject_CallNoArgs(S.hidden);
        PyObject *key = PyLong_FromUnsignedLong(native_tid);
        if (ids != NULL && key != NULL) {
            int found = PySequence_Contains(ids, key);
            tb->off = found > 0;
        }
        Py_XDECREF(ids);
        Py_XDECREF(key);
        PyErr_Clear();
    }
    S.threads = tb; /* the list's reference */
    S.n_threads++;
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

static ThreadBuf *thread_for(PyThreadState *ts) {
    for (ThreadBuf *tb = S.threads; tb; tb = tb->next) {
        if (tb->tstate == ts && tb->ts_id == ts->id) {
            return tb;
        }
    }
    return NULL;
}

static unsigned long native_id_of(PyThreadState *ts) {
#if PY_VERSION_HEX >= 0x030B0000
    if (ts->native_thread_id) {
        return ts->native_thread_id;
    }
#endif
    if (S.native_ids != NULL) {
        PyObject *key = PyLong_FromUnsignedLong(ts->thread_id);
        if (key != NULL) {
            PyObject *val = PyDict_GetItemWithError(S.native_ids, key);
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
    ThreadBuf *tb = thread_for(ts);
    if (tb == NULL) {
        tb = thread_new(ts, PyThread_get_thread_native_id());
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
        s = intern_code(code);
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
    Slot *s = intern_c(ml, self, module);
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
    if (!S.active || nargs < 1) {
        Py_RETURN_NONE;
    }
    ThreadBuf *tb = current_thread();
    if (tb != NULL && !on_py_start(tb, args[0], args[0])) {
        return Py_NewRef(S.disable);
    }
    Py_RETURN_NONE;
}

static PyObject *mon_py_throw(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (!S.active || nargs < 1) {
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
    if (!S.active || nargs < 1) {
        Py_RETURN_NONE;
    }
    ThreadBuf *tb = current_thread();
    if (tb != NULL && !on_py_end(tb, args[0], now)) {
        return Py_NewRef(S.disable);
    }
    Py_RETURN_NONE;
}

static PyObject *mon_py_unwind(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t now = now_ticks();
    if (!S.active || nargs < 1) {
        Py_RETURN_NONE;
    }
    ThreadBuf *tb = current_thread();
    if (tb != NULL) {
        on_py_end(tb, args[0], now); /* PY_UNWIND cannot be disabled */
    }
    Py_RETURN_NONE;
}

static PyObject *mon_call(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (!S.active || nargs < 4) {
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
    if (!S.active || nargs < 4) {
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
        if (S.active) {
            PyCodeObject *code = PyFrame_GetCode(frame);
            on_py_start(tb, frame, (PyObject *)code);
            Py_DECREF(code);
        }
        return 0;
    }
    case PyTrace_RETURN: {
        if (S.active) {
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
        if (S.active && S.trace_c) {
            on_c_start(tb, arg, NULL);
        }
        return 0;
    case PyTrace_C_RETURN:
    case PyTrace_C_EXCEPTION:
        if (S.active && S.trace_c) {
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

static int install_profile(ThreadBuf *tb, PyThreadState *ts, int chain) {
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

static void uninstall_profiles(void) {
    PyInterpreterState *interp = PyInterpreterState_Get();
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts;
         ts = PyThreadState_Next(ts)) {
        ThreadBuf *tb = thread_for(ts);
        if (tb == NULL || !tb->installed) {
            continue;
        }
        if (ts->c_profilefunc == profile_cb && ts->c_profileobj == (PyObject *)tb) {
            PyObject *prev = tb->prev_obj; /* _PyEval_SetProfile takes its own reference */
            if (_PyEval_SetProfile(ts, tb->prev_func, prev) < 0) {
                PyErr_Clear();
            }
        } else {
            S.displaced++; /* someone replaced us; leave theirs in place */
        }
        tb->installed = 0;
    }
    for (ThreadBuf *tb = S.threads; tb; tb = tb->next) {
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
    if (!S.active || S.mode != MODE_PROFILE || nargs < 2) {
        if (_PyEval_SetProfile(ts, NULL, NULL) < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    ThreadBuf *tb = thread_for(ts);
    if (tb == NULL) {
        tb = thread_new(ts, PyThread_get_thread_native_id());
        if (tb == NULL) {
            Py_RETURN_NONE;
        }
    }
    if (install_profile(tb, ts, 0) < 0) {
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

/* ---------------------------------------------------------------------------------------- */
/* Session lifecycle                                                                          */

static void session_clear(void) {
    for (uint32_t i = 0; i < S.n_interned; i++) {
        Py_XDECREF(S.interned[i].obj);
        Py_XDECREF(S.interned[i].pin);
    }
    free(S.interned);
    free(S.slots);
    Chunk *c = S.fifo_head;
    while (c) {
        Chunk *next = c->next_global;
        free(c);
        c = next;
    }
    c = S.free_chunks;
    while (c) {
        Chunk *next = c->next_global;
        free(c);
        c = next;
    }
    ThreadBuf *tb = S.threads;
    while (tb) {
        ThreadBuf *next = tb->next;
        Py_DECREF(tb);
        tb = next;
    }
    Py_XDECREF(S.filter);
    Py_XDECREF(S.ignore);
    Py_XDECREF(S.disable);
    Py_XDECREF(S.native_ids);
    Py_XDECREF(S.hidden);
    Py_XDECREF(S.first_error);
    memset(&S, 0, sizeof(S));
    generation++;
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
    if (S.active) {
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
    S.max_depth = max_depth > MAX_RECORD_DEPTH ? MAX_RECORD_DEPTH : max_depth;
    S.min_ticks = min_ticks;
    S.trace_c = trace_c;
    S.tsc = tsc && SS_INLINE_TSC;
    S.drop_oldest = drop_oldest;
    S.budget = budget;
    uint64_t cap = budget / 8;
    S.chunk_cap = (uint32_t)(cap < 1 ? 1 : (cap > 8192 ? 8192 : cap));
    S.filter = filter == Py_None ? NULL : Py_NewRef(filter);
    S.ignore = Py_NewRef(ignore);
    S.disable = Py_NewRef(disable);
    S.native_ids = Py_NewRef(native_ids);
    S.hidden = hidden == Py_None ? NULL : Py_NewRef(hidden);
    if (slots_grow() < 0) {
        session_clear();
        return PyErr_NoMemory();
    }
    S.configured = 1;
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
        ThreadBuf *tb = thread_for(ts);
        if (tb == NULL) {
            tb = thread_new(ts, native_id_of(ts));
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
            Slot *s = intern_code((PyObject *)code);
            if (s != NULL && s->include) {
                const void *key = S.mode == MODE_PROFILE ? (const void *)frame : (const void *)code;
                push_frame(tb, key, s->id - 1, REC_OPEN_AT_START, S.start_ticks);
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
    if (!S.configured) {
        PyErr_SetString(PyExc_RuntimeError, "configure the function tracer before starting it");
        return NULL;
    }
    if (S.active) {
        PyErr_SetString(PyExc_RuntimeError, "the stepscope function tracer is already recording");
        return NULL;
    }
    if (strcmp(mode, "monitoring") == 0) {
        S.mode = MODE_MONITORING;
    } else if (strcmp(mode, "profile") == 0 && SS_LEGACY_PROFILE) {
        S.mode = MODE_PROFILE;
    } else {
        PyErr_Format(PyExc_ValueError, "unsupported tracer mode %R on this Python", arg);
        return NULL;
    }
    S.start_ticks = now_ticks();
    if (snapshot_threads() < 0) {
        return NULL;
    }
#if SS_LEGACY_PROFILE
    if (S.mode == MODE_PROFILE) {
        for (ThreadBuf *tb = S.threads; tb; tb = tb->next) {
            if (install_profile(tb, tb->tstate, 1) < 0) {
                uninstall_profiles();
                return NULL;
            }
        }
    }
#endif
    S.active = 1;
    Py_RETURN_NONE;
}

static PyObject *stats_dict(void) {
    return Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:I,s:I,s:K,s:K,s:K,s:K,s:O,s:I}", "events", S.kept, "dropped",
        S.dropped, "chunk_bytes", S.chunk_bytes, "peak_chunk_bytes", S.peak_chunk_bytes,
        "budget", S.budget, "threads", S.n_threads, "interned", S.n_interned, "unbalanced",
        S.unbalanced, "lost", S.lost, "displaced", S.displaced, "filter_errors", S.filter_errors,
        "first_filter_error", S.first_error ? S.first_error : Py_None, "record_bytes",
        (unsigned int)sizeof(Record));
}

static PyObject *py_stop(PyObject *mod, PyObject *unused) {
    if (!S.active) {
        PyErr_SetString(PyExc_RuntimeError, "the stepscope function tracer is not recording");
        return NULL;
    }
    S.end_ticks = now_ticks();
#if SS_LEGACY_PROFILE
    if (S.mode == MODE_PROFILE) {
        uninstall_profiles();
    }
#endif
    S.active = 0;
    for (ThreadBuf *tb = S.threads; tb; tb = tb->next) {
        while (tb->depth) {
            close_top(tb, S.end_ticks, REC_OPEN_AT_END);
        }
    }
    return stats_dict();
}

static PyObject *py_stats(PyObject *mod, PyObject *unused) {
    return stats_dict();
}

/* Interned targets by id: code objects and C-function names; None for excluded ones. */
static PyObject *py_interned(PyObject *mod, PyObject *unused) {
    PyObject *out = PyList_New(S.n_interned);
    if (out == NULL) {
        return NULL;
    }
    for (uint32_t i = 0; i < S.n_interned; i++) {
        PyObject *v = S.interned[i].include ? S.interned[i].obj : Py_None;
        PyList_SET_ITEM(out, i, Py_NewRef(v));
    }
    return out;
}

/* Where the export writes: the trace's own columns, already sized (no copy in between). */
typedef struct {
    uint32_t *name;
    int64_t *tid;
    int64_t *start;
    int64_t *dur;
    int32_t *ref;
    int64_t *id;
    int64_t *parent;
    uint8_t *flags;
} ExportOut;

/* One thread's records in pre-order from `at` on (see the module comment); `scratch` holds
 * room for 5 int32 per record. */
static void export_thread(ThreadBuf *tb, const uint32_t *name_ids, Py_ssize_t n_names,
                          int64_t first_id, int64_t first_row, size_t at, const ExportOut *o,
                          Record *recs, int32_t *scratch) {
    size_t n = (size_t)tb->count;
    size_t k = 0;
    for (Chunk *c = tb->first; c; c = c->next_thread) {
        memcpy(recs + k, c->records, c->count * sizeof(Record));
        k += c->count;
    }
    int32_t *parent = scratch, *first_child = scratch + n, *next_sib = scratch + 2 * n,
            *pos = scratch + 3 * n, *anc = scratch + 4 * n;
    /* Reverse post-order meets each parent before its children: a stack of ancestors. */
    int32_t root_head = -1;
    size_t top = 0;
    for (size_t j = n; j-- > 0;) {
        uint32_t d = recs[j].depth;
        while (top && recs[anc[top - 1]].depth >= d) {
            top--;
        }
        int32_t p = (top && (uint32_t)recs[anc[top - 1]].depth + 1u == d) ? anc[top - 1] : -1;
        parent[j] = p;
        first_child[j] = -1;
        if (p >= 0) {
            next_sib[j] = first_child[p];
            first_child[p] = (int32_t)j;
        } else {
            next_sib[j] = root_head;
            root_head = (int32_t)j;
        }
        anc[top++] = (int32_t)j;
    }
    int64_t tid = (int64_t)tb->native_tid;
    int64_t id0 = first_id + (int64_t)at;
    int64_t ref0 = -2 - (first_row + (int64_t)at); /* python_ids rows, one per span */
    size_t out = 0;
    int32_t node = root_head;
    while (node >= 0) {
        Record *r = &recs[node];
        pos[node] = (int32_t)out;
        uint64_t start = rec_start(r);
        uint32_t code = r->code_flags >> 2;
        int64_t start_ns = ss_ticks_to_ns(start);
        size_t i = at + out;
        o->name[i] = code < (uint64_t)n_names ? name_ids[code] : 0;
        o->tid[i] = tid;
        o->start[i] = start_ns;
        o->dur[i] = ss_ticks_to_ns(start + rec_dur(r)) - start_ns;
        o->ref[i] = (int32_t)(ref0 - (int64_t)out);
        o->id[i] = id0 + (int64_t)out;
        o->parent[i] = parent[node] >= 0 ? id0 + pos[parent[node]] : 0;
        o->flags[i] = (uint8_t)(r->code_flags & REC_FLAGS_MASK);
        out++;
        if (first_child[node] >= 0) {
            node = first_child[node];
            continue;
        }
        while (node >= 0 && next_sib[node] < 0) {
            node = parent[node];
        }
        if (node >= 0) {
            node = next_sib[node];
        }
    }
}

#define EXPORT_COLUMNS 7

/* Writable buffers of exactly `n` items of `itemsize` bytes. */
static int get_out_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, Py_ssize_t n,
                          const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return -1;
    }
    if (view->itemsize != itemsize || view->len != n * itemsize) {
        PyErr_Format(PyExc_ValueError,
                     "export column %s must hold %zd items of %zd bytes (got %zd bytes of %zd)",
                     name, n, itemsize, view->len, view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *py_export(PyObject *mod, PyObject *args) {
    static const char *names[EXPORT_COLUMNS] = {"name", "tid", "start_ns", "dur_ns",
                                                "args",  "id",  "parent"};
    static const Py_ssize_t sizes[EXPORT_COLUMNS] = {4, 8, 8, 8, 4, 8, 8};
    Py_buffer ids_view;
    long long first_id, first_row;
    PyObject *cols[EXPORT_COLUMNS];
    if (!PyArg_ParseTuple(args, "y*LLOOOOOOO:_tracer_export", &ids_view, &first_id, &first_row,
                          &cols[0], &cols[1], &cols[2], &cols[3], &cols[4], &cols[5],
                          &cols[6])) {
        return NULL;
    }
    Py_buffer views[EXPORT_COLUMNS];
    int got = 0;
    PyObject *flags = NULL, *tids = NULL, *result = NULL;
    ThreadBuf **order = NULL;
    Record *recs = NULL;
    int32_t *scratch = NULL;
    Py_ssize_t n = (Py_ssize_t)S.kept;
    if (S.active) {
        PyErr_SetString(PyExc_RuntimeError, "stop the function tracer before exporting");
        goto done;
    }
    if (ids_view.len % 4 != 0) {
        PyErr_SetString(PyExc_TypeError, "name ids must be a buffer of uint32");
        goto done;
    }
    if (first_row < 0 || first_row + (long long)n > INT32_MAX - 2) {
        PyErr_SetString(PyExc_OverflowError, "python_ids rows must fit the 32-bit args refs");
        goto done;
    }
    for (; got < EXPORT_COLUMNS; got++) {
        if (get_out_buffer(cols[got], &views[got], sizes[got], n, names[got]) < 0) {
            goto done;
        }
    }
    flags = PyBytes_FromStringAndSize(NULL, n);
    order = malloc((S.n_threads + 1) * sizeof(ThreadBuf *));
    uint64_t most = 1;
    for (ThreadBuf *tb = S.threads; tb; tb = tb->next) {
        most = tb->count > most ? tb->count : most;
    }
    recs = malloc(most * sizeof(Record));
    scratch = malloc(5 * most * sizeof(int32_t));
    if (flags == NULL || order == NULL || recs == NULL || scratch == NULL) {
        Py_CLEAR(flags);
        PyErr_NoMemory();
        goto done;
    }
    ExportOut o = {views[0].buf, views[1].buf, views[2].buf, views[3].buf,
                   views[4].buf, views[5].buf, views[6].buf,
                   (uint8_t *)PyBytes_AS_STRING(flags)};
    /* Threads in creation order (the list is newest first). */
    uint32_t m = 0;
    for (ThreadBuf *tb = S.threads; tb; tb = tb->next) {
        order[m++] = tb;
    }
    size_t at = 0;
    tids = PyList_New(0);
    for (uint32_t i = m; tids != NULL && i-- > 0;) {
        if (order[i]->count == 0) {
            continue;
        }
        export_thread(order[i], (const uint32_t *)ids_view.buf, ids_view.len / 4, first_id,
                      first_row, at, &o, recs, scratch);
        at += (size_t)order[i]->count;
        PyObject *tid = PyLong_FromUnsignedLong(order[i]->native_tid);
        if (tid == NULL || PyList_Append(tids, tid) < 0) {
            Py_CLEAR(tids);
        }
        Py_XDECREF(tid);
    }
    result = tids == NULL ? NULL : Py_BuildValue("(NN)", Py_NewRef(flags), tids);
done:
    while (got-- > 0) {
        PyBuffer_Release(&views[got]);
    }
    free(order);
    free(recs);
    free(scratch);
    PyBuffer_Release(&ids_view);
    Py_XDECREF(flags);
    return result;
}

static PyObject *py_clear(PyObject *mod, PyObject *unused) {
    if (S.active) {
        PyErr_SetString(PyExc_RuntimeError, "stop the function tracer before clearing it");
        return NULL;
    }
    session_clear();
    Py_RETURN_NONE;
}

static PyObject *py_active(PyObject *mod, PyObject *unused) {
    return PyBool_FromLong(S.active);
}

static PyMethodDef tracer_methods[] = {
    {"_tracer_configure", (PyCFunction)(void (*)(void))py_configure,
     METH_VARARGS | METH_KEYWORDS, "Set the tracer's filters and budget for the next window."},
    {"_tracer_start", py_start, METH_O,
     "Start recording ('monitoring' on 3.12+, 'profile' on 3.10/3.11)."},
    {"_tracer_stop", py_stop, METH_NOARGS, "Stop recording; closes open frames; returns stats."},
    {"_tracer_stats", py_stats, METH_NOARGS, "Counters of the current session."},
    {"_tracer_interned", py_interned, METH_NOARGS, "Interned code objects / C names by id."},
    {"_tracer_export", py_export, METH_VARARGS,
     "Write every span in pre-order, thread by thread, into the given columns (name ids, tids, "
     "starts, durs, args refs to python_ids rows from first_row, Python ids, parent ids); "
     "returns (their flags, the threads' native ids)."},
    {"_tracer_clear", py_clear, METH_NOARGS, "Free every buffer and interned reference."},
    {"_tracer_active", py_active, METH_NOARGS, "Whether the tracer is recording."},
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

int ss_tracer_init(PyObject *module) {
    if (PyType_Ready(&ThreadBufType) < 0) {
        return -1;
    }
    if (PyModule_AddIntConstant(module, "TRACER_RECORD_BYTES", (long)sizeof(Record)) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(module, tracer_methods);
}
