/* Span nesting per (pid, tid) track: each span's parent, self time and fold flag (nest_spans; twin:
 * nest_spans_python in trace/nesting.py, whose docstrings define every rule followed here).
 *
 * Spans are sorted by (pid, tid, start, -dur, index) and walked with a stack per track.  A stretch of
 * a track (spans from one that starts with nothing open up to the next such one) in which some span
 * outlives its parent is swept again in time order, each stretch of time going to the latest started
 * span still open.  Times are added in 128 bits (start + dur of two int64 columns needs 65) and every
 * self time stored is checked to fit int64, as the twin's array('q') stores are. */
#include "stepscope_native.h"

#include <string.h>

__extension__ typedef __int128 wide_t;

#define SS_PAST_EVERY_END ((wide_t)1 << 65) /* later than any span's end */
#define SS_SORT_RUN 32                      /* runs sorted by insertion before merging */

typedef struct {
    int64_t pid, tid, start, dur;
    int32_t index;
} SpanRec;

/* The order (pid, tid, start, -dur, index). */
static inline int rec_before(const SpanRec *a, const SpanRec *b) {
    if (a->pid != b->pid) return a->pid < b->pid;
    if (a->tid != b->tid) return a->tid < b->tid;
    if (a->start != b->start) return a->start < b->start;
    if (a->dur != b->dur) return a->dur > b->dur;
    return a->index < b->index;
}

/* Sorts recs[0..n) (scratch: n more records); returns whichever of the two holds the result. */
static SpanRec *sort_recs(SpanRec *recs, SpanRec *scratch, Py_ssize_t n) {
    for (Py_ssize_t lo = 0; lo < n; lo += SS_SORT_RUN) {
        Py_ssize_t hi = lo + SS_SORT_RUN < n ? lo + SS_SORT_RUN : n;
        for (Py_ssize_t i = lo + 1; i < hi; i++) {
            SpanRec r = recs[i];
            Py_ssize_t j = i;
            for (; j > lo && rec_before(&r, &recs[j - 1]); j--) recs[j] = recs[j - 1];
            recs[j] = r;
        }
    }
    SpanRec *src = recs, *dst = scratch;
    for (Py_ssize_t width = SS_SORT_RUN; width < n; width *= 2) {
        for (Py_ssize_t lo = 0; lo < n; lo += 2 * width) {
            Py_ssize_t mid = lo + width < n ? lo + width : n;
            Py_ssize_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            if (mid == hi || !rec_before(&src[mid], &src[mid - 1])) { /* already in order */
                memcpy(dst + lo, src + lo, (size_t)(hi - lo) * sizeof(SpanRec));
                continue;
            }
            Py_ssize_t a = lo, b = mid, k = lo;
            while (a < mid && b < hi) dst[k++] = rec_before(&src[b], &src[a]) ? src[b++] : src[a++];
            while (a < mid) dst[k++] = src[a++];
            while (b < hi) dst[k++] = src[b++];
        }
        SpanRec *t = src;
        src = dst;
        dst = t;
    }
    return src;
}

/* Stores a self time; -1 when it does not fit int64. */
static inline int store(int64_t *slot, wide_t value) {
    if (value > INT64_MAX || value < INT64_MIN) return -1;
    *slot = (int64_t)value;
    return 0;
}

typedef struct {
    wide_t end;
    int32_t index;
} EndEntry;

static inline int entry_before(const EndEntry *a, const EndEntry *b) {
    return a->end < b->end || (a->end == b->end && a->index < b->index);
}

static void heap_push(EndEntry *heap, Py_ssize_t *size, EndEntry e) {
    Py_ssize_t k = (*size)++;
    while (k > 0) {
        Py_ssize_t up = (k - 1) / 2;
        if (!entry_before(&e, &heap[up])) break;
        heap[k] = heap[up];
        k = up;
    }
    heap[k] = e;
}

static EndEntry heap_pop(EndEntry *heap, Py_ssize_t *size) {
    EndEntry top = heap[0], last = heap[--*size];
    Py_ssize_t k = 0, n = *size;
    for (;;) {
        Py_ssize_t c = 2 * k + 1;
        if (c >= n) break;
        if (c + 1 < n && entry_before(&heap[c + 1], &heap[c])) c++;
        if (!entry_before(&heap[c], &last)) break;
        heap[k] = heap[c];
        k = c;
    }
    if (n > 0) heap[k] = last;
    return top;
}

/* Work space of the crossing sweep, allocated at the first stretch that needs it. */
typedef struct {
    int32_t *open;   /* open spans in start order; closed ones below the top wait in place */
    uint8_t *closed; /* per span index: closed while still in `open` */
    EndEntry *heap;  /* (end, span) of the open spans */
} Sweep;

