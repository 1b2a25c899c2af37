/* Fast formatting of span columns as Chrome-trace "X" events (twin: chrome.format_spans_python).
 *
 * Strings arrive pre-escaped (JSON literals with their quotes) from the trace's string table, and
 * args pre-rendered, so this only stitches bytes and prints integers; output is byte-identical to
 * the Python twin. */
#include "stepscope_native.h"

#include <string.h>

#define LABEL_BASE ((int64_t)1 << 62)

typedef struct {
    char *data;
    size_t len;
    size_t cap;
} Buffer;

static int buf_reserve(Buffer *b, size_t extra) {
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

static inline int buf_put(Buffer *b, const char *s, size_t n) {
    if (buf_reserve(b, n) < 0) {
        return -1;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    return 0;
}

#define PUT_LITERAL(b, s) buf_put((b), (s), sizeof(s) - 1)

/* Writes an unsigned decimal; caller reserved room. */
static inline void put_u64(Buffer *b, uint64_t v) {
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n) {
        b->data[b->len++] = tmp[--n];
    }
}

static int put_i64(Buffer *b, int64_t v) {
    if (buf_reserve(b, 24) < 0) {
        return -1;
    }
    if (v < 0) {
        b->data[b->len++] = '-';
        put_u64(b, (uint64_t)0 - (uint64_t)v);
    } else {
        put_u64(b, (uint64_t)v);
    }
    return 0;
}

/* ns as microseconds with exactly three decimals. */
static int put_micros(Buffer *b, int64_t ns) {
    if (buf_reserve(b, 28) < 0) {
        return -1;
    }
    uint64_t mag;
    if (ns < 0) {
        b->data[b->len++] = '-';
        mag = (uint64_t)0 - (uint64_t)ns;
    } else {
        mag = (uint64_t)ns;
    }
    put_u64(b, mag / 1000);
    uint64_t frac = mag % 1000;
    b->data[b->len++] = '.';
    b->data[b->len++] = (char)('0' + frac / 100);
    b->data[b->len++] = (char)('0' + (frac / 10) % 10);
    b->data[b->len++] = (char)('0' + frac % 10);
    return 0;
}

static int put_bytes_obj(Buffer *b, PyObject *obj) {
    char *s;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(obj, &s, &n) < 0) {
        return -1;
    }
    return buf_put(b, s, (size_t)n);
}

static int put_string_id(Buffer *b, PyObject *strings, int64_t id) {
    if (id < 0 || id >= PyList_GET_SIZE(strings)) {
        PyErr_Format(PyExc_IndexError, "string id %lld is not in the string table", (long long)id);
        return -1;
    }
    return put_bytes_obj(b, PyList_GET_ITEM(strings, id));
}

static int put_label(Buffer *b, PyObject *strings, int64_t v) {
    if (v >= LABEL_BASE) {
        return put_string_id(b, strings, v - LABEL_BASE);
    }
    return put_i64(b, v);
}

typedef struct {
    Py_buffer view;
    int ok;
} Column;

static int get_column(PyObject *obj, Column *col, Py_ssize_t itemsize, const char *name) {
    if (PyObject_GetBuffer(obj, &col->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return -1;
    }
    col->ok = 1;
    if (col->view.itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "column %s has item size %zd, expected %zd", name,
                     col->view.itemsize, itemsize);
        return -1;
    }
    return 0;
}

