/* In-process stack sampler (pure-Python twin: stepscope.collectors.sampler_twin.PyStackSampler).
 *
 * Two ways to fill the same columns.  Signal mode (start_signals / drain / stop_signals, Linux,
 * Python 3.11+): the engine in sampler_signal.c records busy threads' stacks from a SIGPROF handler
 * and this file drains its rings under the GIL (see that file).  Thread mode: a Python timing
 * thread calls sample(), which runs with the
 * GIL held, so every other thread is parked at a safe point; it walks the Python frames of every
 * thread (or of the chosen native thread ids) through the public frame API, interns each
 * (code object, instruction offset) as a frame and each (parent, frame) pair as a stack node, and
 * appends one record per thread to bounded columns.  Lines are resolved only at export, so the hot
 * path never scans a line table.  A thread is idle when its CPU clock advanced by less than
 * `idle_share` of the wall time since its previous reading (taken at least `idle_window_ns`
 * earlier).  Frame 0 is the "[truncated]" marker placed at the root of stacks cut at max_depth
 * (the innermost frames are kept). */
#include "stepscope_native.h"

#include "sampler_signal.h"

#include <frameobject.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SS_HAVE_LASTI (PY_VERSION_HEX >= 0x030B0000)      /* PyFrame_GetLasti, native ids */
#define SS_NATIVE_TIDS (PY_VERSION_HEX >= 0x030B0000)
#define MAX_CLOCKS 1024

/* -- a small open-addressing map: (a, b) -> int32 ------------------------------------------ */

typedef struct {
    uint64_t a, b;
    int32_t value;
    int32_t used;
} Slot;

typedef struct {
    Slot *slots;
    size_t cap; /* power of two */
    size_t count;
} Map;

static inline size_t mix(uint64_t a, uint64_t b) {
    uint64_t x = a * 0x9E3779B97F4A7C15ULL ^ (b + 0x632BE59BD9B4E019ULL + (a << 6) + (a >> 2));
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 29;
    return (size_t)x;
}

