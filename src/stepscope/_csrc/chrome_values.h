/* What the C trace readers and writer share: a growable byte buffer, the string-table intern, and
 * the rules for times and pid/tid labels (the same as trace/chrome_reader.py's _plain_us/_plain_label). */
#ifndef STEPSCOPE_CHROME_VALUES_H
#define STEPSCOPE_CHROME_VALUES_H

#include "stepscope_native.h"

#include <math.h>
#include <string.h>

/* pid/tid values at or above this are string labels (LABEL_BASE + string id). */
#define LABEL_BASE ((int64_t)1 << 62)

typedef struct {
    char *data;
    size_t len;
    size_t cap;
} SsBuffer;

static inline int ss_buffer_reserve(SsBuffer *b, size_t extra) {
    if (b->len + extra <= b->cap) {
        return 0;
    }
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) {
        cap *= 2;
    }
    char *data = PyMem_Realloc(b->data, cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

static inline int ss_buffer_put(SsBuffer *b, const void *s, size_t n) {
    if (ss_buffer_reserve(b, n) < 0) {
        return -1;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    return 0;
}

/* Id of a string in a builder's table (ids dict + strings list), added when new; -1 on error. */
int64_t ss_intern(PyObject *text, PyObject *ids, PyObject *strings);

/* Interns a span's strings (NULL: none; labels become LABEL_BASE + id) and appends its row to the
 * seven span columns (name, cat, pid, tid, start_ns, dur_ns, args); 0, or -1 with an error. */
int ss_span_append(SsBuffer cols[7], PyObject *ids, PyObject *strings, PyObject *name, PyObject *cat,
                   int64_t pid, PyObject *pid_label, int64_t tid, PyObject *tid_label, int64_t start,
                   int64_t dur, int32_t args_ref);

/* The seven span columns as a tuple of bytes (new reference; NULL with an error). */
PyObject *ss_span_columns(const SsBuffer cols[7]);

/* Integer microseconds to ns; 0 when out of the int64 range. */
static inline int ss_us_int_to_ns(long long us, int64_t *ns) {
    if (us > INT64_MAX / 1000 || us < -(INT64_MAX / 1000)) {
        return 0;
    }
    *ns = (int64_t)us * 1000;
    return 1;
}

/* Float microseconds to ns as Python's round(us * 1000); 0 when not finite or out of range. */
static inline int ss_us_double_to_ns(double us, int64_t *ns) {
    double v = us * 1000.0;
    if (!isfinite(v) || fabs(v) >= 9.2e18) {
        return 0;
    }
    *ns = (int64_t)nearbyint(v); /* round half to even, like round() */
    return 1;
}

/* An integer pid/tid in range; 0 when not. */
static inline int ss_label_from_int(long long value, int64_t *label) {
    if (value < -LABEL_BASE || value >= LABEL_BASE) {
        return 0;
    }
    *label = value;
    return 1;
}

/* An integral float pid/tid in range; 0 when not. */
static inline int ss_label_from_double(double value, int64_t *label) {
    if (!(value == floor(value) && value >= -(double)LABEL_BASE && value < (double)LABEL_BASE)) {
        return 0;
    }
    *label = (int64_t)value;
    return 1;
}

#endif
