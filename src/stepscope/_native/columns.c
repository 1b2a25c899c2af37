/* Parsed Chrome-trace events to span columns in one pass (twin: chrome.spans_from_events_python).
 *
 * Plain "X" events (string or absent name and cat, integer or string pid/tid, finite numeric ts/dur,
 * object or absent args) are interned and appended to column buffers; the indices of all other events are
 * returned for the validating per-event reader.  The result is identical to the Python twin. */
#include "stepscope_native.h"

#include <math.h>
#include <string.h>

#define LABEL_BASE ((int64_t)1 << 62)

typedef struct {
    char *data;
    size_t len;
    size_t cap;
} Column;

static int col_push(Column *c, const void *value, size_t size) {
    if (c->len + size > c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 4096;
        while (cap < c->len + size) {
            cap *= 2;
        }
        char *data = PyMem_Realloc(c->data, cap);
        if (data == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        c->data = data;
        c->cap = cap;
    }
    memcpy(c->data + c->len, value, size);
    c->len += size;
    return 0;
}

/* Id of a string in the builder's table, added when new; -1 with an exception on failure. */
static int64_t intern(PyObject *text, PyObject *ids, PyObject *strings) {
    PyObject *found = PyDict_GetItemWithError(ids, text);
    if (found != NULL) {
        return PyLong_AsLongLong(found);
    }
    if (PyErr_Occurred()) {
        return -1;
    }
    Py_ssize_t sid = PyList_GET_SIZE(strings);
    PyObject *key = PyLong_FromSsize_t(sid);
    if (key == NULL) {
        return -1;
    }
    int failed = PyDict_SetItem(ids, text, key) < 0 || PyList_Append(strings, text) < 0;
    Py_DECREF(key);
    return failed ? -1 : (int64_t)sid;
}

/* A pid/tid: 0 when absent, an integer (or integral float) in range, or a string label (left in
 * *label, to be interned once the whole event is known plain); 1 = ok, 0 = not plain, -1 = error. */
static int read_label(PyObject *event, PyObject *key, int64_t *out, PyObject **label) {
    *label = NULL;
    PyObject *value = PyDict_GetItemWithError(event, key);
    if (value == NULL) {
        *out = 0;
        return PyErr_Occurred() ? -1 : 1;
    }
    if (PyUnicode_CheckExact(value)) {
        *label = value;
        return 1;
    }
    if (PyFloat_CheckExact(value)) {
        double v = PyFloat_AS_DOUBLE(value);
        if (!(v == floor(v) && v >= -(double)LABEL_BASE && v < (double)LABEL_BASE)) {
            return 0;
        }
        *out = (int64_t)v;
        return 1;
    }
    if (!PyLong_CheckExact(value)) {
        return 0;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || v < -LABEL_BASE || v >= LABEL_BASE) {
        return 0;
    }
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    *out = v;
    return 1;
}

/* Microseconds (int or finite float) to rounded nanoseconds, as Python's round(value * 1000). */
static int read_us(PyObject *event, PyObject *key, int required, int64_t *out) {
    PyObject *value = PyDict_GetItemWithError(event, key);
    if (value == NULL) {
        *out = 0;
        return PyErr_Occurred() ? -1 : !required;
    }
    if (PyFloat_CheckExact(value)) {
        double ns = PyFloat_AS_DOUBLE(value) * 1000.0;
        if (!isfinite(ns) || fabs(ns) >= 9.2e18) {
            return 0;
        }
        *out = (int64_t)nearbyint(ns); /* round half to even, like round() */
        return 1;
    }
    if (PyLong_CheckExact(value)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (overflow || v > INT64_MAX / 1000 || v < -(INT64_MAX / 1000)) {
            return 0;
        }
        *out = (int64_t)v * 1000;
        return 1;
    }
    return 0;
}

/* Appends one event's columns; 1 = appended, 0 = not plain (nothing appended), -1 = error. */
static int read_plain(PyObject *event, PyObject *const keys[8], PyObject *skip_cat, PyObject *ids,
                      PyObject *strings, PyObject *args_store, Column cols[7]) {
    if (!PyDict_CheckExact(event)) {
        return 0;
    }
    PyObject *ph = PyDict_GetItemWithError(event, keys[0]);
    if (ph == NULL || !PyUnicode_CheckExact(ph) || PyUnicode_GET_LENGTH(ph) != 1 ||
        PyUnicode_READ_CHAR(ph, 0) != 'X') {
        return PyErr_Occurred() ? -1 : 0;
    }
    PyObject *name = PyDict_GetItemWithError(event, keys[1]);
    if (name == NULL && PyErr_Occurred()) {
        return -1;
    }
    if (name == Py_None) {
        name = NULL;
    }
    if (name != NULL && !PyUnicode_CheckExact(name)) {
        return 0;
    }
    PyObject *cat = PyDict_GetItemWithError(event, keys[2]);
    if (cat == NULL && PyErr_Occurred()) {
        return -1;
    }
    if (cat == Py_None) {
        cat = NULL;
    }
    if (cat != NULL && !PyUnicode_CheckExact(cat)) {
        return 0;
    }
    if (cat != NULL) {
        int same = PyUnicode_Compare(cat, skip_cat);
        if (same == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (same == 0) {
            return 0;
        }
    }
    int64_t pid, tid, start, dur;
    PyObject *pid_label, *tid_label;
    int ok;
    if ((ok = read_label(event, keys[3], &pid, &pid_label)) != 1 ||
        (ok = read_label(event, keys[4], &tid, &tid_label)) != 1 ||
        (ok = read_us(event, keys[5], 1, &start)) != 1 || (ok = read_us(event, keys[6], 0, &dur)) != 1) {
        return ok;
    }
    PyObject *args = PyDict_GetItemWithError(event, keys[7]);
    if (args == NULL && PyErr_Occurred()) {
        return -1;
    }
    if (args == Py_None) {
        args = NULL;
    }
    if (args != NULL && !PyDict_CheckExact(args)) {
        return 0;
    }
    int64_t name_id = name == NULL ? 0 : intern(name, ids, strings);
    int64_t cat_id = cat == NULL ? 0 : intern(cat, ids, strings);
    if (name_id < 0 || cat_id < 0) {
        return -1;
    }
    if (pid_label != NULL) {
        int64_t sid = intern(pid_label, ids, strings);
        if (sid < 0) {
            return -1;
        }
        pid = LABEL_BASE + sid;
    }
    if (tid_label != NULL) {
        int64_t sid = intern(tid_label, ids, strings);
        if (sid < 0) {
            return -1;
        }
        tid = LABEL_BASE + sid;
    }
    int32_t args_ref = -1;
    if (args != NULL) {
        args_ref = (int32_t)PyList_GET_SIZE(args_store);
        if (PyList_Append(args_store, args) < 0) {
            return -1;
        }
    }
    uint32_t name32 = (uint32_t)name_id, cat32 = (uint32_t)cat_id;
    if (col_push(&cols[0], &name32, 4) < 0 || col_push(&cols[1], &cat32, 4) < 0 ||
        col_push(&cols[2], &pid, 8) < 0 || col_push(&cols[3], &tid, 8) < 0 ||
        col_push(&cols[4], &start, 8) < 0 || col_push(&cols[5], &dur, 8) < 0 ||
        col_push(&cols[6], &args_ref, 4) < 0) {
        return -1;
    }
    return 1;
}

static PyObject *spans_from_events(PyObject *self, PyObject *call_args) {
    PyObject *events, *ids, *strings, *args_store, *skip_cat;
    if (!PyArg_ParseTuple(call_args, "O!O!O!O!U:spans_from_events", &PyList_Type, &events,
                          &PyDict_Type, &ids, &PyList_Type, &strings, &PyList_Type, &args_store,
                          &skip_cat)) {
        return NULL;
    }
    static const char *key_names[8] = {"ph", "name", "cat", "pid", "tid", "ts", "dur", "args"};
    PyObject *keys[8] = {NULL};
    Column cols[7];
    memset(cols, 0, sizeof(cols));
    PyObject *rest = PyList_New(0);
    PyObject *result = NULL;
    if (rest == NULL) {
        return NULL;
    }
    for (int k = 0; k < 8; k++) {
        keys[k] = PyUnicode_InternFromString(key_names[k]);
        if (keys[k] == NULL) {
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(events); i++) {
        PyObject *event = PyList_GET_ITEM(events, i);
        Py_INCREF(event);
        int read = read_plain(event, keys, skip_cat, ids, strings, args_store, cols);
        Py_DECREF(event);
        if (read < 0) {
            goto done;
        }
        if (read == 0) {
            PyObject *index = PyLong_FromSsize_t(i);
            if (index == NULL || PyList_Append(rest, index) < 0) {
                Py_XDECREF(index);
                goto done;
            }
            Py_DECREF(index);
        }
    }
    PyObject *columns = PyTuple_New(7);
    if (columns == NULL) {
        goto done;
    }
    for (int c = 0; c < 7; c++) {
        PyObject *data = PyBytes_FromStringAndSize(cols[c].data ? cols[c].data : "", (Py_ssize_t)cols[c].len);
        if (data == NULL) {
            Py_DECREF(columns);
            goto done;
        }
        PyTuple_SET_ITEM(columns, c, data);
    }
    result = PyTuple_Pack(2, rest, columns);
    Py_DECREF(columns);
done:
    for (int k = 0; k < 8; k++) {
        Py_XDECREF(keys[k]);
    }
    for (int c = 0; c < 7; c++) {
        PyMem_Free(cols[c].data);
    }
    Py_DECREF(rest);
    return result;
}

static PyMethodDef columns_methods[] = {
    {"spans_from_events", spans_from_events, METH_VARARGS,
     "spans_from_events(events, string_ids, strings, args_store, skip_cat) -> (rest, columns)."},
    {NULL, NULL, 0, NULL},
};

int ss_columns_init(PyObject *module) {
    return PyModule_AddFunctions(module, columns_methods);
}