static int map_grow(Map *m) {
    size_t cap = m->cap ? m->cap * 2 : 1024;
    Slot *slots = calloc(cap, sizeof(Slot));
    if (slots == NULL) {
        return -1;
    }
    for (size_t i = 0; i < m->cap; i++) {
        Slot *s = &m->slots[i];
        if (!s->used) {
            continue;
        }
        size_t j = mix(s->a, s->b) & (cap - 1);
        while (slots[j].used) {
            j = (j + 1) & (cap - 1);
        }
        slots[j] = *s;
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return 0;
}

/* The value slot for (a, b); a new slot gets value -1 and *is_new = 1.  NULL when out of memory. */
static int32_t *map_slot(Map *m, uint64_t a, uint64_t b, int *is_new) {
    if ((m->count + 1) * 2 > m->cap && map_grow(m) < 0) {
        return NULL;
    }
    size_t j = mix(a, b) & (m->cap - 1);
    while (m->slots[j].used) {
        if (m->slots[j].a == a && m->slots[j].b == b) {
            *is_new = 0;
            return &m->slots[j].value;
        }
        j = (j + 1) & (m->cap - 1);
    }
    m->slots[j].used = 1;
    m->slots[j].a = a;
    m->slots[j].b = b;
    m->slots[j].value = -1;
    m->count++;
    *is_new = 1;
    return &m->slots[j].value;
}

/* -- growable columns ---------------------------------------------------------------------- */

typedef struct {
    char *data;
    size_t len, cap, item;
} Column;

static int column_push(Column *c, const void *value) {
    if (c->len == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 256;
        char *data = realloc(c->data, cap * c->item);
        if (data == NULL) {
            return -1;
        }
        c->data = data;
        c->cap = cap;
    }
    memcpy(c->data + c->len * c->item, value, c->item);
    c->len++;
    return 0;
}

static PyObject *column_bytes(const Column *c) {
    return PyBytes_FromStringAndSize(c->data ? c->data : "", (Py_ssize_t)(c->len * c->item));
}

/* -- per-thread CPU clocks for idle detection ---------------------------------------------- */

typedef struct {
    uint64_t tid;
    int64_t cpu_ns;
    int64_t wall_ns;
    uint64_t tick;
    int idle;
} ThreadClock;

typedef struct {
    PyObject_HEAD
    Py_ssize_t max_samples;
    int max_depth;
    double idle_share;
    int64_t idle_window_ns;
    uint64_t *wanted; /* native thread ids to sample, or NULL for all */
    Py_ssize_t n_wanted;
    PyObject *codes; /* list: index 0 is None (the truncation marker), then code objects */
    Map code_ids, frame_ids, stack_ids;
    Column frame_code, frame_pos;     /* int32 each */
    Column stack_parent, stack_frame; /* int32 each */
    Column sample_tid, sample_ts;     /* int64 each */
    Column sample_stack;              /* int32 */
    Column sample_idle;               /* uint8 */
    int32_t *scratch;
    ThreadClock clocks[MAX_CLOCKS];
    int n_clocks;
    uint64_t ticks;
    int64_t busy_ns;
    Py_ssize_t dropped;
    int signals_on;           /* this object owns the signal engine */
    int draining;             /* a drain is in progress (guards the code watcher) */
    uint64_t drain_tid;       /* the thread that started signal mode: never sampled */
    Py_ssize_t no_slot;       /* most threads left unsampled at once: no engine slot left */
    Py_ssize_t invalid_codes; /* signal samples dropped: a frame was not a code object */
    SsSigStats sig;           /* the engine's counters, kept at stop_signals */
} Sampler;

static uint64_t thread_key(PyThreadState *ts) {
#if SS_NATIVE_TIDS
    return (uint64_t)ts->native_thread_id;
#else
    return (uint64_t)ts->thread_id;
#endif
}

/* CPU time of a thread in ns, or -1 when it cannot be read. */
static int64_t thread_cpu_ns(PyThreadState *ts, uint64_t tid) {
    clockid_t cid;
#if defined(__linux__) && SS_NATIVE_TIDS
    /* The kernel's per-thread scheduler clock id (what pthread_getcpuclockid computes); unlike a
     * pthread_t, a stale tid only makes clock_gettime fail. */
    (void)ts;
    cid = (clockid_t)((~(uint32_t)tid << 3) | 6u);
#else
    (void)tid;
    if (pthread_getcpuclockid((pthread_t)ts->thread_id, &cid) != 0) {
        return -1;
    }
#endif
    struct timespec spec;
    if (clock_gettime(cid, &spec) != 0) {
        return -1;
    }
    return (int64_t)spec.tv_sec * 1000000000LL + spec.tv_nsec;
}

static ThreadClock *find_clock(Sampler *self, uint64_t tid) {
    for (int i = 0; i < self->n_clocks; i++) {
        if (self->clocks[i].tid == tid) {
            return &self->clocks[i];
        }
    }
    if (self->n_clocks == MAX_CLOCKS) { /* forget threads not seen in this tick */
        int kept = 0;
        for (int i = 0; i < self->n_clocks; i++) {
            if (self->clocks[i].tick == self->ticks) {
                self->clocks[kept++] = self->clocks[i];
            }
        }
        self->n_clocks = kept;
        if (kept == MAX_CLOCKS) {
            return NULL;
        }
    }
    ThreadClock *c = &self->clocks[self->n_clocks++];
    c->tid = tid;
    c->cpu_ns = -1;
    c->wall_ns = 0;
    c->tick = self->ticks;
    c->idle = 0;
    return c;
}

/* 1 if idle since its previous reading, 0 if busy or unknown.  Readings closer together than
 * idle_window_ns keep the previous verdict: the thread may not have had the GIL in between. */
static int thread_idle(Sampler *self, PyThreadState *ts, uint64_t tid, int64_t now) {
    ThreadClock *c = find_clock(self, tid);
    if (c == NULL) {
        return 0;
    }
    c->tick = self->ticks;
    if (c->cpu_ns >= 0 && now - c->wall_ns < self->idle_window_ns) {
        return c->idle;
    }
    int64_t cpu = thread_cpu_ns(ts, tid);
    int idle = 0;
    if (c->cpu_ns >= 0 && cpu >= 0 && now > c->wall_ns) {
        idle = (double)(cpu - c->cpu_ns) < self->idle_share * (double)(now - c->wall_ns);
    }
    c->cpu_ns = cpu;
    c->wall_ns = now;
    c->idle = idle;
    return idle;
}

static int wanted(Sampler *self, uint64_t tid) {
    if (self->wanted == NULL) {
        return 1;
    }
    for (Py_ssize_t i = 0; i < self->n_wanted; i++) {
        if (self->wanted[i] == tid) {
            return 1;
        }
    }
    return 0;
}

/* -- interning ----------------------------------------------------------------------------- */

static int32_t intern_frame(Sampler *self, PyCodeObject *code, int pos) {
    int is_new;
    int32_t *slot = map_slot(&self->frame_ids, (uint64_t)(uintptr_t)code, (uint64_t)(int64_t)pos,
                             &is_new);
    if (slot == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (!is_new) {
        return *slot;
    }
    int code_new;
    int32_t *code_slot = map_slot(&self->code_ids, (uint64_t)(uintptr_t)code, UINT64_MAX,
                                  &code_new);
    if (code_slot == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (code_new) {
        if (PyList_Append(self->codes, (PyObject *)code) < 0) { /* keeps the pointer unique */
            return -1;
        }
        *code_slot = (int32_t)(PyList_GET_SIZE(self->codes) - 1);
    }
    int32_t fid = (int32_t)self->frame_code.len;
    int32_t pos32 = pos;
    if (column_push(&self->frame_code, code_slot) < 0 || column_push(&self->frame_pos, &pos32) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    *slot = fid;
    return fid;
}

static int32_t intern_stack(Sampler *self, int32_t parent, int32_t frame) {
    int is_new;
    int32_t *slot = map_slot(&self->stack_ids, (uint64_t)(int64_t)parent, (uint64_t)frame, &is_new);
    if (slot == NULL) {
        PyErr_NoMemory();
        return -2;
    }
    if (is_new) {
        int32_t sid = (int32_t)self->stack_parent.len;
        if (column_push(&self->stack_parent, &parent) < 0 ||
            column_push(&self->stack_frame, &frame) < 0) {
            PyErr_NoMemory();
            return -2;
        }
        *slot = sid;
    }
    return *slot;
}

static int frame_position(PyFrameObject *frame) {
#if SS_HAVE_LASTI
    return PyFrame_GetLasti(frame);
#else
    return PyFrame_GetLineNumber(frame);
#endif
}

/* The stack id of a frame chain (-1 for none), or -2 with an exception set; `frame` is a new
 * reference that this function releases. */
static int32_t stack_of_frame(Sampler *self, PyFrameObject *frame) {
    int n = 0;
    int truncated = 0;
    while (frame != NULL) {
        if (n == self->max_depth) {
            truncated = 1;
            Py_DECREF(frame);
            break;
        }
        PyCodeObject *code = PyFrame_GetCode(frame);
        int32_t fid = intern_frame(self, code, frame_position(frame));
        Py_DECREF(code);
        if (fid < 0) {
            Py_DECREF(frame);
            return -2;
        }
        self->scratch[n++] = fid;
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    int32_t stack = -1;
    if (truncated) {
        stack = intern_stack(self, -1, 0);
    }
    for (int i = n - 1; i >= 0 && stack != -2; i--) {
        stack = intern_stack(self, stack, self->scratch[i]);
    }
    return stack;
}

static int push_sample(Sampler *self, int64_t tid, int64_t ts, int32_t stack, uint8_t idle) {
    if (column_push(&self->sample_tid, &tid) < 0 || column_push(&self->sample_ts, &ts) < 0 ||
        column_push(&self->sample_stack, &stack) < 0 || column_push(&self->sample_idle, &idle) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Record one thread's stack; `frame` is a new reference that this function releases. */
static int record_thread(Sampler *self, PyThreadState *ts, PyFrameObject *frame, uint64_t tid,
                         int64_t now) {
    int32_t stack = stack_of_frame(self, frame);
    if (stack == -2) {
        return -1;
    }
    uint8_t idle = (uint8_t)thread_idle(self, ts, tid, now);
    if (push_sample(self, (int64_t)tid, now, stack, idle) < 0) {
        return -1;
    }
    return 1;
}

/* -- signal mode: the engine's rings into the columns ------------------------------------- */

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
    int32_t stack = truncated ? intern_stack(self, -1, 0) : -1;
    for (int i = depth - 1; i >= 0 && stack != -2; i--) {
        int32_t fid = intern_frame(self, (PyCodeObject *)codes[i], positions[i]);
        if (fid < 0) {
            return -1;
        }
        stack = intern_stack(self, stack, fid);
    }
    if (stack == -2) {
        return -1;
    }
    return push_sample(self, tid, ts, stack, 0);
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
    int32_t stack = stack_of_frame(self, frame);
    if (stack == -2) {
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if ((Py_ssize_t)self->sample_ts.len >= self->max_samples) {
            self->dropped++;
        } else if (push_sample(self, tid, ts[i], stack, 1) < 0) {
            return -1;
        }
    }
    return 0;
}

/* Give every wanted thread but the draining one a slot in the engine. */
static void add_threads(Sampler *self) {
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

static int drain_into(Sampler *self) {
    if (self->draining) {
        return 0;
    }
    self->draining = 1;
    int64_t start = ss_now_ns();
    add_threads(self);
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
        if (drain_into(self) < 0) {
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

static void watch_codes(Sampler *self) {
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
static int codes_watched(void) {
#if PY_VERSION_HEX >= 0x030C0000
    return watcher_id >= 0;
#else
    return 1;
#endif
}

static void unwatch_codes(void) {
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
    unwatch_codes();
    Py_RETURN_NONE;
}

static PyMethodDef module_functions[] = {
    {"_sampler_after_fork_in_child", sampler_after_fork_in_child, METH_NOARGS,
     "Forget a signal-sampling run inherited from the parent (call in a forked child)."},
    {NULL, NULL, 0, NULL},
};

/* -- the Python type ----------------------------------------------------------------------- */

static void take_baseline(Sampler *self) {
    int64_t now = ss_now_ns();
    PyThreadState *me = PyThreadState_Get();
    PyInterpreterState *interp = PyThreadState_GetInterpreter(me);
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts; ts = PyThreadState_Next(ts)) {
        uint64_t tid = thread_key(ts);
        if (ts != me && wanted(self, tid)) {
            (void)thread_idle(self, ts, tid, now);
        }
    }
}

static int sampler_init(Sampler *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"max_samples", "max_depth", "thread_ids", "idle_share",
                             "idle_window_ns", NULL};
    Py_ssize_t max_samples;
    int max_depth;
    PyObject *thread_ids = Py_None;
    double idle_share = 0.2;
    long long idle_window_ns = 1000000;
    if (self->codes != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "StackSampler cannot be initialised twice");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "ni|OdL:StackSampler", kwlist, &max_samples,
                                     &max_depth, &thread_ids, &idle_share, &idle_window_ns)) {
        return -1;
    }
    if (max_samples < 0 || max_depth < 1 || max_depth > 100000) {
        PyErr_SetString(PyExc_ValueError,
                        "StackSampler needs max_samples >= 0 and 1 <= max_depth <= 100000");
        return -1;
    }
    self->max_samples = max_samples;
    self->max_depth = max_depth;
    self->idle_share = idle_share;
    self->idle_window_ns = idle_window_ns;
    if (thread_ids != Py_None) {
        PyObject *seq = PySequence_Fast(thread_ids, "thread_ids must be a sequence of ints or None");
        if (seq == NULL) {
            return -1;
        }
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        self->wanted = calloc(n ? (size_t)n : 1, sizeof(uint64_t));
        if (self->wanted == NULL) {
            Py_DECREF(seq);
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            unsigned long long v = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq, i));
            if (v == (unsigned long long)-1 && PyErr_Occurred()) {
                Py_DECREF(seq);
                return -1;
            }
            self->wanted[i] = v;
        }
        self->n_wanted = n;
        Py_DECREF(seq);
    }
    self->scratch = calloc((size_t)max_depth, sizeof(int32_t));
    self->codes = PyList_New(0);
    if (self->scratch == NULL || self->codes == NULL || PyList_Append(self->codes, Py_None) < 0) {
        if (!PyErr_Occurred()) {
            PyErr_NoMemory();
        }
        return -1;
    }
    int32_t zero = 0, marker_pos = -1;
    if (column_push(&self->frame_code, &zero) < 0 || column_push(&self->frame_pos, &marker_pos) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    take_baseline(self);
    return 0;
}

static PyObject *sampler_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Sampler *self = (Sampler *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->frame_code.item = self->frame_pos.item = sizeof(int32_t);
    self->stack_parent.item = self->stack_frame.item = sizeof(int32_t);
    self->sample_tid.item = self->sample_ts.item = sizeof(int64_t);
    self->sample_stack.item = sizeof(int32_t);
    self->sample_idle.item = sizeof(uint8_t);
    return (PyObject *)self;
}

static void sampler_dealloc(Sampler *self) {
    if (self->signals_on) { /* dropped while sampling: stop without keeping samples */
        ss_sig_stop(100000000); /* the handlers never need the GIL */
        unwatch_codes();
        ss_sig_release();
        self->signals_on = 0;
    }
    Column *columns[] = {&self->frame_code,   &self->frame_pos, &self->stack_parent,
                         &self->stack_frame,  &self->sample_tid, &self->sample_ts,
                         &self->sample_stack, &self->sample_idle};
    for (size_t i = 0; i < sizeof(columns) / sizeof(columns[0]); i++) {
        free(columns[i]->data);
    }
    free(self->code_ids.slots);
    free(self->frame_ids.slots);
    free(self->stack_ids.slots);
    free(self->scratch);
    free(self->wanted);
    Py_XDECREF(self->codes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *sampler_sample(Sampler *self, PyObject *unused) {
    if (self->codes == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "StackSampler was not initialised");
        return NULL;
    }
    int64_t now = ss_now_ns();
    PyThreadState *me = PyThreadState_Get();
    PyInterpreterState *interp = PyThreadState_GetInterpreter(me);
    Py_ssize_t taken = 0;
    self->ticks++;
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts; ts = PyThreadState_Next(ts)) {
        if (ts == me) {
            continue;
        }
        uint64_t tid = thread_key(ts);
        if (!wanted(self, tid)) {
            continue;
        }
        PyFrameObject *frame = PyThreadState_GetFrame(ts);
        if (frame == NULL) {
            continue;
        }
        if ((Py_ssize_t)self->sample_ts.len >= self->max_samples) {
            Py_DECREF(frame);
            self->dropped++;
            continue;
        }
        if (record_thread(self, ts, frame, tid, now) < 0) {
            return NULL;
        }
        taken++;
    }
    self->busy_ns += ss_now_ns() - now;
    return PyLong_FromSsize_t(taken);
}

static PyObject *sampler_start_signals(Sampler *self, PyObject *args) {
    double rate_hz;
    unsigned long long seed = 0;
    if (!PyArg_ParseTuple(args, "d|K:start_signals", &rate_hz, &seed)) {
        return NULL;
    }
    if (self->codes == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "StackSampler was not initialised");
        return NULL;
    }
    if (!(rate_hz > 0 && rate_hz <= 100000)) {
        PyErr_SetString(PyExc_ValueError, "start_signals needs 0 < rate_hz <= 100000");
        return NULL;
    }
    if (self->signals_on) {
        PyErr_SetString(PyExc_RuntimeError, "signal sampling already started on this sampler");
        return NULL;
    }
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
    if (Py_Version < 0x030B01F0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "the signal sampler needs Python 3.11.1 or later (3.11.0 drops a returning "
                        "frame's code object while the frame is still the current one)");
        return NULL;
    }
#endif
    SsSigSettings settings = {rate_hz, (uint64_t)seed, self->max_depth, self->idle_share,
                              self->idle_window_ns};
    char why[200];
    if (ss_sig_start(&settings, why, sizeof(why)) < 0) {
        PyErr_SetString(PyExc_RuntimeError, why);
        return NULL;
    }
    /* No thread has a slot yet, so nothing is sampled before the code objects are watched. */
    watch_codes(self);
    if (!codes_watched()) {
        unwatch_codes();
        ss_sig_stop(0);
        ss_sig_release();
        PyErr_SetString(PyExc_RuntimeError,
                        "no code watcher slot left: freed code objects could not be tracked");
        return NULL;
    }
    self->signals_on = 1;
    self->no_slot = 0;
    self->drain_tid = thread_key(PyThreadState_Get());
    add_threads(self);
    Py_RETURN_NONE;
}

static PyObject *sampler_drain(Sampler *self, PyObject *unused) {
    if (!self->signals_on) {
        PyErr_SetString(PyExc_RuntimeError, "signal sampling is not running on this sampler");
        return NULL;
    }
    size_t before = self->sample_ts.len;
    if (drain_into(self) < 0) {
        return NULL;
    }
    return PyLong_FromSize_t(self->sample_ts.len - before);
}

static void stop_engine(Sampler *self, int64_t timeout_ns) {
    Py_BEGIN_ALLOW_THREADS
    ss_sig_stop(timeout_ns);
    Py_END_ALLOW_THREADS
}

static PyObject *sampler_stop_signals(Sampler *self, PyObject *args) {
    double timeout_s = 1.0;
    if (!PyArg_ParseTuple(args, "|d:stop_signals", &timeout_s)) {
        return NULL;
    }
    if (!self->signals_on) {
        PyErr_SetString(PyExc_RuntimeError, "signal sampling is not running on this sampler");
        return NULL;
    }
    stop_engine(self, (int64_t)(timeout_s * 1e9));
    int rc = drain_into(self);
    ss_sig_stats(&self->sig);
    unwatch_codes();
    ss_sig_release();
    self->signals_on = 0;
    self->ticks += self->sig.ticks;
    self->busy_ns += self->sig.handler_ns;
    if (rc < 0) {
        return NULL;
    }
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:L,s:i,s:n,s:n,s:O,s:O}", "ticks",
                         (unsigned long long)self->sig.ticks, "signals",
                         (unsigned long long)self->sig.signals, "handled",
                         (unsigned long long)self->sig.handled, "late",
                         (unsigned long long)self->sig.late, "no_frames",
                         (unsigned long long)self->sig.no_frames, "ring_full",
                         (unsigned long long)self->sig.ring_full, "handler_ns",
                         (long long)self->sig.handler_ns, "threads", self->sig.threads,
                         "threads_without_slot", self->no_slot, "invalid_codes",
                         self->invalid_codes, "restored", self->sig.restored ? Py_True : Py_False,
                         "replaced", self->sig.replaced ? Py_True : Py_False);
}

static PyObject *sampler_export(Sampler *self, PyObject *unused) {
    if (self->codes == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "StackSampler was not initialised");
        return NULL;
    }
    Column lines = {NULL, 0, 0, sizeof(int32_t)};
    const int32_t *codes = (const int32_t *)self->frame_code.data;
    const int32_t *positions = (const int32_t *)self->frame_pos.data;
    for (size_t i = 0; i < self->frame_code.len; i++) {
        int32_t line = 0;
        if (i > 0) {
            PyObject *code = PyList_GET_ITEM(self->codes, codes[i]);
#if SS_HAVE_LASTI
            line = PyCode_Addr2Line((PyCodeObject *)code, positions[i]);
#else
            (void)code;
            line = positions[i];
#endif
        }
        if (column_push(&lines, &line) < 0) {
            free(lines.data);
            return PyErr_NoMemory();
        }
    }
    PyObject *codes_copy = PyList_GetSlice(self->codes, 0, PyList_GET_SIZE(self->codes));
    PyObject *result = Py_BuildValue(
        "{s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:n,s:K,s:L,s:O}", "codes", codes_copy,
        "frame_code", column_bytes(&self->frame_code), "frame_line", column_bytes(&lines),
        "stack_parent", column_bytes(&self->stack_parent), "stack_frame",
        column_bytes(&self->stack_frame), "sample_tid", column_bytes(&self->sample_tid),
        "sample_ts", column_bytes(&self->sample_ts), "sample_stack",
        column_bytes(&self->sample_stack), "sample_idle", column_bytes(&self->sample_idle),
        "dropped", self->dropped, "ticks", (unsigned long long)self->ticks, "busy_ns",
        (long long)self->busy_ns, "native_tids", SS_NATIVE_TIDS ? Py_True : Py_False);
    free(lines.data);
    return result;
}

