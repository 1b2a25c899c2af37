/* The allocation hook of profile_memory: exact per-step totals of the Python heap, sampled sites.
 *
 * The hook wraps the PYMEM_DOMAIN_MEM and PYMEM_DOMAIN_OBJ allocators (PyMem_SetAllocator, the
 * originals kept and chained to).  Both domains are only called with the GIL held, so the GIL is
 * the lock: the hot path takes none.  The raw domain is left alone: pymalloc itself calls it for
 * blocks over 512 bytes (counting both would count them twice) and the interpreter calls it
 * without the GIL.  Free-threaded builds are refused at start (the caller falls back to
 * tracemalloc).
 *
 * Exact totals.  A free names only a pointer, so each block allocated while the hook is on is
 * remembered with the size it was requested with (alloc_blocks.h: a page map for small blocks,
 * a table for the others): its free is counted with that size, and a block allocated before the
 * hook (not remembered) is not counted when freed, the same totals tracemalloc keeps.  A size
 * header in front of each block was not used: it would change the alignment the domain
 * promises, and a block allocated with a header before the hook stops would reach the original
 * free() with the wrong pointer afterwards.
 *
 * Sampled sites.  Sampling is by bytes, a Poisson process with a mean distance of `mean` bytes:
 * a countdown drawn from an exponential distribution is decreased by each allocation's size; the
 * allocation that takes it to zero is sampled, weighted back by size / (1 - exp(-size / mean)),
 * the inverse of its chance to be sampled.  Allocations of `large` bytes or more are always
 * sampled (weight = size).  A sample records the calling thread's Python frames (code object and
 * instruction offset, read by sampler_walk.c without allocating); its free is recorded too, so
 * the reader can replay which samples were alive at any point.  Events go to a bounded buffer
 * (drops are counted); `peak_mark` is the number of events recorded when the step's peak was
 * last raised, so the samples alive at the peak are those recorded before it and not yet freed.
 */
#include "stepscope_native.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "alloc_blocks.h"
#include "sampler_signal.h"

#define SS_HOOK_FRAMES 24
#define SS_HOOK_LAYERS 4
#define SS_SAMPLED_BIT ((uint64_t)1 << 63)

typedef struct {
    uintptr_t ptr;
    uint64_t size;    /* 0 for a free */
    double weight;
    int64_t t_ns;
    int32_t nframes;
    void *codes[SS_HOOK_FRAMES];
    int32_t positions[SS_HOOK_FRAMES];
} ss_event;

/* One installation of the hook on both domains; a layer left in a chain by an unhook that could
 * not restore the originals stays a pass-through (active == 0) for the life of the process. */
typedef struct {
    PyMemAllocatorEx original;
    int active;
} ss_layer;

static ss_layer layers[SS_HOOK_LAYERS][2]; /* [layer][0: MEM, 1: OBJ] */
static int layers_used = 0;
static int current_layer = -1;
static int passthrough_layers = 0;

#if defined(__GNUC__)
static _Thread_local int paused __attribute__((tls_model("initial-exec"))) = 0;
#else
static _Thread_local int paused = 0;
#endif

static struct {
    int64_t current, step_peak, interval_peak;
    uint64_t step_allocated, step_freed, step_allocs, step_frees;
    int64_t countdown;
    double mean;
    uint64_t large;
    uint64_t rng;
    ss_event *events;
    size_t n_events, events_capacity, max_events;
    uint64_t first_seq;  /* sequence number of events[0] */
    uint64_t peak_mark;  /* sequence number after the last event recorded at the step's peak */
    uint64_t dropped;    /* samples lost to a full buffer */
    uint64_t lost_frees; /* frees of sampled blocks lost to a failed buffer growth */
    uint64_t samples;
} hs;

/* -- sampling --------------------------------------------------------------------------------- */

static inline uint64_t next_random(void) {
    uint64_t x = hs.rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    hs.rng = x;
    return x * 0x2545F4914F6CDD1DULL;
}

static int64_t next_gap(void) {
    double u = ((double)(next_random() >> 11) + 0.5) / 9007199254740992.0; /* (0, 1) */
    double gap = -log(u) * hs.mean;
    return gap < 1.0 ? 1 : (int64_t)gap;
}

/* A slot for one event.  Samples stop at max_events per drain (dropped and counted); the frees
 * of sampled blocks are never capped (they are bounded by the samples alive): a lost free would
 * leave its sample alive forever in the reader's replay. */
