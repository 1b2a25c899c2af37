/* The compact form's ARGS section, version 2, read back (twin and layout: trace/compact_args.py;
 * written by compact_args.c).
 *
 * splice_args rebuilds each mapping's text from its template and the integer columns, byte for
 * byte, with its key count; a truncated or malformed payload is a ValueError (every count and
 * length is checked against the bytes there before anything is allocated for it). */
#include "chrome_values.h"

#define BAD "args table truncated or malformed"

typedef struct {
    const uint8_t *p, *end;
} Input;

/* A varint of at most `most` into *out; -1 past the end, beyond 64 bits or above `most`. */
static int get_number(Input *in, uint64_t most, uint64_t *out) {
    uint64_t u = 0;
    for (int shift = 0;; shift += 7) {
        if (in->p >= in->end || shift > 63 || (shift == 63 && *in->p > 1)) return -1;
        uint8_t b = *in->p++;
        u |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) break;
    }
    *out = u;
    return u <= most ? 0 : -1;
}

/* A varint of at most the bytes left (every count and length here is). */
static int get_small(Input *in, Py_ssize_t *out) {
    uint64_t u;
    if (get_number(in, (uint64_t)(in->end - in->p), &u) < 0 || u > (uint64_t)(in->end - in->p))
        return -1;
    *out = (Py_ssize_t)u;
    return 0;
}

typedef struct {
    int64_t size;
    Py_ssize_t first, holes; /* its holes: gaps[first..first+holes), keys[...] */
    const char *text;        /* its pieces, one after another */
    size_t text_len;
} Template;

typedef struct {
    Template *templates;
    Py_ssize_t *gaps, *keys, *rows, *wanted, *taken;
    int64_t *values;
} Spliced;

static void spliced_free(Spliced *s) {
    PyMem_Free(s->templates);
    PyMem_Free(s->gaps);
    PyMem_Free(s->keys);
    PyMem_Free(s->rows);
    PyMem_Free(s->wanted);
    PyMem_Free(s->taken);
    PyMem_Free(s->values);
}

/* The column's `count` zigzag-delta varints (as unpack_varints reads them) into out. */
static int get_column(Input *in, Py_ssize_t count, int64_t *out) {
    int64_t prev = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint64_t u = 0;
        for (int shift = 0;; shift += 7) {
            if (in->p >= in->end || shift > 63) return -1;
            uint8_t b = *in->p++;
            u |= (uint64_t)(b & 0x7f) << shift;
            if (!(b & 0x80)) break;
        }
        prev = (int64_t)((uint64_t)prev + ((u >> 1) ^ (~(u & 1) + 1)));
        out[i] = prev;
    }
    return in->p == in->end ? 0 : -1;
}

/* The templates of the payload; -1 malformed, -2 no memory. */
static int read_templates(Input *in, Spliced *s, Py_ssize_t count, Py_ssize_t nkeys) {
    Py_ssize_t holes = 0, cap = 0;
    for (Py_ssize_t t = 0; t < count; t++) {
        Template *tp = &s->templates[t];
        uint64_t size;
        Py_ssize_t n, last, gap;
        if (get_number(in, INT64_MAX, &size) < 0 || get_small(in, &n) < 0) return -1;
        if (holes + n > cap) {
            cap = (holes + n) * 2 + 16;
            Py_ssize_t *gaps = PyMem_Realloc(s->gaps, cap * sizeof *gaps);
            if (gaps != NULL) s->gaps = gaps;
            Py_ssize_t *keys = PyMem_Realloc(s->keys, cap * sizeof *keys);
            if (keys != NULL) s->keys = keys;
            if (gaps == NULL || keys == NULL) return -2;
        }
        size_t text_len = 0;
        tp->size = (int64_t)size;
        tp->first = holes;
        tp->holes = n;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (get_small(in, &gap) < 0) return -1;
            s->gaps[holes + i] = gap;
            text_len += (size_t)gap;
        }
        if (get_small(in, &last) < 0) return -1;
        text_len += (size_t)last;
        for (Py_ssize_t i = 0; i < n; i++, holes++) {
            uint64_t key;
            if (get_number(in, (uint64_t)nkeys - 1, &key) < 0 || nkeys == 0) return -1;
            s->keys[holes] = (Py_ssize_t)key;
        }
        if (text_len > (size_t)(in->end - in->p)) return -1;
        tp->text = (const char *)in->p;
        tp->text_len = text_len;
        in->p += text_len;
    }
    return 0;
}

static int put_decimal(SsBuffer *b, int64_t v) {
    char digits[24], *p = digits + sizeof digits;
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) *--p = '-';
    return ss_buffer_put(b, p, (size_t)(digits + sizeof digits - p));
}