static PyObject *sampler_count(Sampler *self, PyObject *unused) {
    return PyLong_FromSize_t(self->sample_ts.len);
}

static void column_drop_front(Column *c, size_t n) {
    memmove(c->data, c->data + n * c->item, (c->len - n) * c->item);
    c->len -= n;
}

/* Drop the longest run of oldest samples taken before `cutoff` (the flight recorder's ring):
 * the columns keep their capacity, so a ring that is trimmed as it fills stays the same size.
 * Samples are in drain order, nearly in time order; one out of order past the run stays. */
static PyObject *sampler_forget_before(Sampler *self, PyObject *arg) {
    long long cutoff = PyLong_AsLongLong(arg);
    if (cutoff == -1 && PyErr_Occurred()) {
        return NULL;
    }
    const int64_t *ts = (const int64_t *)self->sample_ts.data;
    size_t len = self->sample_ts.len, n = 0;
    while (n < len && ts[n] < cutoff) {
        n++;
    }
    if (n > 0) {
        column_drop_front(&self->sample_tid, n);
        column_drop_front(&self->sample_ts, n);
        column_drop_front(&self->sample_stack, n);
        column_drop_front(&self->sample_idle, n);
    }
    return PyLong_FromSize_t(n);
}

static PyObject *sampler_interned(Sampler *self, PyObject *unused) {
    return Py_BuildValue("(nnn)", self->codes == NULL ? (Py_ssize_t)0 : PyList_GET_SIZE(self->codes),
                         (Py_ssize_t)self->frame_code.len, (Py_ssize_t)self->stack_parent.len);
}

