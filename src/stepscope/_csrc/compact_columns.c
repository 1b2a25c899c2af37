/* Columns of the compact trace form as LEB128 varints (twin: trace/compact_varint.py).
 *
 * pack_varints turns a column (an array of typecode B, I, i or q) into varints: signed columns and
 * delta-coded ones (each value minus the one before) are zigzag-mapped first, so small negative
 * numbers stay short; values below `floor` (optional) are written as `floor`, and so are those that
 * index a zero of `empty` (optional, an int64 column: the args refs of empty mappings, which the
 * Chrome file leaves out).  unpack_varints reads `count` of them back from `offset` into the column's
 * bytes and says where it stopped; a truncated stream, a varint of more than 64 bits or a value
 * that does not fit the typecode is a ValueError (the reader names the file).
 *
 * column_min is the smallest value of an int64 column (None when empty). */
#include "stepscope_native.h"

#include <stdint.h>
#include <string.h>

static int width_of(int code, int *is_signed) {
    *is_signed = code == 'i' || code == 'q';
    return code == 'B' ? 1 : (code == 'I' || code == 'i') ? 4 : code == 'q' ? 8 : 0;
}

static int64_t load(const char *p, int width, int is_signed) {
    if (width == 1) return (int64_t)(uint8_t)*p;
    if (width == 4) {
        uint32_t u;
        memcpy(&u, p, 4);
        return is_signed ? (int64_t)(int32_t)u : (int64_t)u;
    }
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}

static PyObject *pack_varints(PyObject *self, PyObject *args) {
    Py_buffer col, empty = {0};
    int code, delta;
    long long floor = INT64_MIN;
    if (!PyArg_ParseTuple(args, "y*Cp|Ly*:pack_varints", &col, &code, &delta, &floor, &empty)) return NULL;
    int is_signed, width = width_of(code, &is_signed);
    PyObject *out = NULL;
    const int64_t *zeros = empty.buf;
    int64_t nzeros = empty.buf ? empty.len / 8 : 0;
    if (width == 0 || col.len % width != 0 || (empty.buf && empty.len % 8 != 0)) {
        PyErr_SetString(PyExc_ValueError, "pack_varints: bad typecode or column length");
        goto done;
    }
    Py_ssize_t n = col.len / width;
    out = PyBytes_FromStringAndSize(NULL, n * 10 + 1);
    if (out == NULL) goto done;
    uint8_t *dst = (uint8_t *)PyBytes_AS_STRING(out), *start = dst;
    const char *src = col.buf;
    int64_t prev = 0;
    int zigzag = delta || is_signed;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t v = load(src + i * width, width, is_signed);
        uint64_t u;
        if (v < floor || (v >= 0 && v < nzeros && zeros[v] == 0)) v = floor;
        if (delta) {
            uint64_t d = (uint64_t)v - (uint64_t)prev; /* wraps like the twin's mask */
            prev = v;
            v = (int64_t)d;
        }
        u = zigzag ? ((uint64_t)v << 1) ^ (uint64_t)(v >> 63) : (uint64_t)v;
        while (u >= 0x80) {
            *dst++ = (uint8_t)(u | 0x80);
            u >>= 7;
        }
        *dst++ = (uint8_t)u;
    }
    _PyBytes_Resize(&out, dst - start);
done:
    PyBuffer_Release(&col);
    if (empty.buf) PyBuffer_Release(&empty);
    return out;
}

static PyObject *unpack_varints(PyObject *self, PyObject *args) {
    Py_buffer data;
    Py_ssize_t offset, count;
    int code, delta;
    if (!PyArg_ParseTuple(args, "y*nnCp:unpack_varints", &data, &offset, &count, &code, &delta))
        return NULL;
    int is_signed, width = width_of(code, &is_signed);
    PyObject *out = NULL, *result = NULL;
    if (width == 0 || offset < 0 || count < 0 || offset > data.len || count > data.len - offset) {
        PyErr_SetString(PyExc_ValueError, "column data truncated or malformed");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, count * width);
    if (out == NULL) goto done;
    char *dst = PyBytes_AS_STRING(out);
    const uint8_t *p = (const uint8_t *)data.buf + offset, *end = (const uint8_t *)data.buf + data.len;
    int64_t prev = 0;
    int zigzag = delta || is_signed;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint64_t u = 0;
        int shift = 0;
        for (;;) {
            if (p >= end || shift > 63) {
                PyErr_SetString(PyExc_ValueError, "column data truncated or malformed");
                goto fail;
            }
            uint8_t b = *p++;
            u |= (uint64_t)(b & 0x7f) << shift;
            shift += 7;
            if (!(b & 0x80)) break;
        }
        int64_t v = zigzag ? (int64_t)((u >> 1) ^ (~(u & 1) + 1)) : (int64_t)u;
        if (delta) {
            v = (int64_t)((uint64_t)prev + (uint64_t)v);
            prev = v;
        }
        if (width == 1) {
            if (v < 0 || v > 0xff) goto range;
            dst[i] = (char)v;
        } else if (width == 4) {
            if (is_signed ? (v < INT32_MIN || v > INT32_MAX) : (v < 0 || v > (int64_t)UINT32_MAX))
                goto range;
            uint32_t w = (uint32_t)v;
            memcpy(dst + i * 4, &w, 4);
        } else {
            if (!is_signed && v < 0) goto range;
            memcpy(dst + i * 8, &v, 8);
        }
    }
    result = Py_BuildValue("On", out, (Py_ssize_t)(p - (const uint8_t *)data.buf));
    goto fail;
range:
    PyErr_SetString(PyExc_ValueError, "column value out of range");
fail:
    Py_XDECREF(out);
done:
    PyBuffer_Release(&data);
    return result;
}

static PyObject *column_min(PyObject *self, PyObject *arg) {
    Py_buffer col;
    if (PyObject_GetBuffer(arg, &col, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    PyObject *out = NULL;
    if (col.itemsize != 8 || col.format == NULL || strcmp(col.format, "q") != 0) {
        PyErr_SetString(PyExc_TypeError, "column_min: the column must be of typecode q");
    } else if (col.len == 0) {
        out = Py_NewRef(Py_None);
    } else {
        const int64_t *v = col.buf;
        Py_ssize_t n = col.len / 8;
        int64_t low = v[0];
        for (Py_ssize_t i = 1; i < n; i++)
            if (v[i] < low) low = v[i];
        out = PyLong_FromLongLong(low);
    }
    PyBuffer_Release(&col);
    return out;
}

static PyMethodDef compact_methods[] = {
    {"column_min", column_min, METH_O, "column_min(int64 column) -> its smallest value or None."},
    {"pack_varints", pack_varints, METH_VARARGS,
     "pack_varints(column, typecode, delta, floor=INT64_MIN, empty=None) -> bytes: a column as (zigzag, "
     "delta) varints."},
    {"unpack_varints", unpack_varints, METH_VARARGS,
     "unpack_varints(data, offset, count, typecode, delta) -> (column bytes, end offset)."},
    {NULL, NULL, 0, NULL},
};

int ss_compact_columns_init(PyObject *module) { return PyModule_AddFunctions(module, compact_methods); }