static ss_event *new_event(int is_free) {
    if (hs.n_events >= hs.max_events && !is_free) {
        hs.dropped++;
        return NULL;
    }
    if (hs.n_events == hs.events_capacity) {
        size_t capacity = hs.events_capacity ? hs.events_capacity * 2 : 256;
        if (capacity > hs.max_events && !is_free) {
            capacity = hs.max_events;
        }
        ss_event *events = (ss_event *)realloc(hs.events, capacity * sizeof(ss_event));
        if (events == NULL) {
            if (is_free) {
                hs.lost_frees++;
            } else {
                hs.dropped++;
            }
            return NULL;
        }
        hs.events = events;
        hs.events_capacity = capacity;
    }
    return &hs.events[hs.n_events++];
}

/* Record a sample; 0 when it was dropped (its block is then not marked as sampled). */
static int record_sample(uintptr_t ptr, uint64_t size, double weight) {
    ss_event *e = new_event(0);
    if (e == NULL) {
        return 0;
    }
    hs.samples++;
    e->ptr = ptr;
    e->size = size;
    e->weight = weight;
    e->t_ns = ss_now_ns();
    int truncated = 0;
    int n = ss_walk_this_thread(e->codes, e->positions, SS_HOOK_FRAMES, &truncated);
    e->nframes = n < 0 ? 0 : n;
    for (int k = 0; k < e->nframes; k++) {
        Py_INCREF((PyObject *)e->codes[k]);
    }
    return 1;
}

static void record_free(uintptr_t ptr) {
    ss_event *e = new_event(1);
    if (e != NULL) {
        e->ptr = ptr;
        e->size = 0;
        e->weight = 0.0;
        e->t_ns = 0;
        e->nframes = 0;
    }
}

/* -- the hot path ----------------------------------------------------------------------------- */

static inline void on_alloc(void *p, size_t size) {
    uint64_t entry = (uint64_t)size;
    if (size >= hs.large) {
        if (record_sample((uintptr_t)p, size, (double)size)) {
            entry |= SS_SAMPLED_BIT;
        }
    } else {
        hs.countdown -= (int64_t)size;
        if (hs.countdown <= 0) {
            double chance = 1.0 - exp(-(double)size / hs.mean);
            if (record_sample((uintptr_t)p, size, chance > 0 ? (double)size / chance : hs.mean)) {
                entry |= SS_SAMPLED_BIT;
            }
            hs.countdown = next_gap();
        }
    }
    if (block_put((uintptr_t)p, entry) < 0) {
        return;
    }
    hs.current += (int64_t)size;
    hs.step_allocated += size;
    hs.step_allocs++;
    if (hs.current > hs.step_peak) {
        hs.step_peak = hs.current;
        hs.peak_mark = hs.first_seq + hs.n_events;
    }
    if (hs.current > hs.interval_peak) {
        hs.interval_peak = hs.current;
    }
}

static inline void on_free(void *p) {
    uint64_t entry = block_take((uintptr_t)p);
    if (entry == UINT64_MAX) {
        return;
    }
    uint64_t size = entry & ~SS_SAMPLED_BIT;
    hs.current -= (int64_t)size;
    hs.step_freed += size;
    hs.step_frees++;
    if (entry & SS_SAMPLED_BIT) {
        record_free((uintptr_t)p);
    }
}

/* From 3.12 a sub-interpreter may run under its own GIL, while the allocator hooks are shared
 * by the whole process: only the interpreter that started the hook (whose GIL guards the
 * table) is counted; the others pass through. */
static PyInterpreterState *hook_interp = NULL;

static inline int own_interpreter(void) {
#if PY_VERSION_HEX >= 0x030D0000
    PyThreadState *ts = PyThreadState_GetUnchecked();
    return ts != NULL && ts->interp == hook_interp;
#elif PY_VERSION_HEX >= 0x030C0000
    PyThreadState *ts = _PyThreadState_UncheckedGet();
    return ts != NULL && ts->interp == hook_interp;
#else
    return 1;
#endif
}

/* Allocations of a paused thread (stepscope's own work) are not counted; frees always are, so
 * a counted block freed during a pause leaves the table. */
static inline int counting(ss_layer *layer) { return layer->active && !paused && own_interpreter(); }

static inline int counting_frees(ss_layer *layer) { return layer->active && own_interpreter(); }

static void *hook_malloc(void *ctx, size_t size) {
    ss_layer *layer = (ss_layer *)ctx;
    void *p = layer->original.malloc(layer->original.ctx, size);
    if (p != NULL && counting(layer)) {
        on_alloc(p, size);
    }
    return p;
}

