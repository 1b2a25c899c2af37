/* The stack samples of a Chrome trace (its top-level "samples" list) read into sample columns
 * without a Python object per sample.  A sample's stack-frame key ("sf", as str(sf)) is kept as an
 * index into the distinct keys, which chrome_reader resolves against "stackFrames"; anything the
 * per-sample reader would reject makes the document one for that reader (the twin), which words
 * the error. */
#include "chrome_scan.h"

typedef struct {
    Token pid, tid, ts, sf, weight, name;
} SampleTokens;

/* One sample object's members.  0 / -1 bad JSON. */
static int read_sample(Cursor *c, SampleTokens *t) {
    int plain, more;
    memset(t, 0, sizeof(*t));
    for (more = cj_enter(c, '{', '}'); more == 1; more = cj_next_item(c, '}')) {
        const char *key;
        size_t key_len;
        if (cj_member_key(c, &key, &key_len, &plain) < 0) return -1;
        if (!plain) key_len = 0; /* escaped keys match nothing */
        Token value = {c->p, NULL};
        if (cj_skip_value(c, 1) < 0) return -1;
        value.end = c->p;
#define KEY(k) (key_len == sizeof(k) - 1 && memcmp(key, k, key_len) == 0)
        if (KEY("pid")) t->pid = value;
        else if (KEY("tid")) t->tid = value;
        else if (KEY("ts")) t->ts = value;
        else if (KEY("sf")) t->sf = value;
        else if (KEY("weight")) t->weight = value;
        else if (KEY("name")) t->name = value;
#undef KEY
    }
    return more < 0 ? -1 : 0;
}

/* The index of a stack-frame key, added when new: a string as it is, an integer as str() writes
 * it.  -1 error, -2 another value (left to the per-sample reader). */
static int64_t frame_key(Scan *s, const Token *t) {
    PyObject *key;
    int is_int;
    long long i;
    double d;
    if (*t->start == '"') {
        key = cj_decode_string(t, s->loads);
    } else if (cj_parse_number(t, &is_int, &i, &d) && is_int) {
        key = PyUnicode_FromFormat("%lld", i);
    } else {
        return -2;
    }
    if (key == NULL) return -1;
    PyObject *found = PyDict_GetItemWithError(s->sf_index, key);
    int64_t index = -1;
    if (found != NULL) {
        index = PyLong_AsLongLong(found);
    } else if (!PyErr_Occurred()) {
        PyObject *number = PyLong_FromSsize_t(PyList_GET_SIZE(s->sf_keys));
        if (number != NULL && PyDict_SetItem(s->sf_index, key, number) == 0 &&
            PyList_Append(s->sf_keys, key) == 0)
            index = PyList_GET_SIZE(s->sf_keys) - 1;
        Py_XDECREF(number);
    }
    Py_DECREF(key);
    return index;
}

/* Whether a name token is the string "idle"; -1 with an error. */
static int is_idle(Scan *s, const Token *t) {
    if (t->start == NULL || *t->start != '"') return 0;
    if (memchr(t->start, '\\', (size_t)(t->end - t->start)) == NULL) {
        return t->end - t->start == 6 && memcmp(t->start, "\"idle\"", 6) == 0;
    }
    PyObject *value = cj_decode_string(t, s->loads);
    if (value == NULL) return -1;
    int same = PyUnicode_CompareWithASCIIString(value, "idle") == 0;
    Py_DECREF(value);
    return same;
}

/* One sample into the columns; 1 done, 0 left to the per-sample reader, -1 error. */
static int add_sample(Scan *s, const SampleTokens *t) {
    int64_t pid, tid, ts = 0, weight = 1, sf = -1;
    int pid_label, tid_label, idle;
    if (!scan_check_label(&t->pid, &pid, &pid_label) || !scan_check_label(&t->tid, &tid, &tid_label))
        return 0;
    if ((t->ts.start != NULL && !scan_parse_us(&t->ts, &ts)) ||
        (t->weight.start != NULL && !scan_int64(&t->weight, &weight)))
        return 0;
    if (t->sf.start != NULL && !cj_token_is(&t->sf, "null") && (sf = frame_key(s, &t->sf)) < 0)
        return sf == -2 ? 0 : -1;
    if ((idle = is_idle(s, &t->name)) < 0) return -1;
    if ((pid = scan_label_value(s, &t->pid, pid, pid_label)) == -1 && PyErr_Occurred()) return -1;
    if ((tid = scan_label_value(s, &t->tid, tid, tid_label)) == -1 && PyErr_Occurred()) return -1;
    int32_t sf32 = (int32_t)sf;
    uint8_t idle8 = (uint8_t)idle;
    SsBuffer *c = s->samples;
    if (ss_buffer_put(&c[0], &pid, 8) < 0 || ss_buffer_put(&c[1], &tid, 8) < 0 ||
        ss_buffer_put(&c[2], &ts, 8) < 0 || ss_buffer_put(&c[3], &sf32, 4) < 0 ||
        ss_buffer_put(&c[4], &weight, 8) < 0 || ss_buffer_put(&c[5], &idle8, 1) < 0)
        return -1;
    return 1;
}

int scan_samples(Cursor *c, Scan *s) {
    int more, r = 1;
    s->sf_keys = PyList_New(0);
    s->sf_index = PyDict_New();
    if (s->sf_keys == NULL || s->sf_index == NULL) return -1;
    for (more = cj_enter(c, '[', ']'); more == 1 && r == 1; more = cj_next_item(c, ']')) {
        SampleTokens t;
        cj_skip_ws(c);
        if (c->p >= c->end || *c->p != '{' || read_sample(c, &t) < 0) return 1;
        r = add_sample(s, &t);
    }
    if (r < 0) {
        if (PyErr_ExceptionMatches(PyExc_MemoryError)) return -1;
        PyErr_Clear(); /* a string json.loads refused: the ordinary parse words it */
    }
    return r != 1 || more < 0;
}
