/* Monotonic clock: TSC ticks converted to CLOCK_MONOTONIC-aligned ns, or CLOCK_MONOTONIC itself.
 *
 * Python decides the source (stepscope.clock checks the CPU flag and the kernel's clocksource) and
 * calls _clock_configure once.  Conversion is linear from an anchor pair (ticks, ns) with a 32.32
 * fixed-point slope; _clock_refine lengthens the calibration baseline while keeping the mapping
 * continuous, so converted times never jump backwards.  All access happens with the GIL held. */
#include "stepscope_native.h"

#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <x86intrin.h>
#define SS_HAVE_TSC 1
#else
#define SS_HAVE_TSC 0
#endif

typedef struct {
    uint64_t anchor_ticks;
    int64_t anchor_ns;
    uint64_t mult; /* ns per tick, 32.32 fixed point */
} Calibration;

static int use_tsc = 0;
static Calibration cal = {0, 0, (uint64_t)1 << 32};
static uint64_t first_ticks = 0; /* long-baseline origin for refinement */
static int64_t first_ns = 0;

static inline int64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline uint64_t read_tsc(void) {
#if SS_HAVE_TSC
    return __rdtsc();
#else
    return 0;
#endif
}

uint64_t ss_ticks(void) {
    return use_tsc ? read_tsc() : (uint64_t)monotonic_ns();
}

int64_t ss_ticks_to_ns(uint64_t ticks) {
    if (!use_tsc) {
        return (int64_t)ticks;
    }
    int64_t delta = (int64_t)(ticks - cal.anchor_ticks);
    __int128 scaled = (__int128)delta * (__int128)cal.mult;
    return cal.anchor_ns + (int64_t)(scaled >> 32);
}

int64_t ss_now_ns(void) {
    return ss_ticks_to_ns(ss_ticks());
}

/* One (ticks, ns) pair taken as close together as possible: the tightest of a few tries. */
static void paired_reading(uint64_t *ticks, int64_t *ns) {
    uint64_t best_width = UINT64_MAX;
    for (int i = 0; i < 7; i++) {
        uint64_t before = read_tsc();
        int64_t mono = monotonic_ns();
        uint64_t after = read_tsc();
        if (after - before < best_width) {
            best_width = after - before;
            *ticks = before + (after - before) / 2;
            *ns = mono;
        }
    }
}

static int invariant_tsc_flag(void) {
#if SS_HAVE_TSC
    unsigned int eax, ebx, ecx, edx;
    if (!__get_cpuid(0x80000000u, &eax, &ebx, &ecx, &edx) || eax < 0x80000007u) {
        return 0;
    }
    if (!__get_cpuid(0x80000007u, &eax, &ebx, &ecx, &edx)) {
        return 0;
    }
    return (edx >> 8) & 1;
#else
    return 0;
#endif
}

static PyObject *py_configure(PyObject *self, PyObject *args) {
    int want_tsc;
    double calibrate_seconds = 0.002;
    if (!PyArg_ParseTuple(args, "p|d", &want_tsc, &calibrate_seconds)) {
        return NULL;
    }
    if (!want_tsc || !invariant_tsc_flag()) {
        use_tsc = 0;
        Py_RETURN_FALSE;
    }
    uint64_t t0, t1;
    int64_t n0, n1;
    paired_reading(&t0, &n0);
    int64_t until = n0 + (int64_t)(calibrate_seconds * 1e9);
    Py_BEGIN_ALLOW_THREADS
    while (monotonic_ns() < until) {
    }
    Py_END_ALLOW_THREADS
    paired_reading(&t1, &n1);
    if (t1 <= t0 || n1 <= n0) {
        use_tsc = 0;
        Py_RETURN_FALSE;
    }
    cal.anchor_ticks = t1;
    cal.anchor_ns = n1;
    cal.mult = (uint64_t)(((__int128)(n1 - n0) << 32) / (__int128)(t1 - t0));
    first_ticks = t0;
    first_ns = n0;
    use_tsc = 1;
    Py_RETURN_TRUE;
}

static PyObject *py_refine(PyObject *self, PyObject *unused) {
    if (!use_tsc) {
        Py_RETURN_NONE;
    }
    uint64_t t;
    int64_t n;
    paired_reading(&t, &n);
    if (t <= first_ticks || n <= first_ns) {
        Py_RETURN_NONE;
    }
    /* Continuity: the new line starts where the old one is now; only the slope changes. */
    int64_t converted_now = ss_ticks_to_ns(t);
    cal.mult = (uint64_t)(((__int128)(n - first_ns) << 32) / (__int128)(t - first_ticks));
    cal.anchor_ticks = t;
    cal.anchor_ns = converted_now;
    return PyLong_FromLongLong(converted_now - n);
}

static PyObject *py_now_ns(PyObject *self, PyObject *unused) {
    return PyLong_FromLongLong(ss_now_ns());
}

static PyObject *py_ticks(PyObject *self, PyObject *unused) {
    return PyLong_FromUnsignedLongLong(ss_ticks());
}

static PyObject *py_ticks_to_ns(PyObject *self, PyObject *arg) {
    uint64_t ticks = PyLong_AsUnsignedLongLong(arg);
    if (ticks == (uint64_t)-1 && PyErr_Occurred()) {
        return NULL;
    }
    return PyLong_FromLongLong(ss_ticks_to_ns(ticks));
}

static PyObject *py_ticks_per_second(PyObject *self, PyObject *unused) {
    if (!use_tsc) {
        return PyFloat_FromDouble(1e9);
    }
    return PyFloat_FromDouble(1e9 * 4294967296.0 / (double)cal.mult);
}

static PyMethodDef clock_methods[] = {
    {"_clock_configure", py_configure, METH_VARARGS,
     "Select TSC (if the CPU has an invariant TSC) or CLOCK_MONOTONIC; returns whether TSC is used."},
    {"_clock_refine", py_refine, METH_NOARGS,
     "Lengthen the TSC calibration baseline; returns the offset from CLOCK_MONOTONIC in ns."},
    {"now_ns", py_now_ns, METH_NOARGS, "Monotonic time in ns."},
    {"ticks", py_ticks, METH_NOARGS, "Raw clock ticks (TSC or ns)."},
    {"ticks_to_ns", py_ticks_to_ns, METH_O, "Convert raw ticks to monotonic ns."},
    {"ticks_per_second", py_ticks_per_second, METH_NOARGS, "Calibrated tick rate."},
    {NULL, NULL, 0, NULL},
};

int ss_clock_init(PyObject *module) {
    return PyModule_AddFunctions(module, clock_methods);
}
