/* Fast formatting of span columns as Chrome-trace "X" events (twin: chrome_writer.format_spans_python).
 *
 * Strings arrive pre-escaped (JSON literals with their quotes) from the trace's string table; args
 * are rendered here when they hold plain JSON values, else by the Python fallback.  The output is
 * byte-identical to the Python twin. */
#include "chrome_values.h"

#define PUT_LITERAL(b, s) ss_buffer_put((b), (s), sizeof(s) - 1)

/* Writes an unsigned decimal; caller reserved room. */
static inline void put_u64(SsBuffer *b, uint64_t v) {
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

static int put_i64(SsBuffer *b, int64_t v) {
    if (ss_buffer_reserve(b, 24) < 0) {
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
static int put_micros(SsBuffer *b, int64_t ns) {
    if (ss_buffer_reserve(b, 28) < 0) {
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

static int put_bytes_obj(SsBuffer *b, PyObject *obj) {
    char *s;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(obj, &s, &n) < 0) {
        return -1;
    }
    return ss_buffer_put(b, s, (size_t)n);
}

static int put_string_id(SsBuffer *b, PyObject *strings, int64_t id) {
    if (id < 0 || id >= PyList_GET_SIZE(strings)) {
        PyErr_Format(PyExc_IndexError, "string id %lld is not in the string table", (long long)id);
        return -1;
    }
    return put_bytes_obj(b, PyList_GET_ITEM(strings, id));
}

static int put_label(SsBuffer *b, PyObject *strings, int64_t v) {
    if (v >= LABEL_BASE) {
        return put_string_id(b, strings, v - LABEL_BASE);
    }
    return put_i64(b, v);
}


/* Compact JSON for the plain values args usually hold (exact dict/list/tuple/str/int/float/bool/
 * None).  Returns 1 when rendered, 0 when the value needs the Python path (other types, NaN,
 * unpaired surrogates, huge ints), -1 on error.  Output equals json_bytes() for those values. */
static int put_json(SsBuffer *b, PyObject *v, int depth);

static int put_json_string(SsBuffer *b, PyObject *s) {
    Py_ssize_t n;
    const char *utf8 = PyUnicode_AsUTF8AndSize(s, &n);
    if (utf8 == NULL) {
        PyErr_Clear(); /* unpaired surrogates: the Python path replaces them */
        return 0;
    }
    if (ss_buffer_reserve(b, (size_t)n * 6 + 2) < 0) {
        return -1;
    }
    static const char hex[] = "0123456789abcdef";
    b->data[b->len++] = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)utf8[i];
        if (c == '"' || c == '\\') {
            b->data[b->len++] = '\\';
            b->data[b->len++] = (char)c;
        } else if (c < 0x20) {
            b->data[b->len++] = '\\';
            switch (c) {
                case '\n': b->data[b->len++] = 'n'; break;
                case '\r': b->data[b->len++] = 'r'; break;
                case '\t': b->data[b->len++] = 't'; break;
                case '\b': b->data[b->len++] = 'b'; break;
                case '\f': b->data[b->len++] = 'f'; break;
                default:
                    b->data[b->len++] = 'u';
                    b->data[b->len++] = '0';
                    b->data[b->len++] = '0';
                    b->data[b->len++] = hex[c >> 4];
                    b->data[b->len++] = hex[c & 15];
            }
        } else {
            b->data[b->len++] = (char)c;
        }
    }
    b->data[b->len++] = '"';
    return 1;
}

static int put_json_items(SsBuffer *b, PyObject *seq, int depth) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    if (ss_buffer_put(b, "[", 1) < 0) return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i && ss_buffer_put(b, ",", 1) < 0) return -1;
        int r = put_json(b, items[i], depth + 1);
        if (r <= 0) return r;
    }
    return ss_buffer_put(b, "]", 1) < 0 ? -1 : 1;
}

static int put_json(SsBuffer *b, PyObject *v, int depth) {
    if (depth > 32) {
        return 0;
    }
    if (v == Py_None) return PUT_LITERAL(b, "null") < 0 ? -1 : 1;
    if (v == Py_True) return PUT_LITERAL(b, "true") < 0 ? -1 : 1;
    if (v == Py_False) return PUT_LITERAL(b, "false") < 0 ? -1 : 1;
    if (PyUnicode_CheckExact(v)) return put_json_string(b, v);
    if (PyLong_CheckExact(v)) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow) return 0;
        if (x == -1 && PyErr_Occurred()) return -1;
        return put_i64(b, x) < 0 ? -1 : 1;
    }
    if (PyFloat_CheckExact(v)) {
        double x = PyFloat_AS_DOUBLE(v);
        if (!isfinite(x)) return 0;
        char *text = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
        if (text == NULL) return -1;
        int r = ss_buffer_put(b, text, strlen(text));
        PyMem_Free(text);
        return r < 0 ? -1 : 1;
    }
    if (PyList_CheckExact(v) || PyTuple_CheckExact(v)) {
        return put_json_items(b, v, depth);
    }
    if (PyDict_CheckExact(v)) {
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        int first = 1;
        if (ss_buffer_put(b, "{", 1) < 0) return -1;
        while (PyDict_Next(v, &pos, &key, &value)) {
            if (!PyUnicode_CheckExact(key)) return 0;
            if (!first && ss_buffer_put(b, ",", 1) < 0) return -1;
            first = 0;
            int r = put_json_string(b, key);
            if (r <= 0) return r;
            if (ss_buffer_put(b, ":", 1) < 0) return -1;
            r = put_json(b, value, depth + 1);
            if (r <= 0) return r;
        }
        return ss_buffer_put(b, "}", 1) < 0 ? -1 : 1;
    }
    return 0;
}

/* Args of one event: the C renderer, or the Python fallback for what it does not handle. */
static int put_args(SsBuffer *b, PyObject *args_obj, PyObject *fallback) {
    size_t mark = b->len;
    int r = put_json(b, args_obj, 0);
    if (r != 0) {
        return r < 0 ? -1 : 0;
    }
    b->len = mark;
    PyObject *rendered = PyObject_CallOneArg(fallback, args_obj);
    if (rendered == NULL) {
        return -1;
    }
    int ok = put_bytes_obj(b, rendered);
    Py_DECREF(rendered);
    return ok;
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
    PyObject *cols, *strings, *all_args, *fallback;
    Py_ssize_t lo, hi;
    long long shift;
    if (!PyArg_ParseTuple(args, "O!nnO!O!OL", &PyTuple_Type, &cols, &lo, &hi, &PyList_Type,
                          &strings, &PyTuple_Type, &all_args, &fallback, &shift)) {
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
    SsBuffer out = {NULL, 0, 0};
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
    if (ss_buffer_reserve(&out, (size_t)(hi - lo) * 120 + 64) < 0) {
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
            if (ref[i] >= PyTuple_GET_SIZE(all_args)) {
                PyErr_Format(PyExc_IndexError, "args ref %d outside the args table", ref[i]);
                goto done;
            }
            PyObject *span_args = PyTuple_GET_ITEM(all_args, ref[i]);
            Py_ssize_t count = PyObject_Length(span_args);
            if (count < 0) goto done;
            if (count > 0 && (PUT_LITERAL(&out, ",\"args\":") < 0 ||
                              put_args(&out, span_args, fallback) < 0))
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
     "format_spans(cols, lo, hi, strings, args, fallback, shift) -> bytes of X events."},
    {NULL, NULL, 0, NULL},
};

int ss_chrome_writer_init(PyObject *module) {
    return PyModule_AddFunctions(module, chrome_methods);
}