/* Self times of one stretch (recs[begin..end), sorted) by a sweep over its starts and ends. */
static int sweep_self_times(const SpanRec *recs, Py_ssize_t begin, Py_ssize_t end, int64_t *self_ns,
                            Sweep *w) {
    Py_ssize_t n_open = 0, n_heap = 0;
    wide_t now = 0;
    for (Py_ssize_t k = begin; k < end; k++) self_ns[recs[k].index] = 0;
    for (Py_ssize_t k = begin;; k++) {
        wide_t s = k < end ? (wide_t)recs[k].start : SS_PAST_EVERY_END;
        while (n_heap > 0 && w->heap[0].end <= s) { /* close the spans ending by s */
            EndEntry e = heap_pop(w->heap, &n_heap);
            int32_t top = w->open[n_open - 1];
            if (store(&self_ns[top], (wide_t)self_ns[top] + (e.end - now)) < 0) return -1;
            now = e.end;
            if (top == e.index) {
                n_open--;
                while (n_open > 0 && w->closed[w->open[n_open - 1]]) n_open--;
            } else {
                w->closed[e.index] = 1;
            }
        }
        if (k == end) break;
        if (n_open > 0) {
            int32_t top = w->open[n_open - 1];
            if (store(&self_ns[top], (wide_t)self_ns[top] + (s - now)) < 0) return -1;
        }
        now = s;
        w->open[n_open++] = recs[k].index;
        heap_push(w->heap, &n_heap, (EndEntry){s + recs[k].dur, recs[k].index});
    }
    return 0;
}

/* Allocates the sweep's work space for n spans; 0, or -2 out of memory. */
static int sweep_ready(Sweep *w, Py_ssize_t n) {
    if (w->open == NULL) {
        w->open = PyMem_RawMalloc((size_t)n * sizeof(int32_t));
        w->closed = PyMem_RawCalloc((size_t)n, 1);
        w->heap = PyMem_RawMalloc((size_t)n * sizeof(EndEntry));
    }
    return w->open && w->closed && w->heap ? 0 : -2;
}

/* The stack walk over sorted spans: parents and self times (crossing stretches swept).  0, -1 for a
 * self time out of range, -2 out of memory. */
static int walk(const SpanRec *recs, Py_ssize_t n, int32_t *parent, int64_t *self_ns) {
    int32_t *stack = PyMem_RawMalloc((size_t)(n ? n : 1) * sizeof(int32_t));
    wide_t *stack_ends = PyMem_RawMalloc((size_t)(n ? n : 1) * sizeof(wide_t));
    Sweep w = {NULL, NULL, NULL};
    int rc = stack && stack_ends ? 0 : -2;
    Py_ssize_t depth = 0, stretch_begin = 0;
    int crossing = 0; /* some span in this stretch outlives its parent */
    for (Py_ssize_t k = 0; rc == 0 && k < n; k++) {
        const SpanRec *r = &recs[k];
        if (k == 0 || r->pid != recs[k - 1].pid || r->tid != recs[k - 1].tid) depth = 0;
        wide_t s = r->start, end = s + r->dur;
        while (depth > 0 && stack_ends[depth - 1] <= s) depth--;
        if (depth > 0) {
            int32_t p = stack[depth - 1];
            wide_t p_end = stack_ends[depth - 1];
            parent[r->index] = p;
            crossing |= end > p_end;
            rc = store(&self_ns[p], (wide_t)self_ns[p] - ((end > p_end ? p_end : end) - s));
        } else {
            if (crossing) { /* the stretch that ends here */
                rc = sweep_ready(&w, n);
                if (rc == 0) rc = sweep_self_times(recs, stretch_begin, k, self_ns, &w);
            }
            stretch_begin = k;
            crossing = 0;
        }
        stack[depth] = r->index;
        stack_ends[depth++] = end;
    }
    if (rc == 0 && crossing) {
        rc = sweep_ready(&w, n);
        if (rc == 0) rc = sweep_self_times(recs, stretch_begin, n, self_ns, &w);
    }
    PyMem_RawFree(stack);
    PyMem_RawFree(stack_ends);
    PyMem_RawFree(w.open);
    PyMem_RawFree(w.closed);
    PyMem_RawFree(w.heap);
    return rc;
}

/* A step that outlives its parent hangs under the nearest ancestor that contains it whole (spans in
 * index order, as the twin's _lift_crossing_steps). */
static void lift_crossing_steps(Py_ssize_t n, const uint32_t *names, const uint8_t *is_step,
                                Py_ssize_t n_strings, const int64_t *start, const int64_t *dur,
                                int32_t *parent) {
    for (Py_ssize_t i = 0; i < n; i++) {
        if (names[i] >= (uint64_t)n_strings || !is_step[names[i]] || parent[i] < 0) continue;
        wide_t end = (wide_t)start[i] + dur[i];
        int32_t p = parent[i];
        while (p >= 0 && (wide_t)start[p] + dur[p] < end) p = parent[p];
        parent[i] = p;
    }
}

