/* The deterministic Python function tracer (pure-Python twin: stepscope.collectors.python_twin):
 * the state its files share.
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
 * the event path is the filter, once per new code object.
 *
 * The files, by job: tracer.c the event path (both ways in, record buffers, per-thread stacks,
 * threads), kept in one file so its helpers inline; tracer_intern.c the interning of code objects
 * and C functions (the filter's decisions); tracer_session.c configure, start, stop and the
 * module's entry points; tracer_export.c the records into the trace's span columns. */
#ifndef STEPSCOPE_TRACER_H
#define STEPSCOPE_TRACER_H

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

/* Shared by the tracer's files only: hidden, so reads compile as direct as a static's. */
#if defined(__GNUC__)
#define SS_TRACER_INTERNAL __attribute__((visibility("hidden")))
#else
#define SS_TRACER_INTERNAL
#endif

/* The one tracing session of the process (all fields touched with the GIL held). */
extern SS_TRACER_INTERNAL Session ss_tracer;

static inline uint64_t now_ticks(void) {
#if SS_INLINE_TSC
    if (ss_tracer.tsc) {
        return __rdtsc();
    }
#endif
    return ss_ticks();
}

static inline size_t slot_hash(const void *k1, const void *k2) {
    uint64_t h = ((uint64_t)(uintptr_t)k1 >> 4) ^ ((uint64_t)(uintptr_t)k2 * 0x9E3779B97F4A7C15ull);
    h *= 0xBF58476D1CE4E5B9ull;
    return (size_t)(h ^ (h >> 31));
}

static inline Slot *slot_find(const void *k1, const void *k2) {
    size_t mask = ss_tracer.slots_cap - 1;
    size_t i = slot_hash(k1, k2) & mask;
    for (;;) {
        Slot *s = &ss_tracer.slots[i];
        if (s->id == 0 || (s->k1 == k1 && s->k2 == k2)) {
            return s;
        }
        i = (i + 1) & mask;
    }
}

/* tracer_intern.c: a code object's or C function's slot, interned on first sight (NULL when out of
 * memory); the slot table grown (-1 when out of memory). */
SS_TRACER_INTERNAL Slot *tr_intern_code(PyObject *code);
SS_TRACER_INTERNAL Slot *tr_intern_c(PyMethodDef *ml, PyObject *self, PyObject *module);
SS_TRACER_INTERNAL int tr_slots_grow(void);

/* tracer.c: threads, their stacks and the ways in, for the session. */
SS_TRACER_INTERNAL ThreadBuf *tr_thread_new(PyThreadState *ts, unsigned long native_tid);
SS_TRACER_INTERNAL ThreadBuf *tr_thread_for(PyThreadState *ts);
SS_TRACER_INTERNAL unsigned long tr_native_id_of(PyThreadState *ts);
SS_TRACER_INTERNAL void tr_push_open_frame(ThreadBuf *tb, const void *key, uint32_t id);
SS_TRACER_INTERNAL void tr_close_frames(ThreadBuf *tb, uint64_t now);
SS_TRACER_INTERNAL void tr_forget_thread_cache(void);
#if SS_LEGACY_PROFILE
SS_TRACER_INTERNAL int tr_install_profile(ThreadBuf *tb, PyThreadState *ts, int chain);
SS_TRACER_INTERNAL void tr_uninstall_profiles(void);
#endif
/* Registers the ways in (the sys.monitoring callbacks, the 3.10/3.11 thread hook); 0 or -1. */
SS_TRACER_INTERNAL int tr_events_add(PyObject *module);

/* tracer_export.c: registers _tracer_export; 0 or -1. */
SS_TRACER_INTERNAL int tr_export_add(PyObject *module);

#endif
