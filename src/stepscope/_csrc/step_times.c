/* StepRing: every step's start and end in a bounded ring, one clock reading per call
 * (the C half of stepscope/step_times.py; its twin is PyStepRing there).
 *
 * With phases (the step tables), end() also stores the time each phase (data wait, optimizer,
 * GC, a collective in flight) was open during the step and the thread's CPU time, so the step
 * tables need no hook of their own in step(): enter(k)/leave(k) bracket a phase, nested or
 * overlapping calls counting once (the collective phase is entered on the thread that starts a
 * collective and left on the backend's thread that completes it, always under the GIL), and a
 * phase open across a step boundary is split between the two steps.  The collective phase
 * counts only while none of the others is open: time in data wait, the optimizer or GC is the
 * thread's own, even with a collective in flight (and a completion whose callback waited for
 * the GIL while the thread collected garbage is not stretched over the collection).  The thread's CPU clock is a system
 * call (about 1 us on a VM), so end() reads it only when SS_CPU_READ_NS have passed since the
 * last reading: a step that long gets its own CPU time, shorter ones share the reading's CPU in
 * proportion to their wall time.  take() hands over only rows whose CPU time is settled;
 * settle() reads the clock of the thread that began the first step from any thread (the writer
 * thread's poll); what the open step spent before that reading is credited to the steps settled
 * (at most one step's CPU, shared among those of the last millisecond or more). */
#include "stepscope_native.h"

#include <pthread.h>
#include <string.h>
#include <time.h>

#define SS_PHASES 4     /* data wait, optimizer, GC, collective */
#define SS_COLLECTIVE 3 /* counted only while no other phase is open */
#define SS_WIDE_COLUMNS (SS_PHASES + 1) /* the phases, then CPU ns */
#define SS_CPU_READ_NS 1000000LL        /* the CPU clock is read at most once a millisecond */

typedef struct {
    PyObject_HEAD
    Py_ssize_t capacity;
    int64_t *starts;
    int64_t *ends;
    uint8_t *kinds;
    long long count; /* steps ended so far (the ring keeps the last `capacity`) */
    Py_ssize_t slot; /* where the open or next step goes */
    int open;
    int phases;                        /* 1: the wide columns below are kept */
    int64_t *wide[SS_WIDE_COLUMNS];    /* per slot: each phase's ns, then CPU ns */
    int64_t phase_ns[SS_PHASES];       /* accumulated in the open step */
    int64_t phase_start[SS_PHASES];    /* when the phase was entered (depth > 0) */
    long phase_depth[SS_PHASES];
    clockid_t cpu_clock;               /* the CPU clock of the thread that began the first step */
    pthread_t cpu_owner;               /* that thread (without a clock id, only it may read) */
    int64_t last_cpu;                  /* thread CPU ns at the last reading */
    int64_t cpu_read_at;               /* monotonic ns of the last reading */
    long long settled;                 /* steps whose CPU ns is stored (the rest wait) */
    int cpu_started;
} StepRing;

static int64_t thread_cpu_ns(clockid_t clock) {
    struct timespec ts;
    if (clock_gettime(clock, &ts) != 0) {
        return -1; /* the thread has ended: its CPU time is unknown */
    }
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void ring_free(StepRing *self) {
    PyMem_Free(self->starts);
    PyMem_Free(self->ends);
    PyMem_Free(self->kinds);
    self->starts = self->ends = NULL;
    self->kinds = NULL;
    for (int c = 0; c < SS_WIDE_COLUMNS; c++) {
        PyMem_Free(self->wide[c]);
        self->wide[c] = NULL;
    }
}

static int ring_init(StepRing *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"capacity", "phases", NULL};
    Py_ssize_t capacity = 0;
    int phases = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n|p", keywords, &capacity, &phases)) {
        return -1;
    }
    if (capacity < 1) {
        PyErr_Format(PyExc_ValueError, "capacity must be 1 or more, got %zd", capacity);
        return -1;
    }
    ring_free(self);
    self->starts = PyMem_Calloc((size_t)capacity, sizeof(int64_t));
    self->ends = PyMem_Calloc((size_t)capacity, sizeof(int64_t));
    self->kinds = PyMem_Calloc((size_t)capacity, 1);
    if (self->starts == NULL || self->ends == NULL || self->kinds == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (phases) {
        for (int c = 0; c < SS_WIDE_COLUMNS; c++) {
            self->wide[c] = PyMem_Calloc((size_t)capacity, sizeof(int64_t));
            if (self->wide[c] == NULL) {
                PyErr_NoMemory();
                return -1;
            }
        }
    }
    for (int k = 0; k < SS_PHASES; k++) {
        self->phase_ns[k] = self->phase_start[k] = 0;
        self->phase_depth[k] = 0;
    }
    self->phases = phases;
    self->last_cpu = self->cpu_read_at = 0;
    self->settled = 0;
    self->cpu_started = 0;
    self->capacity = capacity;
    self->count = 0;
    self->slot = 0;
    self->open = 0;
    return 0;
}

