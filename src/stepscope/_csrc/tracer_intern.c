/* The function tracer's interning (see tracer.h): each code object and C function it meets gets
 * one id and one include/exclude decision (the filter's, asked once), and one reference held
 * until the session is cleared.  The event path looks slots up with slot_find (tracer.h) and
 * comes here only for a target it has not seen. */
#include "tracer.h"

int tr_slots_grow(void) {
    size_t cap = ss_tracer.slots_cap ? ss_tracer.slots_cap * 2 : 1024;
    Slot *fresh = calloc(cap, sizeof(Slot));
    if (fresh == NULL) {
        return -1;
    }
    Slot *old = ss_tracer.slots;
    size_t old_cap = ss_tracer.slots_cap;
    ss_tracer.slots = fresh;
    ss_tracer.slots_cap = cap;
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i].id) {
            *slot_find(old[i].k1, old[i].k2) = old[i];
        }
    }
    free(old);
    return 0;
}

static int in_ignore_set(PyObject *code) {
    if (ss_tracer.ignore == NULL) {
        return 0;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(ss_tracer.ignore);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyTuple_GET_ITEM(ss_tracer.ignore, i) == code) {
            return 1;
        }
    }
    return 0;
}

/* The pending exception as one object (cleared from the thread). */
static PyObject *take_exception(void) {
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
#endif
}

/* Ask the filter; a failing filter includes the target and is reported at stop. */
static int ask_filter(PyObject *target) {
    if (ss_tracer.filter == NULL) {
        return 1;
    }
    PyObject *res = PyObject_CallOneArg(ss_tracer.filter, target);
    if (res == NULL) {
        ss_tracer.filter_errors++;
        if (ss_tracer.first_error == NULL) {
            ss_tracer.first_error = take_exception();
        } else {
            PyErr_Clear();
        }
        return 1;
    }
    int include = PyObject_IsTrue(res);
    Py_DECREF(res);
    if (include < 0) {
        PyErr_Clear();
        ss_tracer.filter_errors++;
        return 1;
    }
    return include;
}

/* Add a key (caller decided `include` first; the filter may have let other threads run). */
static Slot *intern_insert(const void *k1, const void *k2, PyObject *obj, PyObject *pin,
                           int include) {
    Slot *s = slot_find(k1, k2);
    if (s->id) {
        return s; /* another thread interned it while the filter ran */
    }
    if ((ss_tracer.n_interned + 1) * 2 > ss_tracer.slots_cap) {
        if (tr_slots_grow() < 0) {
            return NULL;
        }
        s = slot_find(k1, k2);
    }
    if (ss_tracer.n_interned >= (1u << 30) - 1) {
        return NULL; /* ids must fit the record's 30 bits */
    }
    if (ss_tracer.n_interned == ss_tracer.interned_cap) {
        uint32_t cap = ss_tracer.interned_cap ? ss_tracer.interned_cap * 2 : 512;
        Interned *grown = realloc(ss_tracer.interned, cap * sizeof(Interned));
        if (grown == NULL) {
            return NULL;
        }
        ss_tracer.interned = grown;
        ss_tracer.interned_cap = cap;
    }
    Interned *e = &ss_tracer.interned[ss_tracer.n_interned];
    e->obj = Py_NewRef(obj);
    e->pin = Py_XNewRef(pin);
    e->include = include;
    s->k1 = k1;
    s->k2 = k2;
    s->include = (uint32_t)include;
    s->id = ++ss_tracer.n_interned;
    return s;
}

Slot *tr_intern_code(PyObject *code) {
    Slot *s = slot_find(code, NULL);
    if (s->id) {
        return s;
    }
    int include = in_ignore_set(code) ? 0 : ask_filter(code);
    return intern_insert(code, NULL, code, NULL, include);
}

/* A type's module (its __module__, or "builtins"). */
static PyObject *type_module(PyTypeObject *type) {
    PyObject *mod = PyObject_GetAttrString((PyObject *)type, "__module__");
    if (mod == NULL || !PyUnicode_Check(mod)) {
        Py_XDECREF(mod);
        PyErr_Clear();
        return PyUnicode_FromString("builtins");
    }
    return mod;
}

/* C callables: keyed by (method def, receiver type); named "<built-in function NAME>" or
 * "<built-in method NAME of MODULE.QUALNAME object>" (no module for builtins).  The extension's
 * own functions are never recorded. */
Slot *tr_intern_c(PyMethodDef *ml, PyObject *self, PyObject *module) {
    PyTypeObject *type = (self == NULL || PyModule_Check(self)) ? NULL : Py_TYPE(self);
    Slot *s = slot_find(ml, type);
    if (s->id) {
        return s;
    }
    PyObject *name = NULL;
    PyObject *mod_name = NULL;
    if (type == NULL) {
        name = PyUnicode_FromFormat("<built-in function %s>", ml->ml_name);
        mod_name = (module != NULL && PyUnicode_Check(module)) ? Py_NewRef(module)
                                                                : PyUnicode_FromString("builtins");
    } else {
        mod_name = type_module(type);
        PyObject *qualname = PyObject_GetAttrString((PyObject *)type, "__qualname__");
        if (qualname != NULL && PyUnicode_Check(qualname) && mod_name != NULL) {
            if (PyUnicode_CompareWithASCIIString(mod_name, "builtins") == 0) {
                name = PyUnicode_FromFormat("<built-in method %s of %U object>", ml->ml_name,
                                            qualname);
            } else {
                name = PyUnicode_FromFormat("<built-in method %s of %U.%U object>", ml->ml_name,
                                            mod_name, qualname);
            }
        }
        Py_XDECREF(qualname);
    }
    if (name == NULL || mod_name == NULL) {
        Py_XDECREF(name);
        Py_XDECREF(mod_name);
        PyErr_Clear();
        return NULL;
    }
    int include = PyUnicode_CompareWithASCIIString(mod_name, "stepscope._native") != 0 &&
                  ask_filter(mod_name);
    Py_DECREF(mod_name);
    s = intern_insert(ml, type, name, (PyObject *)type, include);
    Py_DECREF(name);
    return s;
}
