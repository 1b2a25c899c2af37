/* The signal sampler engine: unbiased in-process stack samples (Linux).
 *
 * A timing thread written in C (no Python thread state, never takes the GIL, every signal
 * blocked) wakes at exponentially distributed wall-clock intervals.  At each wake-up it reads the
 * scheduler state of every thread that has a slot (/proc/self/task/<tid>/stat, read with pread on
 * a descriptor kept open): a running, runnable or stopped thread is busy and gets a SIGPROF
 * through tgkill; a blocked one gets an idle tick (a timestamp in its idle ring), because
 * signalling a blocked thread would interrupt its system call.  (Without the stat file, the
 * thread sampler's rule: busy when it used at least `idle_share` of a CPU since the previous
 * reading.)  The SIGPROF handler runs in the busy thread itself, at whatever instruction it
 * was executing, so samples land where time is spent (not where the thread next offers the GIL);
 * it walks the thread's Python frames (sampler_walk.c) into the thread's slot: a single-producer
 * ring of (timestamp, depth, code pointers, instruction offsets) preallocated at max_depth.
 * The drain (sampler_drain.c, with the GIL) empties the rings, interns frames and keeps each code
 * object alive from then on, and records idle ticks with the thread's stack read under the GIL.
 *
 * Ownership: one run at a time in a process.  The previous SIGPROF action must be the default
 * or "ignore" (a program or profiler with its own SIGPROF handler keeps it: start fails with a
 * reason and the caller uses the thread sampler).  Stop joins the timing thread, waits until
 * every signal sent has been handled, and only then puts the previous action back; if some are
 * still in flight the handler stays installed but inert and the slots are kept. */
#include "stepscope_native.h"

#include "sampler_signal.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__linux__)
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>
#define SS_SIGNALS 1
#else
#define SS_SIGNALS 0
#endif

#define MAX_SLOTS 256
#define RING 256       /* busy samples a thread can hold between two drains */
#define IDLE_RING 1024 /* idle ticks a thread can hold between two drains */

typedef struct {
    int64_t ts;
    int32_t depth;
    int32_t truncated;
} Record;

typedef struct {
    _Atomic int64_t tid;
    _Atomic int alive; /* cleared by the timing thread once the thread's clock is gone */
    /* busy ring: written by the handler in the thread, read by the drain */
    _Atomic uint32_t head, tail;
    Record records[RING];
    void **codes;       /* RING * max_depth */
    int32_t *positions; /* RING * max_depth */
    /* idle ring: written by the timing thread, read by the drain */
    _Atomic uint32_t idle_head, idle_tail;
    int64_t idle_ts[IDLE_RING];
    /* the timing thread's idle verdict */
    int stat_fd; /* /proc/self/task/<tid>/stat, or -1: then the CPU-share rule */
    int64_t cpu_ns, wall_ns;
    int idle;
    /* 1 from a tgkill until the handler ran: at most one signal in flight per thread, so none
     * is merged with another (standard signals do not queue) and stop knows when all are in */
    _Atomic int in_flight;
    /* counters */
    _Atomic uint64_t sent, done, late, ring_full, no_frames;
    _Atomic int64_t handler_ns;
} Slot;

static struct {
    _Atomic int owned;   /* a run owns the engine (start .. release) */
    _Atomic int running; /* the handler records samples */
    int installed;       /* our handler is the SIGPROF action */
    int stale;           /* slots of a stopped run kept: signals were still in flight */
    struct sigaction previous;
    SsSigSettings settings;
    Slot *slots[MAX_SLOTS];
    _Atomic int n_slots;
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int cv_ready;
    int stop;
    _Atomic uint64_t ticks, signals;
    _Atomic int taken; /* the program installed its own SIGPROF handler during the run */
    int restored, replaced;
} E = {.mu = PTHREAD_MUTEX_INITIALIZER};

int ss_sig_busy(void) { return atomic_load(&E.owned); }

#if SS_SIGNALS

/* -- the handler (async-signal-safe: no allocation, no locks, errno preserved) ------------- */

static void record(Slot *s) {
    int64_t start = ss_now_ns();
    uint32_t head = atomic_load_explicit(&s->head, memory_order_relaxed);
    uint32_t tail = atomic_load_explicit(&s->tail, memory_order_acquire);
    if (head - tail >= RING) {
        atomic_fetch_add_explicit(&s->ring_full, 1, memory_order_relaxed);
        return;
    }
    uint32_t i = head % RING;
    size_t base = (size_t)i * (size_t)E.settings.max_depth;
    int truncated = 0;
    int depth = ss_walk_this_thread(s->codes + base, s->positions + base, E.settings.max_depth,
                                    &truncated);
    if (depth <= 0) {
        atomic_fetch_add_explicit(&s->no_frames, 1, memory_order_relaxed);
        return;
    }
    s->records[i].ts = start;
    s->records[i].depth = depth;
    s->records[i].truncated = truncated;
    atomic_store_explicit(&s->head, head + 1, memory_order_release);
    atomic_fetch_add_explicit(&s->handler_ns, ss_now_ns() - start, memory_order_relaxed);
}

