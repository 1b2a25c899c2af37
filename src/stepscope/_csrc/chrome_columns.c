/* Parsed Chrome-trace events to span columns in one pass (twin: chrome_reader.spans_from_events_python),
 * and one trace's columns re-based for another's builder (remap_column, twin: trace/remap.py).
 *
 * Plain "X" events (string or absent name and cat, integer or string pid/tid, finite numeric ts/dur,
 * object or absent args) are interned and appended to column buffers; the indices of all other events are
 * returned for the validating per-event reader.  The result is identical to the Python twin. */
#include "chrome_values.h"

int64_t ss_intern(PyObject *text, PyObject *ids, PyObject *strings) {
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

int ss_span_append(SsBuffer cols[7], PyObject *ids, PyObject *strings, PyObject *name, PyObject *cat,
                   int64_t pid, PyObject *pid_label, int64_t tid, PyObject *tid_label, int64_t start,
                   int64_t dur, int32_t args_ref) {
    int64_t name_id = name == NULL ? 0 : ss_intern(name, ids, strings);
    int64_t cat_id = cat == NULL ? 0 : ss_intern(cat, ids, strings);
    int64_t pid_id = pid_label == NULL ? 0 : ss_intern(pid_label, ids, strings);
    int64_t tid_id = tid_label == NULL ? 0 : ss_intern(tid_label, ids, strings);
    if (name_id < 0 || cat_id < 0 || pid_id < 0 || tid_id < 0) {
        return -1;
    }
    if (pid_label != NULL) {
        pid = LABEL_BASE + pid_id;
    }
    if (tid_label != NULL) {
        tid = LABEL_BASE + tid_id;
    }
    uint32_t name32 = (uint32_t)name_id, cat32 = (uint32_t)cat_id;
    if (ss_buffer_put(&cols[0], &name32, 4) < 0 || ss_buffer_put(&cols[1], &cat32, 4) < 0 ||
        ss_buffer_put(&cols[2], &pid, 8) < 0 || ss_buffer_put(&cols[3], &tid, 8) < 0 ||
        ss_buffer_put(&cols[4], &start, 8) < 0 || ss_buffer_put(&cols[5], &dur, 8) < 0 ||
        ss_buffer_put(&cols[6], &args_ref, 4) < 0) {
        return -1;
    }
    return 0;
}

PyObject *ss_span_columns(const SsBuffer cols[7]) {
    PyObject *columns = PyTuple_New(7);
    for (int c = 0; columns != NULL && c < 7; c++) {
        PyObject *data =
            PyBytes_FromStringAndSize(cols[c].data ? cols[c].data : "", (Py_ssize_t)cols[c].len);
        if (data == NULL) {
            Py_CLEAR(columns);
            break;
        }
        PyTuple_SET_ITEM(columns, c, data);
    }
    return columns;
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
        return ss_label_from_double(PyFloat_AS_DOUBLE(value), out);
    }
    if (!PyLong_CheckExact(value)) {
        return 0;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    return !overflow && ss_label_from_int(v, out);
}

/* Microseconds (int or finite float) to rounded nanoseconds, as Python's round(value * 1000). */
static int read_us(PyObject *event, PyObject *key, int required, int64_t *out) {
    PyObject *value = PyDict_GetItemWithError(event, key);
    if (value == NULL) {
        *out = 0;
        return PyErr_Occurred() ? -1 : !required;
    }
    if (PyFloat_CheckExact(value)) {
        return ss_us_double_to_ns(PyFloat_AS_DOUBLE(value), out);
    }
    if (PyLong_CheckExact(value)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (v == -1 && PyErr_Occurred()) {
            return -1;
        }
        return !overflow && ss_us_int_to_ns(v, out);
    }
    return 0;
}

/* Appends one event's columns; 1 = appended, 0 = not plain (nothing appended), -1 = error. */
static int read_plain(PyObject *event, PyObject *const keys[8], PyObject *skip_cat, PyObject *ids,
                      PyObject *strings, PyObject *args_store, SsBuffer cols[7]) {
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
    int32_t args_ref = -1;
    if (args != NULL) {
        args_ref = (int32_t)PyList_GET_SIZE(args_store);
        if (PyList_Append(args_store, args) < 0) {
            return -1;
        }
    }
    return ss_span_append(cols, ids, strings, name, cat, pid, pid_label, tid, tid_label, start, dur,
                          args_ref) < 0
               ? -1
               : 1;
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
    SsBuffer cols[7];
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
    PyObject *columns = ss_span_columns(cols);
    if (columns == NULL) {
        goto done;
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

/* One column of a trace re-based for another trace's builder (twin: trace/remap.py's
 * remapped_python): mode 0 string ids through `table`, 1 pid/tid labels (string labels through
 * `table`), 2 times plus `offset`, 3 args refs plus `offset` (-1 stays). */
static PyObject *remap_column(PyObject *self, PyObject *call_args) {
    Py_buffer src, map = {0};
    int mode;
    long long offset;
    if (!PyArg_ParseTuple(call_args, "y*iz*L:remap_column", &src, &mode, &map, &offset)) {
        return NULL;
    }
    PyObject *out = NULL;
    size_t width = mode == 0 ? 4 : mode == 3 ? 4 : 8;
    Py_ssize_t n = src.len / (Py_ssize_t)width, mapped = map.buf ? map.len / 4 : 0;
    const uint32_t *table = map.buf;
    if (mode < 0 || mode > 3 || src.len % (Py_ssize_t)width != 0 || ((mode == 0 || mode == 1) && !map.buf)) {
        PyErr_SetString(PyExc_ValueError, "remap_column: bad mode, column or table");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, src.len);
    if (out == NULL) goto done;
    char *dst = PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (mode == 0 || mode == 3) {
            uint32_t v;
            memcpy(&v, (const char *)src.buf + i * 4, 4);
            if (mode == 3) {
                int32_t ref = (int32_t)v;
                if (ref >= 0 && (int64_t)ref + offset > INT32_MAX) goto overflow;
                v = (uint32_t)(ref >= 0 ? (int32_t)(ref + offset) : ref); /* -1 or a python_ids ref */
            } else if ((Py_ssize_t)v >= mapped) {
                goto out_of_table;
            } else {
                v = table[v];
            }
            memcpy(dst + i * 4, &v, 4);
        } else {
            int64_t v;
            memcpy(&v, (const char *)src.buf + i * 8, 8);
            if (mode == 1 && v >= LABEL_BASE) {
                if (v - LABEL_BASE >= mapped) goto out_of_table;
                v = LABEL_BASE + table[v - LABEL_BASE];
            } else if (mode == 2 && __builtin_add_overflow(v, (int64_t)offset, &v)) {
                goto overflow;
            }
            memcpy(dst + i * 8, &v, 8);
        }
    }
    goto done;
out_of_table:
    Py_CLEAR(out);
    PyErr_SetString(PyExc_IndexError, "remap_column: a string id beyond the table");
    goto done;
overflow:
    Py_CLEAR(out);
    PyErr_SetString(PyExc_OverflowError, "remap_column: a value out of range once shifted");
done:
    PyBuffer_Release(&src);
    if (map.buf) PyBuffer_Release(&map);
    return out;
}

static PyMethodDef columns_methods[] = {
    {"spans_from_events", spans_from_events, METH_VARARGS,
     "spans_from_events(events, string_ids, strings, args_store, skip_cat) -> (rest, columns)."},
    {"remap_column", remap_column, METH_VARARGS,
     "remap_column(column, mode, table, offset) -> bytes: a column re-based for another builder."},
    {NULL, NULL, 0, NULL},
};

int ss_chrome_columns_init(PyObject *module) {
    return PyModule_AddFunctions(module, columns_methods);
}