/* folded[i] = 1 where span i is the only child of a span with its name. */
static int fold(Py_ssize_t n, const uint32_t *names, const int32_t *parent, int8_t *folded) {
    int32_t *children = PyMem_RawCalloc((size_t)(n ? n : 1), sizeof(int32_t));
    if (children == NULL) return -2;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (parent[i] >= 0 && children[parent[i]] < 2) children[parent[i]]++;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t p = parent[i];
        folded[i] = p >= 0 && children[p] == 1 && names[p] == names[i];
    }
    PyMem_RawFree(children);
    return 0;
}

static PyObject *nest_spans(PyObject *self, PyObject *call_args) {
    Py_buffer pid, tid, start, dur, names, steps;
    if (!PyArg_ParseTuple(call_args, "y*y*y*y*y*y*:nest_spans", &pid, &tid, &start, &dur, &names,
                          &steps)) {
        return NULL;
    }
    PyObject *parent_out = NULL, *self_out = NULL, *folded_out = NULL, *result = NULL;
    SpanRec *recs = NULL, *scratch = NULL;
    Py_ssize_t n = names.len / 4;
    if (names.len % 4 != 0 || pid.len != n * 8 || tid.len != n * 8 || start.len != n * 8 ||
        dur.len != n * 8) {
        PyErr_SetString(PyExc_ValueError,
                        "nest_spans: pid, tid, start and dur need 8 bytes and names 4 per span");
        goto done;
    }
    if (n > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "nest_spans: more than 2**31 - 1 spans");
        goto done;
    }
    parent_out = PyBytes_FromStringAndSize(NULL, n * 4);
    self_out = PyBytes_FromStringAndSize(NULL, n * 8);
    folded_out = PyBytes_FromStringAndSize(NULL, n);
    recs = PyMem_RawMalloc((size_t)(n ? n : 1) * sizeof(SpanRec));
    scratch = PyMem_RawMalloc((size_t)(n ? n : 1) * sizeof(SpanRec));
    if (!parent_out || !self_out || !folded_out || !recs || !scratch) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    int32_t *parent = (int32_t *)PyBytes_AS_STRING(parent_out);
    int64_t *self_ns = (int64_t *)PyBytes_AS_STRING(self_out);
    int8_t *folded = (int8_t *)PyBytes_AS_STRING(folded_out);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        memcpy(&recs[i].pid, (const char *)pid.buf + i * 8, 8);
        memcpy(&recs[i].tid, (const char *)tid.buf + i * 8, 8);
        memcpy(&recs[i].start, (const char *)start.buf + i * 8, 8);
        memcpy(&recs[i].dur, (const char *)dur.buf + i * 8, 8);
        recs[i].index = (int32_t)i;
        parent[i] = -1;
        self_ns[i] = recs[i].dur;
    }
    rc = walk(sort_recs(recs, scratch, n), n, parent, self_ns);
    if (rc == 0) {
        /* the sorted copy is done with: the columns in index order, for the lift */
        int64_t *start_col = (int64_t *)recs, *dur_col = (int64_t *)scratch;
        memcpy(start_col, start.buf, (size_t)n * 8);
        memcpy(dur_col, dur.buf, (size_t)n * 8);
        lift_crossing_steps(n, names.buf, steps.buf, steps.len, start_col, dur_col, parent);
        rc = fold(n, names.buf, parent, folded);
    }
    Py_END_ALLOW_THREADS
    if (rc == -1) {
        PyErr_SetString(PyExc_OverflowError, "nest_spans: a self time beyond the int64 range");
    } else if (rc == -2) {
        PyErr_NoMemory();
    } else {
        result = PyTuple_Pack(3, parent_out, self_out, folded_out);
    }
done:
    Py_XDECREF(parent_out);
    Py_XDECREF(self_out);
    Py_XDECREF(folded_out);
    PyMem_RawFree(recs);
    PyMem_RawFree(scratch);
    PyBuffer_Release(&pid);
    PyBuffer_Release(&tid);
    PyBuffer_Release(&start);
    PyBuffer_Release(&dur);
    PyBuffer_Release(&names);
    PyBuffer_Release(&steps);
    return result;
}

static PyMethodDef nesting_methods[] = {
    {"nest_spans", nest_spans, METH_VARARGS,
     "nest_spans(pid, tid, start_ns, dur_ns, names, step_names) -> (parent, self_ns, folded) as bytes."},
    {NULL, NULL, 0, NULL},
};

int ss_span_nesting_init(PyObject *module) {
    return PyModule_AddFunctions(module, nesting_methods);
}