static void on_sigprof(int sig, siginfo_t *info, void *context) {
    (void)sig;
    (void)info;
    (void)context;
    int saved_errno = errno;
    int64_t tid = (int64_t)syscall(SYS_gettid);
    int n = atomic_load_explicit(&E.n_slots, memory_order_acquire);
    for (int i = 0; i < n; i++) {
        Slot *s = E.slots[i];
        if (atomic_load_explicit(&s->tid, memory_order_relaxed) == tid) {
            if (atomic_load_explicit(&E.running, memory_order_acquire)) {
                record(s);
            }
            atomic_fetch_add_explicit(&s->done, 1, memory_order_relaxed);
            atomic_store_explicit(&s->in_flight, 0, memory_order_release);
            break;
        }
    }
    errno = saved_errno;
}

/* -- the timing thread ---------------------------------------------------------------------- */

static int64_t thread_cpu_ns(int64_t tid) {
    /* The kernel's per-thread scheduler clock id (what pthread_getcpuclockid computes). */
    clockid_t cid = (clockid_t)((~(uint32_t)tid << 3) | 6u);
    struct timespec spec;
    if (clock_gettime(cid, &spec) != 0) {
        return -1;
    }
    return (int64_t)spec.tv_sec * 1000000000LL + spec.tv_nsec;
}

static int64_t mono_ns(void) {
    struct timespec spec;
    clock_gettime(CLOCK_MONOTONIC, &spec);
    return (int64_t)spec.tv_sec * 1000000000LL + spec.tv_nsec;
}

/* An exponential draw of mean 1 (xorshift64*). */
static double draw_exp(uint64_t *state) {
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    double u = (double)((x * 0x2545F4914F6CDD1DULL) >> 11) * (1.0 / 9007199254740992.0);
    return -log(1.0 - u);
}

/* The scheduler state letter of a thread from its stat file, or 0 when unreadable. */
static char thread_state(int fd) {
    char buf[512];
    ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
    if (n <= 0) {
        return 0;
    }
    buf[n] = 0;
    char *close = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    return close != NULL && close[1] == ' ' ? close[2] : 0;
}

/* Whether a thread is idle: blocked in the kernel (sleeping, waiting on I/O or the GIL).
 * Running, runnable and stopped threads (preempted, or paused by a debugger) are busy: their
 * next instruction is where they are.  Without a stat file, the CPU-share rule of thread mode. */
static int slot_idle(Slot *s, int64_t cpu, int64_t now) {
    if (s->stat_fd >= 0) {
        char state = thread_state(s->stat_fd);
        if (state != 0) {
            return !(state == 'R' || state == 't' || state == 'T');
        }
    }
    if (now - s->wall_ns >= E.settings.idle_window_ns) {
        s->idle = (double)(cpu - s->cpu_ns) < E.settings.idle_share * (double)(now - s->wall_ns);
        s->cpu_ns = cpu;
        s->wall_ns = now;
    }
    return s->idle;
}

static int handler_is_ours(void) {
    struct sigaction current;
    return sigaction(SIGPROF, NULL, &current) != 0 ||
           ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_sigprof);
}

