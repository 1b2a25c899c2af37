/* Integer values of a few top-level keys, read from many events' args text in one call.
 *
 * trace/raw_args.py's arg_rows calls it with each event's compact args text (bytes), None for an
 * event without args, or another object for args it must read itself.  Each row comes back as a
 * tuple of ints (None for a key that is absent), read as json.loads would (the last of duplicate
 * keys wins), or as None when the row needs Python's reading: args that are not bytes, a key
 * written with escapes (it could spell a wanted one), a wanted key whose value is not a plain
 * integer (a float, a string, a bool, one beyond 64 bits) and text that is not a JSON object. */
#include "chrome_json.h"

#define SS_ARG_KEYS 8

typedef struct {
    const char *text[SS_ARG_KEYS];
    size_t len[SS_ARG_KEYS];
    Py_ssize_t n;
} WantedKeys;

/* The row's values into `out` (NULL for absent keys): 1 read, 0 for Python's reading, -1 error. */
static int read_row(const char *p, Py_ssize_t size, const WantedKeys *keys, PyObject **out) {
    Cursor c = {p, p + size};
    long long values[SS_ARG_KEYS];
    int found[SS_ARG_KEYS] = {0};
    cj_skip_ws(&c);
    int more = cj_enter(&c, '{', '}');
    for (; more == 1; more = cj_next_item(&c, '}')) {
        const char *key;
        size_t len;
        int plain;
        if (cj_member_key(&c, &key, &len, &plain) < 0) return 0;
        if (!plain && memchr(key, '\\', len) != NULL) return 0;
        Py_ssize_t k = 0;
        while (k < keys->n && !(keys->len[k] == len && memcmp(keys->text[k], key, len) == 0)) k++;
        Token value = {c.p, NULL};
        if (cj_skip_value(&c, 0) < 0) return 0;
        if (k == keys->n) continue;
        value.end = c.p;
        int is_int = 0;
        double unused;
        if (*value.start == '-' || (*value.start >= '0' && *value.start <= '9')) {
            if (!cj_parse_number(&value, &is_int, &values[k], &unused) || !is_int) return 0;
        } else {
            return 0;
        }
        found[k] = 1;
    }
    if (more != 0) return 0;
    cj_skip_ws(&c);
    if (c.p != c.end) return 0;
    for (Py_ssize_t k = 0; k < keys->n; k++) {
        if (found[k]) {
            out[k] = PyLong_FromLongLong(values[k]);
            if (out[k] == NULL) {
                while (k-- > 0) Py_XDECREF(out[k]);
                return -1;
            }
        } else {
            out[k] = NULL;
        }
    }
    return 1;
}

static PyObject *row_tuple(PyObject **values, Py_ssize_t n) {
    PyObject *row = PyTuple_New(n);
    if (row == NULL) {
        for (Py_ssize_t k = 0; k < n; k++) Py_XDECREF(values[k]);
        return NULL;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *v = values[k] != NULL ? values[k] : Py_NewRef(Py_None);
        PyTuple_SET_ITEM(row, k, v);
    }
    return row;
}

static PyObject *int_args(PyObject *self, PyObject *call_args) {
    PyObject *rows_in, *key_names;
    if (!PyArg_ParseTuple(call_args, "OO!:int_args", &rows_in, &PyTuple_Type, &key_names)) return NULL;
    WantedKeys keys;
    keys.n = PyTuple_GET_SIZE(key_names);
    if (keys.n < 1 || keys.n > SS_ARG_KEYS) {
        PyErr_Format(PyExc_ValueError, "int_args: 1 to %d keys, got %zd", SS_ARG_KEYS, keys.n);
        return NULL;
    }
    for (Py_ssize_t k = 0; k < keys.n; k++) {
        PyObject *name = PyTuple_GET_ITEM(key_names, k);
        if (!PyBytes_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "int_args: keys must be bytes");
            return NULL;
        }
        keys.text[k] = PyBytes_AS_STRING(name);
        keys.len[k] = (size_t)PyBytes_GET_SIZE(name);
    }
    PyObject *seq = PySequence_Fast(rows_in, "int_args: rows must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(n);
    PyObject *empty = NULL;
    if (out == NULL) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *values[SS_ARG_KEYS];
        PyObject *row;
        if (item == Py_None) {
            if (empty == NULL) {
                for (Py_ssize_t k = 0; k < keys.n; k++) values[k] = NULL;
                empty = row_tuple(values, keys.n);
                if (empty == NULL) goto fail;
            }
            row = Py_NewRef(empty);
        } else if (!PyBytes_Check(item)) {
            row = Py_NewRef(Py_None);
        } else {
            int got = read_row(PyBytes_AS_STRING(item), PyBytes_GET_SIZE(item), &keys, values);
            if (got < 0) goto fail;
            row = got ? row_tuple(values, keys.n) : Py_NewRef(Py_None);
            if (row == NULL) goto fail;
        }
        PyList_SET_ITEM(out, i, row);
    }
    Py_XDECREF(empty);
    Py_DECREF(seq);
    return out;
fail:
    Py_XDECREF(empty);
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

static PyMethodDef args_methods[] = {
    {"int_args", int_args, METH_VARARGS,
     "int_args(rows, keys) -> list: per row a tuple of the keys' integer values (None when "
     "absent), or None where Python must read the row."},
    {NULL, NULL, 0, NULL},
};

int ss_chrome_args_init(PyObject *module) { return PyModule_AddFunctions(module, args_methods); }