static PyMethodDef sampler_methods[] = {
    {"sample", (PyCFunction)sampler_sample, METH_NOARGS,
     "Take one sample of every wanted thread but the caller; returns how many were recorded."},
    {"export", (PyCFunction)sampler_export, METH_NOARGS,
     "Everything recorded so far: codes, frame/stack/sample columns (bytes) and counters."},
    {"count", (PyCFunction)sampler_count, METH_NOARGS, "Samples recorded so far."},
    {"forget_before", (PyCFunction)sampler_forget_before, METH_O,
     "forget_before(ts_ns): drop the oldest samples taken before ts_ns; returns how many."},
    {"interned", (PyCFunction)sampler_interned, METH_NOARGS,
     "(code objects, frames, stack nodes) interned so far."},
    {"start_signals", (PyCFunction)sampler_start_signals, METH_VARARGS,
     "start_signals(rate_hz, seed=0): sample busy threads from a SIGPROF handler (Linux, 3.11+); "
     "RuntimeError with the reason when this process cannot."},
    {"drain", (PyCFunction)sampler_drain, METH_NOARGS,
     "Move the signal samples recorded so far into the columns; returns how many."},
    {"stop_signals", (PyCFunction)sampler_stop_signals, METH_VARARGS,
     "stop_signals(timeout_s=1.0): stop signal sampling, drain, restore SIGPROF; the counters."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject StackSamplerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stepscope._native.StackSampler",
    .tp_basicsize = sizeof(Sampler),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "StackSampler(max_samples, max_depth, thread_ids=None, idle_share=0.2, "
              "idle_window_ns=1000000): "
              "bounded in-process stack samples of Python threads.",
    .tp_new = sampler_new,
    .tp_init = (initproc)sampler_init,
    .tp_dealloc = (destructor)sampler_dealloc,
    .tp_methods = sampler_methods,
};

int ss_sampler_init(PyObject *module) {
    if (PyType_Ready(&StackSamplerType) < 0) {
        return -1;
    }
    Py_INCREF(&StackSamplerType);
    if (PyModule_AddObject(module, "StackSampler", (PyObject *)&StackSamplerType) < 0) {
        Py_DECREF(&StackSamplerType);
        return -1;
    }
    return PyModule_AddFunctions(module, module_functions);
}