static void tick(pid_t pid) {
    atomic_fetch_add_explicit(&E.ticks, 1, memory_order_relaxed);
    /* a handler the program installed mid-run must never get our signals: stop sending */
    if (atomic_load_explicit(&E.taken, memory_order_relaxed) || !handler_is_ours()) {
        atomic_store(&E.taken, 1);
        return;
    }
    int64_t now = ss_now_ns();
    int n = atomic_load_explicit(&E.n_slots, memory_order_acquire);
    for (int i = 0; i < n; i++) {
        Slot *s = E.slots[i];
        if (!atomic_load_explicit(&s->alive, memory_order_acquire)) {
            continue;
        }
        int64_t tid = atomic_load_explicit(&s->tid, memory_order_relaxed);
        int64_t cpu = thread_cpu_ns(tid);
        if (cpu < 0) { /* the thread is gone */
            atomic_store(&s->alive, 0);
            continue;
        }
        if (slot_idle(s, cpu, now)) {
            uint32_t head = atomic_load_explicit(&s->idle_head, memory_order_relaxed);
            if (head - atomic_load_explicit(&s->idle_tail, memory_order_acquire) >= IDLE_RING) {
                atomic_fetch_add_explicit(&s->ring_full, 1, memory_order_relaxed);
                continue;
            }
            s->idle_ts[head % IDLE_RING] = now;
            atomic_store_explicit(&s->idle_head, head + 1, memory_order_release);
            continue;
        }
        if (atomic_load_explicit(&s->in_flight, memory_order_acquire)) {
            /* the previous signal is not handled yet (the thread waits for a CPU) */
            atomic_fetch_add_explicit(&s->late, 1, memory_order_relaxed);
            continue;
        }
        atomic_store_explicit(&s->in_flight, 1, memory_order_release);
        if (syscall(SYS_tgkill, pid, (pid_t)tid, SIGPROF) != 0) {
            atomic_store(&s->in_flight, 0);
            atomic_store(&s->alive, 0);
            continue;
        }
        atomic_fetch_add_explicit(&s->sent, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&E.signals, 1, memory_order_relaxed);
    }
}

static void *timing_main(void *unused) {
    (void)unused;
    uint64_t rng = E.settings.seed * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL;
    if (rng == 0) {
        rng = 1;
    }
    double mean_ns = 1e9 / E.settings.rate_hz;
    pid_t pid = getpid();
    int64_t next = mono_ns();
    pthread_mutex_lock(&E.mu);
    for (;;) {
        next += (int64_t)(draw_exp(&rng) * mean_ns) + 1;
        struct timespec until = {(time_t)(next / 1000000000LL), (long)(next % 1000000000LL)};
        while (!E.stop && pthread_cond_timedwait(&E.cv, &E.mu, &until) != ETIMEDOUT) {
        }
        if (E.stop) {
            break;
        }
        pthread_mutex_unlock(&E.mu);
        tick(pid);
        int64_t now = mono_ns();
        if (next < now) { /* behind: restart the schedule rather than sample twice in a row */
            next = now;
        }
        pthread_mutex_lock(&E.mu);
    }
    pthread_mutex_unlock(&E.mu);
    return NULL;
}

/* -- control (called with the GIL held) ---------------------------------------------------- */

/* Whether every signal sent has been handled.  A thread that ended with our signal pending
 * (sent while it was on its way out, or while it blocked SIGPROF) never handles it: the signal
 * went with the thread, so its slot counts as handled; otherwise one such thread would keep
 * every later run of the process off the signal engine. */
static int all_handled(void) {
    int n = atomic_load(&E.n_slots);
    for (int i = 0; i < n; i++) {
        Slot *s = E.slots[i];
        if (!atomic_load_explicit(&s->in_flight, memory_order_acquire)) {
            continue;
        }
        if (thread_cpu_ns(atomic_load(&s->tid)) >= 0) {
            return 0;
        }
        atomic_store(&s->alive, 0);
        atomic_store_explicit(&s->in_flight, 0, memory_order_release);
    }
    return 1;
}

static void free_slots(void) {
    int n = atomic_load(&E.n_slots);
    atomic_store(&E.n_slots, 0);
    for (int i = 0; i < n; i++) {
        if (E.slots[i]->stat_fd >= 0) {
            close(E.slots[i]->stat_fd);
        }
        free(E.slots[i]->codes);
        free(E.slots[i]->positions);
        free(E.slots[i]);
        E.slots[i] = NULL;
    }
}

static int fail(char *why, size_t len, const char *message) {
    snprintf(why, len, "%s", message);
    return -1;
}