static void *hook_calloc(void *ctx, size_t nelem, size_t elsize) {
    ss_layer *layer = (ss_layer *)ctx;
    void *p = layer->original.calloc(layer->original.ctx, nelem, elsize);
    if (p != NULL && counting(layer)) {
        on_alloc(p, nelem * elsize);
    }
    return p;
}

static void *hook_realloc(void *ctx, void *ptr, size_t size) {
    ss_layer *layer = (ss_layer *)ctx;
    void *p = layer->original.realloc(layer->original.ctx, ptr, size);
    if (p != NULL && counting_frees(layer)) {
        if (ptr != NULL) {
            on_free(ptr);
        }
        if (!paused) {
            on_alloc(p, size);
        }
    }
    return p;
}

static void hook_free(void *ctx, void *ptr) {
    ss_layer *layer = (ss_layer *)ctx;
    if (ptr != NULL && counting_frees(layer)) {
        on_free(ptr);
    }
    layer->original.free(layer->original.ctx, ptr);
}

/* -- numpy's data allocations ------------------------------------------------------------------
 * numpy (>= 1.22) allocates array data through a handler, by default a static struct of its own
 * (PyDataMem_DefaultHandler, entry 306 of its C API table, layout version 1).  Its allocator
 * functions are swapped for these while the hook runs, so every context and thread that uses the
 * default handler is counted (PyDataMem_SetHandler would cover only the calling context).  numpy
 * may allocate without the GIL: such calls pass through uncounted.  Arrays made before or after
 * the swap reach the free they were made with: no block carries anything of the hook's. */
typedef struct {
    void *ctx;
    void *(*malloc)(void *ctx, size_t size);
    void *(*calloc)(void *ctx, size_t nelem, size_t elsize);
    void *(*realloc)(void *ctx, void *ptr, size_t new_size);
    void (*free)(void *ctx, void *ptr, size_t size);
} ss_numpy_allocator;

typedef struct {
    char name[127];
    uint8_t version;
    ss_numpy_allocator allocator;
} ss_numpy_handler;

static ss_numpy_handler *numpy_handler = NULL;
static ss_numpy_allocator numpy_original;
static int numpy_active = 0;

static inline int numpy_counting(void) {
    return numpy_active && PyGILState_Check() && own_interpreter();
}

static void *np_malloc(void *ctx, size_t size) {
    void *p = numpy_original.malloc(numpy_original.ctx, size);
    if (p != NULL && numpy_counting() && !paused) {
        on_alloc(p, size);
    }
    return p;
}

static void *np_calloc(void *ctx, size_t nelem, size_t elsize) {
    void *p = numpy_original.calloc(numpy_original.ctx, nelem, elsize);
    if (p != NULL && numpy_counting() && !paused) {
        on_alloc(p, nelem * elsize);
    }
    return p;
}

static void *np_realloc(void *ctx, void *ptr, size_t size) {
    void *p = numpy_original.realloc(numpy_original.ctx, ptr, size);
    if (p != NULL && numpy_counting()) {
        if (ptr != NULL) {
            on_free(ptr);
        }
        if (!paused) {
            on_alloc(p, size);
        }
    }
    return p;
}

static void np_free(void *ctx, void *ptr, size_t size) {
    if (ptr != NULL && numpy_counting()) {
        on_free(ptr);
    }
    numpy_original.free(numpy_original.ctx, ptr, size);
}

static void numpy_unhook(void) {
    if (numpy_handler != NULL) {
        numpy_active = 0;
        numpy_handler->allocator = numpy_original;
        numpy_handler = NULL;
    }
}

static PyObject *hook_numpy(PyObject *self, PyObject *api) {
    (void)self;
    if (current_layer < 0) {
        PyErr_SetString(PyExc_RuntimeError, "start the allocation hook before hooking numpy");
        return NULL;
    }
    if (numpy_handler != NULL) {
        Py_RETURN_TRUE;
    }
    void **table = (void **)PyCapsule_GetPointer(api, NULL);
    if (table == NULL) {
        return NULL;
    }
    PyObject *capsule = *(PyObject **)table[306];
    if (capsule == NULL || !PyCapsule_IsValid(capsule, "mem_handler")) {
        Py_RETURN_FALSE;
    }
    ss_numpy_handler *handler = (ss_numpy_handler *)PyCapsule_GetPointer(capsule, "mem_handler");
    if (handler == NULL || handler->version != 1 || handler->allocator.malloc == np_malloc) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    numpy_original = handler->allocator;
    numpy_handler = handler;
    ss_numpy_allocator ours = {NULL, np_malloc, np_calloc, np_realloc, np_free};
    handler->allocator = ours;
    numpy_active = 1;
    Py_RETURN_TRUE;
}

