/* The function tracer's export (see tracer.h): each thread's records, kept in post-order, rebuilt
 * into its call tree and written in pre-order straight into the trace's span columns, ticks
 * converted to ns. */
#include "tracer.h"

/* Where the export writes: the trace's own columns, already sized (no copy in between). */
typedef struct {
    uint32_t *name;
    int64_t *tid;
    int64_t *start;
    int64_t *dur;
    int32_t *ref;
    int64_t *id;
    int64_t *parent;
    uint8_t *flags;
} ExportOut;

/* One thread's records in pre-order from `at` on (see the module comment); `scratch` holds
 * room for 5 int32 per record. */
static void export_thread(ThreadBuf *tb, const uint32_t *name_ids, Py_ssize_t n_names,
                          int64_t first_id, int64_t first_row, size_t at, const ExportOut *o,
                          Record *recs, int32_t *scratch) {
    size_t n = (size_t)tb->count;
    size_t k = 0;
    for (Chunk *c = tb->first; c; c = c->next_thread) {
        memcpy(recs + k, c->records, c->count * sizeof(Record));
        k += c->count;
    }
    int32_t *parent = scratch, *first_child = scratch + n, *next_sib = scratch + 2 * n,
            *pos = scratch + 3 * n, *anc = scratch + 4 * n;
    /* Reverse post-order meets each parent before its children: a stack of ancestors. */
    int32_t root_head = -1;
    size_t top = 0;
    for (size_t j = n; j-- > 0;) {
        uint32_t d = recs[j].depth;
        while (top && recs[anc[top - 1]].depth >= d) {
            top--;
        }
        int32_t p = (top && (uint32_t)recs[anc[top - 1]].depth + 1u == d) ? anc[top - 1] : -1;
        parent[j] = p;
        first_child[j] = -1;
        if (p >= 0) {
            next_sib[j] = first_child[p];
            first_child[p] = (int32_t)j;
        } else {
            next_sib[j] = root_head;
            root_head = (int32_t)j;
        }
        anc[top++] = (int32_t)j;
    }
    int64_t tid = (int64_t)tb->native_tid;
    int64_t id0 = first_id + (int64_t)at;
    int64_t ref0 = -2 - (first_row + (int64_t)at); /* python_ids rows, one per span */
    size_t out = 0;
    int32_t node = root_head;
    while (node >= 0) {
        Record *r = &recs[node];
        pos[node] = (int32_t)out;
        uint64_t start = rec_start(r);
        uint32_t code = r->code_flags >> 2;
        int64_t start_ns = ss_ticks_to_ns(start);
        size_t i = at + out;
        o->name[i] = code < (uint64_t)n_names ? name_ids[code] : 0;
        o->tid[i] = tid;
        o->start[i] = start_ns;
        o->dur[i] = ss_ticks_to_ns(start + rec_dur(r)) - start_ns;
        o->ref[i] = (int32_t)(ref0 - (int64_t)out);
        o->id[i] = id0 + (int64_t)out;
        o->parent[i] = parent[node] >= 0 ? id0 + pos[parent[node]] : 0;
        o->flags[i] = (uint8_t)(r->code_flags & REC_FLAGS_MASK);
        out++;
        if (first_child[node] >= 0) {
            node = first_child[node];
            continue;
        }
        while (node >= 0 && next_sib[node] < 0) {
            node = parent[node];
        }
        if (node >= 0) {
            node = next_sib[node];
        }
    }
}

#define EXPORT_COLUMNS 7