int ss_sig_start(const SsSigSettings *settings, char *why, size_t why_len) {
    if (!ss_walk_available()) {
        return fail(why, why_len, "the signal sampler needs Python 3.11 or later");
    }
    if (atomic_load(&E.owned)) {
        return fail(why, why_len, "another signal-sampling run owns SIGPROF in this process");
    }
    if (E.stale) {
        if (!all_handled()) {
            return fail(why, why_len, "signals of a previous run are still in flight");
        }
        free_slots();
        E.stale = 0;
    }
    struct sigaction current;
    if (sigaction(SIGPROF, NULL, &current) != 0) {
        return fail(why, why_len, "cannot read the SIGPROF action");
    }
    if (!E.installed && (current.sa_flags & SA_SIGINFO || (current.sa_handler != SIG_DFL &&
                                                            current.sa_handler != SIG_IGN))) {
        return fail(why, why_len,
                    "SIGPROF already has a handler (the program or another profiler uses it)");
    }
    sigset_t mask;
    if (pthread_sigmask(SIG_BLOCK, NULL, &mask) == 0 && sigismember(&mask, SIGPROF) == 1) {
        return fail(why, why_len, "SIGPROF is blocked in this thread");
    }
    if (!E.cv_ready) {
        pthread_condattr_t attr;
        pthread_condattr_init(&attr);
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        if (pthread_cond_init(&E.cv, &attr) != 0) {
            pthread_condattr_destroy(&attr);
            return fail(why, why_len, "cannot create the timing thread's condition variable");
        }
        pthread_condattr_destroy(&attr);
        E.cv_ready = 1;
    }
    E.settings = *settings;
    atomic_store(&E.ticks, 0);
    atomic_store(&E.signals, 0);
    E.restored = E.replaced = 0;
    atomic_store(&E.taken, 0);
    E.stop = 0;
    if (!E.installed) {
        struct sigaction action;
        memset(&action, 0, sizeof(action));
        action.sa_sigaction = on_sigprof;
        action.sa_flags = SA_SIGINFO | SA_RESTART;
        sigemptyset(&action.sa_mask);
        if (sigaction(SIGPROF, &action, &E.previous) != 0) {
            return fail(why, why_len, "cannot install the SIGPROF handler");
        }
        E.installed = 1;
    }
    atomic_store(&E.owned, 1);
    atomic_store(&E.running, 1);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the timing thread takes no signal */
    int rc = pthread_create(&E.thread, NULL, timing_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        atomic_store(&E.running, 0);
        ss_sig_stop(0);
        ss_sig_release();
        return fail(why, why_len, "cannot start the timing thread");
    }
    E.thread_started = 1;
    return 0;
}

int ss_sig_add_thread(int64_t tid) {
    int n = atomic_load(&E.n_slots);
    for (int i = 0; i < n; i++) {
        Slot *s = E.slots[i];
        if (atomic_load(&s->tid) == tid) {
            if (atomic_load(&s->alive)) {
                return 1;
            }
            return 1; /* a kernel id seen before; its thread ended (ids are rarely reused) */
        }
    }
    if (n == MAX_SLOTS) {
        return -1;
    }
    Slot *s = calloc(1, sizeof(Slot));
    size_t frames = (size_t)RING * (size_t)E.settings.max_depth;
    if (s == NULL || (s->codes = calloc(frames, sizeof(void *))) == NULL ||
        (s->positions = calloc(frames, sizeof(int32_t))) == NULL) {
        if (s != NULL) {
            free(s->codes);
        }
        free(s);
        return -1;
    }
    s->cpu_ns = thread_cpu_ns(tid);
    if (s->cpu_ns < 0) {
        free(s->codes);
        free(s->positions);
        free(s);
        return 1; /* gone already */
    }
    s->wall_ns = ss_now_ns();
    s->idle = 0;
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/task/%lld/stat", (long long)tid);
    s->stat_fd = open(path, O_RDONLY | O_CLOEXEC);
    atomic_store(&s->tid, tid);
    atomic_store(&s->alive, 1);
    E.slots[n] = s;
    atomic_store_explicit(&E.n_slots, n + 1, memory_order_release);
    return 0;
}

int ss_sig_drain(void *ctx, ss_busy_fn busy, ss_idle_fn idle) {
    int n = atomic_load(&E.n_slots);
    int64_t stamps[64];
    for (int i = 0; i < n; i++) {
        Slot *s = E.slots[i];
        int64_t tid = atomic_load(&s->tid);
        uint32_t head = atomic_load_explicit(&s->head, memory_order_acquire);
        uint32_t tail = atomic_load_explicit(&s->tail, memory_order_relaxed);
        for (; tail != head; tail++) {
            Record *r = &s->records[tail % RING];
            size_t base = (size_t)(tail % RING) * (size_t)E.settings.max_depth;
            if (busy(ctx, tid, r->ts, s->codes + base, s->positions + base, r->depth,
                     r->truncated) < 0) {
                atomic_store_explicit(&s->tail, tail + 1, memory_order_release);
                return -1;
            }
        }
        atomic_store_explicit(&s->tail, tail, memory_order_release);
        head = atomic_load_explicit(&s->idle_head, memory_order_acquire);
        tail = atomic_load_explicit(&s->idle_tail, memory_order_relaxed);
        while (tail != head) {
            int count = 0;
            for (; tail != head && count < 64; tail++) {
                stamps[count++] = s->idle_ts[tail % IDLE_RING];
            }
            atomic_store_explicit(&s->idle_tail, tail, memory_order_release);
            if (idle(ctx, tid, stamps, count) < 0) {
                return -1;
            }
        }
    }
    return 0;
}