static void ring_dealloc(StepRing *self) {
    ring_free(self);
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
    int64_t now = ss_now_ns();
    if (self->phases && !self->cpu_started) {
        self->cpu_owner = pthread_self();
        if (pthread_getcpuclockid(self->cpu_owner, &self->cpu_clock) != 0) {
            self->cpu_clock = CLOCK_THREAD_CPUTIME_ID; /* then only this thread may settle */
        }
        self->last_cpu = thread_cpu_ns(self->cpu_clock);
        self->cpu_read_at = now;
        self->cpu_started = 1;
    }
    self->starts[self->slot] = now;
    Py_RETURN_NONE;
}

/* Read the loop thread's CPU clock at `now` and share what it counted since the last reading
 * among the steps ended since, in proportion to the wall time from one's end to the next. */
static void settle_at(StepRing *self, int64_t now) {
    if (self->settled == self->count) {
        return;
    }
    if (self->cpu_clock == CLOCK_THREAD_CPUTIME_ID && !pthread_equal(pthread_self(), self->cpu_owner)) {
        return; /* this thread's clock is not the loop's */
    }
    int64_t cpu = thread_cpu_ns(self->cpu_clock);
    if (cpu < 0) {
        cpu = self->last_cpu; /* unknown: the steps get 0 rather than a made-up value */
    }
    double spent = (double)(cpu - self->last_cpu);
    long long first = self->settled;
    if (first < self->count - self->capacity) {
        first = self->count - self->capacity;
    }
    Py_ssize_t last = (Py_ssize_t)((self->count - 1) % self->capacity);
    double wall = (double)(self->ends[last] - self->cpu_read_at);
    int64_t previous = self->cpu_read_at;
    for (long long n = first; n < self->count; n++) {
        Py_ssize_t slot = (Py_ssize_t)(n % self->capacity);
        int64_t interval = self->ends[slot] - previous;
        previous = self->ends[slot];
        self->wide[SS_PHASES][slot] = wall > 0 ? (int64_t)(spent * (double)interval / wall) : 0;
    }
    self->settled = self->count;
    self->last_cpu = cpu;
    self->cpu_read_at = now;
}

/* Whether phase k is being counted now: open, and for the collective, no other phase open. */
static int counting(const StepRing *self, int k) {
    if (self->phase_depth[k] <= 0) {
        return 0;
    }
    if (k != SS_COLLECTIVE) {
        return 1;
    }
    for (int j = 0; j < SS_PHASES; j++) {
        if (j != SS_COLLECTIVE && self->phase_depth[j] > 0) {
            return 0;
        }
    }
    return 1;
}

static PyObject *ring_end(StepRing *self, PyObject *Py_UNUSED(ignored)) {
    if (self->open) {
        int64_t now = ss_now_ns();
        Py_ssize_t slot = self->slot;
        self->ends[slot] = now;
        if (self->phases) {
            int others_open = 0; /* the collective counts only while none of these is open */
            for (int k = 0; k < SS_PHASES; k++) {
                others_open |= k != SS_COLLECTIVE && self->phase_depth[k] > 0;
            }
            for (int k = 0; k < SS_PHASES; k++) {
                int open = self->phase_depth[k] > 0 && (k != SS_COLLECTIVE || !others_open);
                if (open) { /* open across the boundary: split it */
                    self->phase_ns[k] += now - self->phase_start[k];
                    self->phase_start[k] = now;
                }
                self->wide[k][slot] = self->phase_ns[k];
                self->phase_ns[k] = 0;
            }
        }
        self->open = 0;
        self->count += 1;
        self->slot = (Py_ssize_t)(self->count % self->capacity);
        if (self->phases && now - self->cpu_read_at >= SS_CPU_READ_NS) {
            settle_at(self, now);
        }
    }
    Py_RETURN_NONE;
}