/* Writable buffers of exactly `n` items of `itemsize` bytes. */
static int get_out_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, Py_ssize_t n,
                          const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return -1;
    }
    if (view->itemsize != itemsize || view->len != n * itemsize) {
        PyErr_Format(PyExc_ValueError,
                     "export column %s must hold %zd items of %zd bytes (got %zd bytes of %zd)",
                     name, n, itemsize, view->len, view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *py_export(PyObject *mod, PyObject *args) {
    static const char *names[EXPORT_COLUMNS] = {"name", "tid", "start_ns", "dur_ns",
                                                "args",  "id",  "parent"};
    static const Py_ssize_t sizes[EXPORT_COLUMNS] = {4, 8, 8, 8, 4, 8, 8};
    Py_buffer ids_view;
    long long first_id, first_row;
    PyObject *cols[EXPORT_COLUMNS];
    if (!PyArg_ParseTuple(args, "y*LLOOOOOOO:_tracer_export", &ids_view, &first_id, &first_row,
                          &cols[0], &cols[1], &cols[2], &cols[3], &cols[4], &cols[5],
                          &cols[6])) {
        return NULL;
    }
    Py_buffer views[EXPORT_COLUMNS];
    int got = 0;
    PyObject *flags = NULL, *tids = NULL, *result = NULL;
    ThreadBuf **order = NULL;
    Record *recs = NULL;
    int32_t *scratch = NULL;
    Py_ssize_t n = (Py_ssize_t)ss_tracer.kept;
    if (ss_tracer.active) {
        PyErr_SetString(PyExc_RuntimeError, "stop the function tracer before exporting");
        goto done;
    }
    if (ids_view.len % 4 != 0) {
        PyErr_SetString(PyExc_TypeError, "name ids must be a buffer of uint32");
        goto done;
    }
    if (first_row < 0 || first_row + (long long)n > INT32_MAX - 2) {
        PyErr_SetString(PyExc_OverflowError, "python_ids rows must fit the 32-bit args refs");
        goto done;
    }
    for (; got < EXPORT_COLUMNS; got++) {
        if (get_out_buffer(cols[got], &views[got], sizes[got], n, names[got]) < 0) {
            goto done;
        }
    }
    flags = PyBytes_FromStringAndSize(NULL, n);
    order = malloc((ss_tracer.n_threads + 1) * sizeof(ThreadBuf *));
    uint64_t most = 1;
    for (ThreadBuf *tb = ss_tracer.threads; tb; tb = tb->next) {
        most = tb->count > most ? tb->count : most;
    }
    recs = malloc(most * sizeof(Record));
    scratch = malloc(5 * most * sizeof(int32_t));
    if (flags == NULL || order == NULL || recs == NULL || scratch == NULL) {
        Py_CLEAR(flags);
        PyErr_NoMemory();
        goto done;
    }
    ExportOut o = {views[0].buf, views[1].buf, views[2].buf, views[3].buf,
                   views[4].buf, views[5].buf, views[6].buf,
                   (uint8_t *)PyBytes_AS_STRING(flags)};
    /* Threads in creation order (the list is newest first). */
    uint32_t m = 0;
    for (ThreadBuf *tb = ss_tracer.threads; tb; tb = tb->next) {
        order[m++] = tb;
    }
    size_t at = 0;
    tids = PyList_New(0);
    for (uint32_t i = m; tids != NULL && i-- > 0;) {
        if (order[i]->count == 0) {
            continue;
        }
        export_thread(order[i], (const uint32_t *)ids_view.buf, ids_view.len / 4, first_id,
                      first_row, at, &o, recs, scratch);
        at += (size_t)order[i]->count;
        PyObject *tid = PyLong_FromUnsignedLong(order[i]->native_tid);
        if (tid == NULL || PyList_Append(tids, tid) < 0) {
            Py_CLEAR(tids);
        }
        Py_XDECREF(tid);
    }
    result = tids == NULL ? NULL : Py_BuildValue("(NN)", Py_NewRef(flags), tids);
done:
    while (got-- > 0) {
        PyBuffer_Release(&views[got]);
    }
    free(order);
    free(recs);
    free(scratch);
    PyBuffer_Release(&ids_view);
    Py_XDECREF(flags);
    return result;
}

static PyMethodDef export_methods[] = {
    {"_tracer_export", py_export, METH_VARARGS,
     "Write every span in pre-order, thread by thread, into the given columns (name ids, tids, "
     "starts, durs, args refs to python_ids rows from first_row, Python ids, parent ids); "
     "returns (their flags, the threads' native ids)."},
    {NULL, NULL, 0, NULL},
};

int tr_export_add(PyObject *module) {
    return PyModule_AddFunctions(module, export_methods);
}
