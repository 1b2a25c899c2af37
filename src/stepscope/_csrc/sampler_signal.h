/* The signal sampler engine (sampler_signal.c) and the frame walk it runs in its handler
 * (sampler_walk.c).  Plain C: this header is included by a Py_BUILD_CORE file as well. */
#ifndef STEPSCOPE_SAMPLER_SIGNAL_H
#define STEPSCOPE_SAMPLER_SIGNAL_H

#include <stddef.h>
#include <stdint.h>

/* 1 when this Python's frames can be walked from a signal handler (3.11 and later). */
int ss_walk_available(void);

/* The calling thread's Python frames, innermost first: code object pointers and instruction
 * byte offsets, at most max_depth (*truncated = 1 when more were left).  Async-signal-safe.
 * Returns the number of frames, or -1 when the thread has no Python thread state. */
int ss_walk_this_thread(void **codes, int32_t *positions, int max_depth, int *truncated);

typedef struct {
    double rate_hz;
    uint64_t seed;
    int max_depth;
    double idle_share;
    int64_t idle_window_ns;
} SsSigSettings;

/* A busy sample, handed to the drain's callback; return 0, or -1 to stop with an error set. */
typedef int (*ss_busy_fn)(void *ctx, int64_t tid, int64_t ts, void *const *codes,
                          const int32_t *positions, int depth, int truncated);
/* Idle ticks of one thread since the previous drain. */
typedef int (*ss_idle_fn)(void *ctx, int64_t tid, const int64_t *ts, int n);

typedef struct {
    uint64_t ticks;       /* timing-thread wake-ups */
    uint64_t signals;     /* signals sent to busy threads */
    uint64_t handled;     /* handler runs that found their thread */
    uint64_t late;        /* busy ticks skipped: the previous signal was not handled yet */
    uint64_t no_frames;   /* handler runs in a thread without a Python thread state */
    uint64_t ring_full;   /* samples lost because a ring was not drained in time */
    int64_t handler_ns;   /* time spent in the handler, all threads */
    int threads;          /* threads with a timer slot */
    int restored;         /* 1 when stop put the previous SIGPROF action back */
    int replaced;         /* 1 when someone else replaced our handler during the run */
} SsSigStats;

/* Install the handler and start the timing thread; -1 with a reason in `why` when this process
 * cannot use it (another run owns it, SIGPROF has a handler already, no frame walk, ...). */
int ss_sig_start(const SsSigSettings *settings, char *why, size_t why_len);
/* Give a thread (kernel id) a slot; 0 added, 1 already there, -1 no slot left. */
int ss_sig_add_thread(int64_t tid);
/* Move everything recorded so far to the callbacks; -1 if a callback failed. */
int ss_sig_drain(void *ctx, ss_busy_fn busy, ss_idle_fn idle);
/* Whether a busy sample recorded but not drained yet names `code` (a code object pointer); with
 * `forget`, every such pointer is replaced by NULL, which makes the drain drop the sample.  For a
 * code object about to be freed; runs with the GIL, like the drain.  Returns how many matched. */
int ss_sig_pending_code(const void *code, int forget);
/* Stop the timing thread, wait up to timeout_ns for signals in flight, restore the previous
 * action.  A final ss_sig_drain and ss_sig_release must follow. */
void ss_sig_stop(int64_t timeout_ns);
/* Free the run's memory (kept, and the handler left installed but inert, if signals were
 * still in flight at stop) and let another run start. */
void ss_sig_release(void);

/* In a child forked during a run: the timing thread and every signal in flight stayed in the
 * parent.  Put the SIGPROF action back, free the slots and let the child start its own run. */
void ss_sig_after_fork_in_child(void);
void ss_sig_stats(SsSigStats *out);
/* 1 while a run owns the engine. */
int ss_sig_busy(void);

#endif