static const PyMemAllocatorDomain domains[2] = {PYMEM_DOMAIN_MEM, PYMEM_DOMAIN_OBJ};

static int is_ours(const PyMemAllocatorEx *a, ss_layer *layer) {
    return a->malloc == hook_malloc && a->ctx == (void *)layer;
}

/* -- the Python interface --------------------------------------------------------------------- */

/* Take the buffered events out of the buffer before any Python object is made or released:
 * that can run a collection whose frees record events (into a fresh buffer). */
static ss_event *detach_events(size_t *n) {
    ss_event *events = hs.events;
    *n = hs.n_events;
    hs.first_seq += hs.n_events;
    hs.events = NULL;
    hs.n_events = hs.events_capacity = 0;
    return events;
}

static void release_events(ss_event *events, size_t n) {
    for (size_t i = 0; i < n; i++) {
        for (int k = 0; k < events[i].nframes; k++) {
            Py_DECREF((PyObject *)events[i].codes[k]);
        }
    }
    free(events);
}

static void release_all(void) {
    paused++;
    blocks_release();
    size_t n;
    ss_event *events = detach_events(&n);
    release_events(events, n);
    while (hs.n_events) { /* frees recorded while releasing */
        events = detach_events(&n);
        release_events(events, n);
    }
    paused--;
}

static PyObject *hook_start(PyObject *self, PyObject *args) {
    (void)self;
    double mean;
    unsigned long long large, max_events, seed;
    if (!PyArg_ParseTuple(args, "dKKK", &mean, &large, &max_events, &seed)) {
        return NULL;
    }
#ifdef Py_GIL_DISABLED
    PyErr_SetString(PyExc_RuntimeError, "the allocation hook needs the GIL (free-threaded build)");
    return NULL;
#endif
    if (!ss_walk_available()) {
        PyErr_SetString(PyExc_RuntimeError, "the allocation hook reads frames on Python 3.11+ only");
        return NULL;
    }
    if (current_layer >= 0) {
        PyErr_SetString(PyExc_RuntimeError, "the allocation hook is already running");
        return NULL;
    }
    if (layers_used == SS_HOOK_LAYERS) {
        PyErr_SetString(PyExc_RuntimeError,
                        "the allocation hook was left in other hooks' chains too often to start again");
        return NULL;
    }
    if (!(mean >= 1.0) || max_events == 0) {
        PyErr_SetString(PyExc_ValueError, "mean must be >= 1 byte and max_events > 0");
        return NULL;
    }
    release_all();
    memset(&hs, 0, sizeof(hs));
    hs.mean = mean;
    hs.large = large;
    hs.max_events = (size_t)max_events;
    hs.rng = seed ? seed : 0x9E3779B97F4A7C15ULL;
    hs.countdown = next_gap();
    if (blocks_start() < 0) {
        return PyErr_NoMemory();
    }
    hook_interp = PyInterpreterState_Get();
    int layer = layers_used++;
    for (int d = 0; d < 2; d++) {
        ss_layer *l = &layers[layer][d];
        PyMem_GetAllocator(domains[d], &l->original);
        l->active = 1;
        PyMemAllocatorEx hook = {l, hook_malloc, hook_calloc, hook_realloc, hook_free};
        PyMem_SetAllocator(domains[d], &hook);
    }
    current_layer = layer;
    Py_RETURN_NONE;
}

static PyObject *hook_stop(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    if (current_layer < 0) {
        Py_RETURN_NONE;
    }
    numpy_unhook();
    int restored = 1;
    for (int d = 0; d < 2; d++) {
        ss_layer *l = &layers[current_layer][d];
        PyMemAllocatorEx now;
        PyMem_GetAllocator(domains[d], &now);
        l->active = 0;
        if (is_ours(&now, l)) {
            PyMem_SetAllocator(domains[d], &l->original);
        } else {
            restored = 0; /* someone hooked after us: stay in their chain as a pass-through */
        }
    }
    if (restored) {
        layers_used = current_layer; /* the layer's slots can be used again */
    } else {
        passthrough_layers++;
    }
    current_layer = -1;
    release_all();
    return PyBool_FromLong(restored);
}

