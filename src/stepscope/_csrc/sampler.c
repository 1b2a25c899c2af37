/* In-process stack sampler (pure-Python twin: stepscope.collectors.sampler_twin.PyStackSampler).
 *
 * Two ways to fill the same columns.  Signal mode (start_signals / drain / stop_signals, Linux,
 * Python 3.11+): the engine in sampler_signal.c records busy threads' stacks from a SIGPROF handler
 * and sampler_drain.c drains its rings under the GIL (see those files).  Thread mode: a Python
 * timing thread calls sample(), which runs with the GIL held, so every other thread is parked at
 * a safe point; it walks the Python frames of every
 * thread (or of the chosen native thread ids) through the public frame API, interns each
 * (code object, instruction offset) as a frame and each (parent, frame) pair as a stack node, and
 * appends one record per thread to bounded columns.  Lines are resolved only at export, so the hot
 * path never scans a line table.  A thread is idle when its CPU clock advanced by less than
 * `idle_share` of the wall time since its previous reading (taken at least `idle_window_ns`
 * earlier).  Frame 0 is the "[truncated]" marker placed at the root of stacks cut at max_depth
 * (the innermost frames are kept).  The files it is made of are named in sampler.h. */
#include "sampler.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* Record one thread's stack; `frame` is a new reference that this function releases. */
static int record_thread(Sampler *self, PyThreadState *ts, PyFrameObject *frame, uint64_t tid,
                         int64_t now) {
    int32_t stack = sm_stack_of_frame(self, frame);
    if (stack == -2) {
        return -1;
    }
    uint8_t idle = (uint8_t)thread_idle(self, ts, tid, now);
    if (sm_push_sample(self, (int64_t)tid, now, stack, idle) < 0) {
        return -1;
    }
    return 1;
}

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
    if (sm_column_push(&self->frame_code, &zero) < 0 || sm_column_push(&self->frame_pos, &marker_pos) < 0) {
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
        sm_unwatch_codes();
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
    sm_watch_codes(self);
    if (!sm_codes_watched()) {
        sm_unwatch_codes();
        ss_sig_stop(0);
        ss_sig_release();
        PyErr_SetString(PyExc_RuntimeError,
                        "no code watcher slot left: freed code objects could not be tracked");
        return NULL;
    }
    self->signals_on = 1;
    self->no_slot = 0;
    self->drain_tid = thread_key(PyThreadState_Get());
    sm_add_threads(self);
    Py_RETURN_NONE;
}

static PyObject *sampler_drain(Sampler *self, PyObject *unused) {
    if (!self->signals_on) {
        PyErr_SetString(PyExc_RuntimeError, "signal sampling is not running on this sampler");
        return NULL;
    }
    size_t before = self->sample_ts.len;
    if (sm_drain_into(self) < 0) {
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
    int rc = sm_drain_into(self);
    ss_sig_stats(&self->sig);
    sm_unwatch_codes();
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
        if (sm_column_push(&lines, &line) < 0) {
            free(lines.data);
            return PyErr_NoMemory();
        }
    }
    PyObject *codes_copy = PyList_GetSlice(self->codes, 0, PyList_GET_SIZE(self->codes));
    PyObject *result = Py_BuildValue(
        "{s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:n,s:K,s:L,s:O}", "codes", codes_copy,
        "frame_code", sm_column_bytes(&self->frame_code), "frame_line", sm_column_bytes(&lines),
        "stack_parent", sm_column_bytes(&self->stack_parent), "stack_frame",
        sm_column_bytes(&self->stack_frame), "sample_tid", sm_column_bytes(&self->sample_tid),
        "sample_ts", sm_column_bytes(&self->sample_ts), "sample_stack",
        sm_column_bytes(&self->sample_stack), "sample_idle", sm_column_bytes(&self->sample_idle),
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
    return sm_drain_add(module);
}