int ss_sig_pending_code(const void *code, int forget) {
    /* Records in [tail, head) are published and the handler never writes them again; only the
     * drain (serialised with this by the GIL) moves the tail. */
    int found = 0;
    int n = atomic_load(&E.n_slots);
    for (int i = 0; i < n; i++) {
        Slot *s = E.slots[i];
        uint32_t head = atomic_load_explicit(&s->head, memory_order_acquire);
        for (uint32_t tail = atomic_load_explicit(&s->tail, memory_order_relaxed); tail != head;
             tail++) {
            Record *r = &s->records[tail % RING];
            void **codes = s->codes + (size_t)(tail % RING) * (size_t)E.settings.max_depth;
            for (int d = 0; d < r->depth; d++) {
                if (codes[d] == code) {
                    found++;
                    if (!forget) {
                        return found;
                    }
                    codes[d] = NULL;
                }
            }
        }
    }
    return found;
}

void ss_sig_stop(int64_t timeout_ns) {
    if (E.thread_started) {
        pthread_mutex_lock(&E.mu);
        E.stop = 1;
        pthread_cond_signal(&E.cv);
        pthread_mutex_unlock(&E.mu);
        pthread_join(E.thread, NULL);
        E.thread_started = 0;
    }
    int64_t deadline = mono_ns() + timeout_ns;
    while (!all_handled() && mono_ns() < deadline) {
        struct timespec pause = {0, 100000};
        nanosleep(&pause, NULL);
    }
    atomic_store(&E.running, 0);
    /* once the program's handler took SIGPROF, ours never runs again: nothing is in flight */
    if (!atomic_load(&E.taken) && !all_handled()) {
        E.stale = 1; /* leave the handler installed (inert) and the slots in place */
        return;
    }
    struct sigaction current;
    if (E.installed && sigaction(SIGPROF, NULL, &current) == 0) {
        if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_sigprof) {
            sigaction(SIGPROF, &E.previous, NULL);
            E.restored = 1;
        } else {
            E.replaced = 1; /* someone else's handler now: leave it */
        }
        E.installed = 0;
    }
}

void ss_sig_release(void) {
    if (!E.stale) {
        free_slots();
    }
    atomic_store(&E.owned, 0);
}

void ss_sig_after_fork_in_child(void) {
    E.thread_started = 0; /* threads do not survive a fork */
    E.stop = 0;
    atomic_store(&E.running, 0);
    int n = atomic_load(&E.n_slots);
    for (int i = 0; i < n; i++) {
        atomic_store(&E.slots[i]->in_flight, 0); /* pending signals are not inherited */
    }
    if (E.installed) {
        sigaction(SIGPROF, &E.previous, NULL);
        E.installed = 0;
    }
    free_slots();
    E.stale = 0;
    pthread_mutex_init(&E.mu, NULL); /* the timing thread may have held it at the fork */
    if (E.cv_ready) {
        pthread_cond_init(&E.cv, NULL);
    }
    atomic_store(&E.owned, 0);
}

void ss_sig_stats(SsSigStats *out) {
    memset(out, 0, sizeof(*out));
    out->ticks = atomic_load(&E.ticks);
    out->signals = atomic_load(&E.signals);
    int n = atomic_load(&E.n_slots);
    out->threads = n;
    for (int i = 0; i < n; i++) {
        Slot *s = E.slots[i];
        out->handled += atomic_load(&s->done);
        out->late += atomic_load(&s->late);
        out->no_frames += atomic_load(&s->no_frames);
        out->ring_full += atomic_load(&s->ring_full);
        out->handler_ns += atomic_load(&s->handler_ns);
    }
    out->restored = E.restored;
    out->replaced = E.replaced || atomic_load(&E.taken);
}

#else /* no signal sampler on this platform */

int ss_sig_start(const SsSigSettings *settings, char *why, size_t why_len) {
    (void)settings;
    snprintf(why, why_len, "the signal sampler needs Linux");
    return -1;
}
int ss_sig_add_thread(int64_t tid) { return -1; }
int ss_sig_drain(void *ctx, ss_busy_fn busy, ss_idle_fn idle) { return 0; }
int ss_sig_pending_code(const void *code, int forget) { return 0; }
void ss_sig_stop(int64_t timeout_ns) {}
void ss_sig_release(void) {}
void ss_sig_after_fork_in_child(void) {}
void ss_sig_stats(SsSigStats *out) { memset(out, 0, sizeof(*out)); }

#endif