/* Each row's text as bytes in a list, and the key counts as int64 bytes. */
static PyObject *spliced_rows(Spliced *s, Py_ssize_t count, const Py_ssize_t *starts) {
    PyObject *texts = PyList_New(count), *sizes = PyBytes_FromStringAndSize(NULL, count * 8);
    PyObject *result = NULL;
    SsBuffer row = {NULL, 0, 0};
    if (texts == NULL || sizes == NULL) goto done;
    int64_t *size_out = (int64_t *)PyBytes_AS_STRING(sizes);
    for (Py_ssize_t r = 0; r < count; r++) {
        const Template *tp = &s->templates[s->rows[r]];
        const char *piece = tp->text;
        row.len = 0;
        for (Py_ssize_t i = tp->first; i < tp->first + tp->holes; i++) {
            Py_ssize_t k = s->keys[i];
            if (ss_buffer_put(&row, piece, (size_t)s->gaps[i]) < 0 ||
                put_decimal(&row, s->values[starts[k] + s->taken[k]++]) < 0)
                goto done;
            piece += s->gaps[i];
        }
        if (ss_buffer_put(&row, piece, (size_t)(tp->text + tp->text_len - piece)) < 0) goto done;
        PyObject *text = PyBytes_FromStringAndSize(row.data, (Py_ssize_t)row.len);
        if (text == NULL) goto done;
        PyList_SET_ITEM(texts, r, text);
        size_out[r] = tp->size;
    }
    result = PyTuple_Pack(2, texts, sizes);
done:
    PyMem_Free(row.data);
    Py_XDECREF(texts);
    Py_XDECREF(sizes);
    return result;
}

static PyObject *splice_args(PyObject *self, PyObject *arg) {
    Py_buffer payload;
    if (PyObject_GetBuffer(arg, &payload, PyBUF_SIMPLE) < 0) return NULL;
    Input in = {payload.buf, (const uint8_t *)payload.buf + payload.len};
    Spliced s = {0};
    Py_ssize_t count, ntemplates, nkeys, len, total = 0, *starts = NULL;
    PyObject *result = NULL;
    int bad = -1;
    if (get_small(&in, &count) < 0 || get_small(&in, &ntemplates) < 0 || get_small(&in, &nkeys) < 0)
        goto fail;
    for (Py_ssize_t k = 0; k < nkeys; k++) {
        if (get_small(&in, &len) < 0) goto fail;
        in.p += len;
    }
    s.templates = PyMem_Calloc((size_t)ntemplates + 1, sizeof *s.templates);
    s.rows = PyMem_Calloc((size_t)count + 1, sizeof *s.rows);
    s.wanted = PyMem_Calloc((size_t)nkeys + 1, sizeof *s.wanted);
    s.taken = PyMem_Calloc((size_t)nkeys + 1, sizeof *s.taken);
    starts = PyMem_Calloc((size_t)nkeys + 1, sizeof *starts);
    if (s.templates == NULL || s.rows == NULL || s.wanted == NULL || s.taken == NULL || starts == NULL)
        goto nomem;
    if ((bad = read_templates(&in, &s, ntemplates, nkeys)) < 0) goto fail;
    bad = -1;
    for (Py_ssize_t r = 0; r < count; r++) {
        uint64_t t;
        if (get_number(&in, (uint64_t)ntemplates - 1, &t) < 0 || ntemplates == 0) goto fail;
        s.rows[r] = (Py_ssize_t)t;
        const Template *tp = &s.templates[t];
        for (Py_ssize_t i = tp->first; i < tp->first + tp->holes; i++) s.wanted[s.keys[i]]++;
        total += tp->holes;
        if (total > in.end - in.p) goto fail; /* a value takes a byte at least */
    }
    s.values = PyMem_Malloc(((size_t)total + 1) * sizeof *s.values);
    if (s.values == NULL) goto nomem;
    for (Py_ssize_t k = 0, at = 0; k < nkeys; at += s.wanted[k++]) {
        if (get_small(&in, &len) < 0) goto fail;
        Input column = {in.p, in.p + len};
        starts[k] = at;
        if (get_column(&column, s.wanted[k], s.values + at) < 0) goto fail;
        in.p += len;
    }
    if (in.p != in.end) goto fail;
    result = spliced_rows(&s, count, starts);
    goto done;
nomem:
    bad = -2;
fail:
    if (bad == -2)
        PyErr_NoMemory();
    else
        PyErr_SetString(PyExc_ValueError, BAD);
done:
    spliced_free(&s);
    PyMem_Free(starts);
    PyBuffer_Release(&payload);
    return result;
}

static PyMethodDef compact_splice_methods[] = {
    {"splice_args", splice_args, METH_O,
     "splice_args(payload) -> (list of each mapping's text, int64 key counts)."},
    {NULL, NULL, 0, NULL},
};

int ss_compact_splice_init(PyObject *module) { return PyModule_AddFunctions(module, compact_splice_methods); }