static PyObject *format_spans(PyObject *self, PyObject *args) {
    PyObject *cols, *strings, *args_json;
    Py_ssize_t lo, hi;
    long long shift;
    if (!PyArg_ParseTuple(args, "O!nnO!O!L", &PyTuple_Type, &cols, &lo, &hi, &PyList_Type,
                          &strings, &PyDict_Type, &args_json, &shift)) {
        return NULL;
    }
    if (PyTuple_GET_SIZE(cols) != 7) {
        PyErr_SetString(PyExc_ValueError, "format_spans expects 7 columns");
        return NULL;
    }
    static const char *names[7] = {"name", "cat", "pid", "tid", "start_ns", "dur_ns", "args"};
    static const Py_ssize_t sizes[7] = {4, 4, 8, 8, 8, 8, 4};
    Column c[7];
    memset(c, 0, sizeof(c));
    Buffer out = {NULL, 0, 0};
    PyObject *result = NULL;
    for (int i = 0; i < 7; i++) {
        if (get_column(PyTuple_GET_ITEM(cols, i), &c[i], sizes[i], names[i]) < 0) {
            goto done;
        }
    }
    Py_ssize_t n = c[0].view.len / 4;
    for (int i = 1; i < 7; i++) {
        if (c[i].view.len / sizes[i] != n) {
            PyErr_SetString(PyExc_ValueError, "span columns differ in length");
            goto done;
        }
    }
    if (lo < 0 || hi > n || lo > hi) {
        PyErr_Format(PyExc_IndexError, "span range %zd..%zd outside 0..%zd", lo, hi, n);
        goto done;
    }
    const uint32_t *name = c[0].view.buf, *cat = c[1].view.buf;
    const int64_t *pid = c[2].view.buf, *tid = c[3].view.buf;
    const int64_t *start = c[4].view.buf, *dur = c[5].view.buf;
    const int32_t *ref = c[6].view.buf;
    if (buf_reserve(&out, (size_t)(hi - lo) * 120 + 64) < 0) {
        goto done;
    }
    for (Py_ssize_t i = lo; i < hi; i++) {
        if (PUT_LITERAL(&out, "{\"ph\":\"X\",") < 0) goto done;
        if (cat[i]) {
            if (PUT_LITERAL(&out, "\"cat\":") < 0 || put_string_id(&out, strings, cat[i]) < 0 ||
                PUT_LITERAL(&out, ",") < 0)
                goto done;
        }
        if (PUT_LITERAL(&out, "\"name\":") < 0 || put_string_id(&out, strings, name[i]) < 0 ||
            PUT_LITERAL(&out, ",\"pid\":") < 0 || put_label(&out, strings, pid[i]) < 0 ||
            PUT_LITERAL(&out, ",\"tid\":") < 0 || put_label(&out, strings, tid[i]) < 0 ||
            PUT_LITERAL(&out, ",\"ts\":") < 0 || put_micros(&out, start[i] + shift) < 0 ||
            PUT_LITERAL(&out, ",\"dur\":") < 0 || put_micros(&out, dur[i]) < 0)
            goto done;
        if (ref[i] >= 0) {
            PyObject *key = PyLong_FromLong(ref[i]);
            if (key == NULL) goto done;
            PyObject *rendered = PyDict_GetItemWithError(args_json, key);
            Py_DECREF(key);
            if (rendered == NULL) {
                if (!PyErr_Occurred()) {
                    PyErr_Format(PyExc_KeyError, "args %d not rendered", ref[i]);
                }
                goto done;
            }
            if (PUT_LITERAL(&out, ",\"args\":") < 0 || put_bytes_obj(&out, rendered) < 0)
                goto done;
        }
        if (PUT_LITERAL(&out, "},\n") < 0) goto done;
    }
    result = PyBytes_FromStringAndSize(out.data ? out.data : "", (Py_ssize_t)out.len);
done:
    for (int i = 0; i < 7; i++) {
        if (c[i].ok) {
            PyBuffer_Release(&c[i].view);
        }
    }
    PyMem_Free(out.data);
    return result;
}

static PyMethodDef chrome_methods[] = {
    {"format_spans", format_spans, METH_VARARGS,
     "format_spans(cols, lo, hi, strings, args_json, shift) -> bytes of X events."},
    {NULL, NULL, 0, NULL},
};

int ss_chrome_init(PyObject *module) {
    return PyModule_AddFunctions(module, chrome_methods);
}