static int phase_of(PyObject *arg, long *k) {
    *k = PyLong_AsLong(arg);
    if (*k == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (*k < 0 || *k >= SS_PHASES) {
        PyErr_Format(PyExc_ValueError, "phase must be 0 to %d, got %ld", SS_PHASES - 1, *k);
        return -1;
    }
    return 0;
}

/* Change phase k's depth by `by`, starting or stopping the count of every phase whose counting
 * that changes (k itself, and the collective when another phase opens or closes). */
static void move_phase(StepRing *self, long k, long by) {
    int before[SS_PHASES];
    for (int j = 0; j < SS_PHASES; j++) {
        before[j] = counting(self, j);
    }
    self->phase_depth[k] += by;
    int64_t now = 0;
    for (int j = 0; j < SS_PHASES; j++) {
        int after = counting(self, j);
        if (after != before[j]) {
            if (now == 0) {
                now = ss_now_ns();
            }
            if (after) {
                self->phase_start[j] = now;
            } else {
                self->phase_ns[j] += now - self->phase_start[j];
            }
        }
    }
}

static PyObject *ring_enter(StepRing *self, PyObject *arg) {
    long k;
    if (phase_of(arg, &k) < 0) {
        return NULL;
    }
    move_phase(self, k, 1);
    Py_RETURN_NONE;
}

static PyObject *ring_leave(StepRing *self, PyObject *arg) {
    long k;
    if (phase_of(arg, &k) < 0) {
        return NULL;
    }
    if (self->phase_depth[k] > 0) {
        move_phase(self, k, -1);
    }
    Py_RETURN_NONE;
}

/* The ring's rows [first, count) as one contiguous bytes object (unwrapping the ring). */
static PyObject *column_slice(const char *base, Py_ssize_t width, Py_ssize_t capacity,
                              long long first, long long count) {
    Py_ssize_t n = (Py_ssize_t)(count - first);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * width);
    if (out == NULL) {
        return NULL;
    }
    char *dst = PyBytes_AS_STRING(out);
    Py_ssize_t slot = (Py_ssize_t)(first % capacity);
    Py_ssize_t head = capacity - slot < n ? capacity - slot : n;
    memcpy(dst, base + slot * width, (size_t)(head * width));
    memcpy(dst + head * width, base, (size_t)((n - head) * width));
    return out;
}

static PyObject *ring_settle(StepRing *self, PyObject *Py_UNUSED(ignored)) {
    if (self->phases && self->cpu_started) {
        settle_at(self, ss_now_ns());
    }
    Py_RETURN_NONE;
}

static PyObject *ring_take(StepRing *self, PyObject *arg) {
    long long since = PyLong_AsLongLong(arg);
    if (since == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (!self->phases) {
        PyErr_SetString(PyExc_RuntimeError, "take() needs a StepRing made with phases=True");
        return NULL;
    }
    long long count = self->settled;
    long long first = since < 0 ? 0 : since;
    if (first > count) {
        first = count;
    }
    if (first < self->count - self->capacity) {
        first = self->count - self->capacity;
    }
    if (first > count) {
        first = count;
    }
    PyObject *result = PyTuple_New(5 + SS_WIDE_COLUMNS);
    if (result == NULL) {
        return NULL;
    }
    PyObject *items[5 + SS_WIDE_COLUMNS];
    int i = 0;
    items[i++] = PyLong_FromLongLong(first);
    items[i++] = PyLong_FromLongLong(count);
    items[i++] = column_slice((const char *)self->starts, 8, self->capacity, first, count);
    items[i++] = column_slice((const char *)self->ends, 8, self->capacity, first, count);
    items[i++] = column_slice((const char *)self->kinds, 1, self->capacity, first, count);
    for (int c = 0; c < SS_WIDE_COLUMNS; c++) {
        items[i++] = column_slice((const char *)self->wide[c], 8, self->capacity, first, count);
    }
    for (int j = 0; j < i; j++) {
        if (items[j] == NULL) {
            for (int m = 0; m < i; m++) {
                Py_XDECREF(items[m]);
            }
            Py_DECREF(result);
            return NULL;
        }
    }
    for (int j = 0; j < i; j++) {
        PyTuple_SET_ITEM(result, j, items[j]);
    }
    return result;
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
    {"enter", (PyCFunction)ring_enter, METH_O,
     "enter(phase): phase 0 data wait, 1 optimizer, 2 GC, 3 collective begins (nested or "
     "overlapping: counted once)."},
    {"leave", (PyCFunction)ring_leave, METH_O, "leave(phase): the phase entered last ends now."},
    {"take", (PyCFunction)ring_take, METH_O,
     "take(since): (first, count, starts, ends, kinds, data, optimizer, gc, collective, cpu): "
     "the rows of "
     "steps first..count-1 ended since step `since` whose CPU time is settled (older ones are "
     "gone: first > since), as int64 (kinds uint8) column bytes; phases=True only."},
    {"settle", (PyCFunction)ring_settle, METH_NOARGS,
     "settle(): read the CPU clock now (on the thread that calls end()), settling every ended "
     "step's CPU time."},
    {"export", (PyCFunction)ring_export, METH_NOARGS,
     "export(): (starts, ends, kinds, count): the ring's int64 ns and uint8 kind columns as bytes, "
     "and the steps ended so far."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject StepRingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stepscope._native.StepRing",
    .tp_basicsize = sizeof(StepRing),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "StepRing(capacity, phases=False): every step's start and end (monotonic ns) and "
              "kind, the last `capacity` steps kept; with phases, each step's phase and CPU ns.",
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