static PyObject *hook_end_step(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    PyObject *row = Py_BuildValue("{sLsLsKsKsKsKsK}", "current", (long long)hs.current, "peak",
                                  (long long)hs.step_peak, "allocated",
                                  (unsigned long long)hs.step_allocated, "freed",
                                  (unsigned long long)hs.step_freed, "allocs",
                                  (unsigned long long)hs.step_allocs, "frees",
                                  (unsigned long long)hs.step_frees, "peak_mark",
                                  (unsigned long long)hs.peak_mark);
    if (row != NULL) {
        hs.step_peak = hs.current;
        hs.step_allocated = hs.step_freed = hs.step_allocs = hs.step_frees = 0;
        hs.peak_mark = hs.first_seq + hs.n_events;
    }
    return row;
}

static PyObject *hook_poll(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    PyObject *out = Py_BuildValue("LL", (long long)hs.current, (long long)hs.interval_peak);
    hs.interval_peak = hs.current;
    return out;
}

static PyObject *hook_drain(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    paused++;
    unsigned long long first = (unsigned long long)hs.first_seq;
    size_t n;
    ss_event *events = detach_events(&n);
    PyObject *list = PyList_New((Py_ssize_t)n);
    PyObject *result = NULL;
    if (list == NULL) {
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        ss_event *e = &events[i];
        PyObject *frames = PyTuple_New(e->nframes);
        if (frames == NULL) {
            Py_DECREF(list);
            goto done;
        }
        for (int k = 0; k < e->nframes; k++) {
            PyObject *pair = Py_BuildValue("(Oi)", (PyObject *)e->codes[k], (int)e->positions[k]);
            if (pair == NULL) {
                Py_DECREF(frames);
                Py_DECREF(list);
                goto done;
            }
            PyTuple_SET_ITEM(frames, k, pair);
        }
        PyObject *item = Py_BuildValue("(KKdLN)", (unsigned long long)e->ptr,
                                       (unsigned long long)e->size, e->weight, (long long)e->t_ns,
                                       frames);
        if (item == NULL) {
            Py_DECREF(list);
            goto done;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    result = Py_BuildValue("(KN)", first, list);
done:
    release_events(events, n);
    paused--;
    return result;
}

static PyObject *hook_stats(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    size_t own = blocks_own_bytes() + hs.events_capacity * sizeof(ss_event);
    return Py_BuildValue("{sKsKsKsKsKsKsisn}", "own_bytes", (unsigned long long)own, "live_blocks",
                         (unsigned long long)blocks_live(), "untracked", (unsigned long long)bs.untracked,
                         "dropped", (unsigned long long)hs.dropped, "lost_frees",
                         (unsigned long long)hs.lost_frees, "samples",
                         (unsigned long long)hs.samples, "passthrough_layers", passthrough_layers,
                         "buffered", (Py_ssize_t)hs.n_events);
}

static PyObject *hook_pause(PyObject *self, PyObject *arg) {
    (void)self;
    int on = PyObject_IsTrue(arg);
    if (on < 0) {
        return NULL;
    }
    paused += on ? 1 : (paused > 0 ? -1 : 0);
    Py_RETURN_NONE;
}

static PyMethodDef hook_methods[] = {
    {"_alloc_hook_start", hook_start, METH_VARARGS,
     "Hook the MEM and OBJ domains: (mean_bytes, large_bytes, max_events, seed)."},
    {"_alloc_hook_stop", hook_stop, METH_NOARGS,
     "Unhook; True when the originals were restored, False when left as a pass-through."},
    {"_alloc_hook_end_step", hook_end_step, METH_NOARGS,
     "The closing step's exact counters; the next step starts from the current bytes."},
    {"_alloc_hook_poll", hook_poll, METH_NOARGS, "(current, highest since the last poll)."},
    {"_alloc_hook_drain", hook_drain, METH_NOARGS,
     "(first sequence number, [(ptr, size, weight, t_ns, frames)]), size 0 for a free."},
    {"_alloc_hook_stats", hook_stats, METH_NOARGS, "The hook's own memory, drops and samples."},
    {"_alloc_hook_numpy", hook_numpy, METH_O,
     "Count numpy's default data allocations too (its _ARRAY_API capsule); False if unsupported."},
    {"_alloc_hook_pause", hook_pause, METH_O,
     "Stop (True) or resume (False) counting this thread's allocations (nests)."},
    {NULL, NULL, 0, NULL},
};

int ss_alloc_hook_init(PyObject *module) { return PyModule_AddFunctions(module, hook_methods); }
