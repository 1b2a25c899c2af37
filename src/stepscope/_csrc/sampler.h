/* The in-process stack sampler (sampler.c): the state its files share.
 *
 * The files, by job: sampler.c the StackSampler type (thread mode's sample(), signal mode's start,
 * drain and stop, export) and the threads' CPU clocks; sampler_columns.c the interned frames and
 * stacks and the sample columns; sampler_drain.c signal mode's drain of the engine's rings, and
 * the watch on code objects freed while samples name them; sampler_signal.c / sampler_walk.c
 * the signal engine (sampler_signal.h). */
#ifndef STEPSCOPE_SAMPLER_H
#define STEPSCOPE_SAMPLER_H

#include "stepscope_native.h"

#include "sampler_signal.h"

#include <frameobject.h>

#define SS_HAVE_LASTI (PY_VERSION_HEX >= 0x030B0000)      /* PyFrame_GetLasti, native ids */
#define SS_NATIVE_TIDS (PY_VERSION_HEX >= 0x030B0000)
#define MAX_CLOCKS 1024

/* Shared by the sampler's files only. */
#if defined(__GNUC__)
#define SS_SAMPLER_INTERNAL __attribute__((visibility("hidden")))
#else
#define SS_SAMPLER_INTERNAL
#endif

/* A small open-addressing map: (a, b) -> int32. */
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

/* A growable column of fixed-size items. */
typedef struct {
    char *data;
    size_t len, cap, item;
} Column;

/* Per-thread CPU clocks for idle detection. */
typedef struct {
    uint64_t tid;
    int64_t cpu_ns;
    int64_t wall_ns;
    uint64_t tick;
    int idle;
} ThreadClock;

/* One StackSampler: its settings, interned tables, sample columns and counters. */
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

/* The id a thread is known by: its native id where Python keeps one (3.11+). */
static inline uint64_t thread_key(PyThreadState *ts) {
#if SS_NATIVE_TIDS
    return (uint64_t)ts->native_thread_id;
#else
    return (uint64_t)ts->thread_id;
#endif
}

/* Whether a thread is one the sampler was asked to sample. */
static inline int wanted(Sampler *self, uint64_t tid) {
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

/* sampler_columns.c: append to a column (-1 when out of memory); a column as bytes; the ids of a
 * frame (code object, position) and of a stack node (parent, frame), new ones appended to their
 * columns (-1 / -2 with an exception set); the stack id of a frame chain, innermost first (-1 for
 * none, -2 with an exception set; `frame` is a new reference it releases); one sample. */
SS_SAMPLER_INTERNAL int sm_column_push(Column *c, const void *value);
SS_SAMPLER_INTERNAL PyObject *sm_column_bytes(const Column *c);
SS_SAMPLER_INTERNAL int32_t sm_intern_frame(Sampler *self, PyCodeObject *code, int pos);
SS_SAMPLER_INTERNAL int32_t sm_intern_stack(Sampler *self, int32_t parent, int32_t frame);
SS_SAMPLER_INTERNAL int32_t sm_stack_of_frame(Sampler *self, PyFrameObject *frame);
SS_SAMPLER_INTERNAL int sm_push_sample(Sampler *self, int64_t tid, int64_t ts, int32_t stack,
                                       uint8_t idle);

/* sampler_drain.c: slots in the engine for the wanted threads; the engine's samples into the
 * columns (0, or -1 with an exception set); the code-object watch of a signal-mode run (whether
 * it could be set up); the module's _sampler_after_fork_in_child (0 or -1). */
SS_SAMPLER_INTERNAL void sm_add_threads(Sampler *self);
SS_SAMPLER_INTERNAL int sm_drain_into(Sampler *self);
SS_SAMPLER_INTERNAL void sm_watch_codes(Sampler *self);
SS_SAMPLER_INTERNAL int sm_codes_watched(void);
SS_SAMPLER_INTERNAL void sm_unwatch_codes(void);
SS_SAMPLER_INTERNAL int sm_drain_add(PyObject *module);

#endif
