/* A Chrome trace's "traceEvents" read without building Python objects for its X events.
 *
 * scan_trace walks the document once.  Each plain "X" event (ASCII name/cat without escapes, integer
 * or string pid/tid, numeric ts/dur) goes straight into span columns, its args kept as compact JSON
 * text (whitespace dropped, optionally Kineto's bookkeeping keys too) wrapped in RawArgs, parsed
 * only if read.  Every other event is parsed with json.loads and returned with its index.  When the
 * document is not a well-formed object with a traceEvents list, it returns None and the caller
 * parses it the ordinary way (which also words the error).  The ordinary path is the twin: both
 * give the same trace. */
#include "chrome_values.h"

#include <errno.h>
#include <stdlib.h>

#define MAX_INT_DIGITS 4300 /* CPython's default int_max_str_digits */
#define MAX_MEMBERS 64 /* args members kept on the stack; more go to the heap */

typedef struct {
    const char *p;
    const char *end;
} Cursor;

static inline void skip_ws(Cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t')) {
        c->p++;
    }
}

/* A JSON string at c->p (validated); sets *plain when it is ASCII without escapes.  0 / -1. */
static int skip_string(Cursor *c, int *plain) {
    if (c->p >= c->end || *c->p != '"') {
        return -1;
    }
    c->p++;
    *plain = 1;
    while (c->p < c->end) {
        unsigned char ch = (unsigned char)*c->p;
        if (ch == '"') {
            c->p++;
            return 0;
        }
        if (ch < 0x20) {
            return -1;
        }
        if (ch >= 0x80) {
            *plain = 0;
        } else if (ch == '\\') {
            *plain = 0;
            c->p++;
            if (c->p >= c->end) {
                return -1;
            }
            char e = *c->p;
            if (e == 'u') {
                for (int k = 1; k <= 4; k++) {
                    if (c->p + k >= c->end || !strchr("0123456789abcdefABCDEF", c->p[k]) || !c->p[k]) {
                        return -1;
                    }
                }
                c->p += 4;
            } else if (!strchr("\"\\/bfnrt", e) || !e) {
                return -1;
            }
        }
        c->p++;
    }
    return -1;
}

/* A JSON number (strict grammar); *is_int when it has no fraction or exponent.  0 / -1. */
static int skip_number(Cursor *c, int *is_int) {
    const char *p = c->p;
    *is_int = 1;
    if (p < c->end && *p == '-') p++;
    if (p >= c->end) return -1;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        const char *digits = p;
        while (p < c->end && *p >= '0' && *p <= '9') p++;
        /* json.loads refuses integers longer than sys.get_int_max_str_digits() (4300 by
         * default): leave such documents to it, so the error is the same either way */
        if (p - digits > MAX_INT_DIGITS && (p >= c->end || (*p != '.' && *p != 'e' && *p != 'E')))
            return -1;
    } else {
        return -1;
    }
    if (p < c->end && *p == '.') {
        *is_int = 0;
        p++;
        if (p >= c->end || *p < '0' || *p > '9') return -1;
        while (p < c->end && *p >= '0' && *p <= '9') p++;
    }
    if (p < c->end && (*p == 'e' || *p == 'E')) {
        *is_int = 0;
        p++;
        if (p < c->end && (*p == '+' || *p == '-')) p++;
        if (p >= c->end || *p < '0' || *p > '9') return -1;
        while (p < c->end && *p >= '0' && *p <= '9') p++;
    }
    c->p = p;
    return 0;
}

static int skip_literal(Cursor *c, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n) != 0) {
        return -1;
    }
    c->p += n;
    return 0;
}

/* Consumes `open`; 1 = items follow, 0 = it closed at once (consumed), -1 = not there. */
static int enter(Cursor *c, char open, char close) {
    if (c->p >= c->end || *c->p != open) return -1;
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == close) {
        c->p++;
        return 0;
    }
    return 1;
}

/* After an item: 1 = a comma (another item follows), 0 = `close` (consumed), -1 = bad JSON. */
static int next_item(Cursor *c, char close) {
    skip_ws(c);
    if (c->p < c->end && (*c->p == ',' || *c->p == close)) {
        return *c->p++ == ',';
    }
    return -1;
}

/* A member's key and its colon; *key, *len = the key's text, *plain = ASCII without escapes. */
static int member_key(Cursor *c, const char **key, size_t *len, int *plain) {
    skip_ws(c);
    *key = c->p + 1;
    if (skip_string(c, plain) < 0) return -1;
    *len = (size_t)(c->p - 1 - *key);
    skip_ws(c);
    if (c->p >= c->end || *c->p != ':') return -1;
    c->p++;
    skip_ws(c);
    return 0;
}

/* Any JSON value (strict; NaN/Infinity are not taken).  0 / -1. */
static int skip_value(Cursor *c, int depth) {
    int plain, is_int, more;
    const char *key;
    size_t len;
    if (depth > 200) return -1;
    skip_ws(c);
    if (c->p >= c->end) return -1;
    switch (*c->p) {
    case '"':
        return skip_string(c, &plain);
    case '{':
        for (more = enter(c, '{', '}'); more == 1; more = next_item(c, '}')) {
            if (member_key(c, &key, &len, &plain) < 0 || skip_value(c, depth + 1) < 0) return -1;
        }
        return more;
    case '[':
        for (more = enter(c, '[', ']'); more == 1; more = next_item(c, ']')) {
            if (skip_value(c, depth + 1) < 0) return -1;
        }
        return more;
    case 't':
        return skip_literal(c, "true");
    case 'f':
        return skip_literal(c, "false");
    case 'n':
        return skip_literal(c, "null");
    default:
        return skip_number(c, &is_int);
    }
}

/* Copies the JSON text [from, to) without whitespace outside strings. */
static int put_compact(SsBuffer *o, const char *from, const char *to) {
    const char *run = from;
    int in_string = 0;
    for (const char *p = from; p < to; p++) {
        char ch = *p;
        if (in_string) {
            if (ch == '\\') {
                p++;
            } else if (ch == '"') {
                in_string = 0;
            }
        } else if (ch == '"') {
            in_string = 1;
        } else if (ch == ' ' || ch == '\n' || ch == '\r' || ch == '\t') {
            if (ss_buffer_put(o, run, (size_t)(p - run)) < 0) return -1;
            run = p + 1;
        }
    }
    return ss_buffer_put(o, run, (size_t)(to - run));
}

typedef struct {
    const char *key, *key_end; /* the key's text between its quotes */
    const char *value, *value_end;
} Member;

static int key_is(const Member *m, const char *name) {
    size_t n = strlen(name);
    return (size_t)(m->key_end - m->key) == n && memcmp(m->key, name, n) == 0;
}

/* An array holding only empty strings (whitespace allowed). */
static int all_empty_strings(const char *p, const char *end) {
    for (; p < end; p++) {
        if (*p == '"') {
            if (p + 1 >= end || p[1] != '"') return 0;
            p++;
        } else if (!strchr("[], \n\r\t", *p)) {
            return 0;
        }
    }
    return 1;
}

/* Whether a top-level args member is Kineto bookkeeping (the twin: trace/kineto.py). */
static int is_bookkeeping(const Member *m, const Member *all, Py_ssize_t count) {
    if (key_is(m, "Ev Idx")) return 1;
    if (key_is(m, "Record function id")) {
        return m->value_end - m->value == 1 && m->value[0] == '0';
    }
    if (key_is(m, "Concrete Inputs") && *m->value == '[' && all_empty_strings(m->value, m->value_end)) {
        for (Py_ssize_t i = 0; i < count; i++) {
            if (key_is(&all[i], "Input Dims")) return 1;
        }
    }
    return 0;
}

/* The args object at c->p as compact text; *members = how many are kept.  0 / -1 (bad JSON, or
 * no memory with MemoryError set). */
static int read_args(Cursor *c, int drop, SsBuffer *o, Py_ssize_t *members) {
    Member local[MAX_MEMBERS], *all = local;
    Py_ssize_t count = 0, cap = MAX_MEMBERS;
    int plain, r = -1;
    const char *start = c->p;
    int more;
    for (more = enter(c, '{', '}'); more == 1; more = next_item(c, '}')) {
        Member m;
        size_t key_len;
        if (member_key(c, &m.key, &key_len, &plain) < 0) goto out;
        m.key_end = m.key + key_len;
        m.value = c->p;
        if (skip_value(c, 1) < 0) goto out;
        m.value_end = c->p;
        if (count == cap) {
            Member *grown = PyMem_Malloc((size_t)cap * 2 * sizeof(Member));
            if (grown == NULL) {
                PyErr_NoMemory();
                goto out;
            }
            memcpy(grown, all, (size_t)count * sizeof(Member));
            if (all != local) PyMem_Free(all);
            all = grown;
            cap *= 2;
        }
        all[count++] = m;
    }
    if (more < 0) goto out;
    o->len = 0;
    if (!drop) {
        *members = count;
        r = put_compact(o, start, c->p);
        goto out;
    }
    Py_ssize_t kept = 0;
    if (ss_buffer_put(o, "{", 1) < 0) goto out;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (is_bookkeeping(&all[i], all, count)) continue;
        if ((kept && ss_buffer_put(o, ",", 1) < 0) || ss_buffer_put(o, "\"", 1) < 0 ||
            ss_buffer_put(o, all[i].key, (size_t)(all[i].key_end - all[i].key)) < 0 ||
            ss_buffer_put(o, "\":", 2) < 0 || put_compact(o, all[i].value, all[i].value_end) < 0)
            goto out;
        kept++;
    }
    *members = kept;
    r = ss_buffer_put(o, "}", 1);
out:
    if (all != local) PyMem_Free(all);
    return r;
}

typedef struct {
    const char *start, *end; /* the value's JSON text; start NULL when the key is absent */
} Token;

typedef struct {
    Token ph, name, cat, pid, tid, ts, dur;
    int args; /* 0 absent or null, 1 object (text in the args buffer), -1 another type */
    Py_ssize_t members;
} Event;

static int token_is(const Token *t, const char *text) {
    size_t n = strlen(text);
    return t->start != NULL && (size_t)(t->end - t->start) == n && memcmp(t->start, text, n) == 0;
}

/* One event; its members' text in *ev, its args' compact text in *args.  1 = an X event,
 * 0 = another value, -1 = bad JSON. */
static int read_event(Cursor *c, int drop, SsBuffer *args, Event *ev) {
    int plain, more;
    memset(ev, 0, sizeof(*ev));
    if (c->p >= c->end || *c->p != '{') {
        return skip_value(c, 0) < 0 ? -1 : 0;
    }
    for (more = enter(c, '{', '}'); more == 1; more = next_item(c, '}')) {
        const char *key;
        size_t key_len;
        if (member_key(c, &key, &key_len, &plain) < 0) return -1;
        if (!plain) key_len = 0; /* escaped keys match nothing */
        Token value = {c->p, NULL};
#define KEY(s) (key_len == sizeof(s) - 1 && memcmp(key, s, key_len) == 0)
        if (KEY("args") && c->p < c->end && *c->p == '{') {
            if (read_args(c, drop, args, &ev->members) < 0) return -1;
            ev->args = 1;
            continue;
        }
        if (skip_value(c, 1) < 0) return -1;
        value.end = c->p;
        if (KEY("ph")) ev->ph = value;
        else if (KEY("name")) ev->name = value;
        else if (KEY("cat")) ev->cat = value;
        else if (KEY("pid")) ev->pid = value;
        else if (KEY("tid")) ev->tid = value;
        else if (KEY("ts")) ev->ts = value;
        else if (KEY("dur")) ev->dur = value;
        else if (KEY("args")) ev->args = token_is(&value, "null") ? 0 : -1;
#undef KEY
    }
    return more < 0 ? -1 : token_is(&ev->ph, "\"X\"");
}

/* The str of a JSON string token (json.loads for escapes and non-ASCII); NULL with an error. */
static PyObject *decode_string(const Token *t, PyObject *loads) {
    int ascii = 1;
    for (const char *p = t->start + 1; p < t->end - 1; p++) {
        if (*p == '\\' || (unsigned char)*p >= 0x80) {
            ascii = 0;
            break;
        }
    }
    if (ascii) {
        return PyUnicode_FromStringAndSize(t->start + 1, t->end - t->start - 2);
    }
    PyObject *text = PyUnicode_DecodeUTF8(t->start, t->end - t->start, NULL);
    PyObject *value = text ? PyObject_CallOneArg(loads, text) : NULL;
    Py_XDECREF(text);
    return value;
}

/* A number token as json.loads reads it: an integer (*is_int) in *i, else a float in *d.
 * 0 when it is not a number, or an integer beyond 64 bits.  Tokens of any length are read
 * (a long float such as 0.000...1 is still a float to json.loads). */
static int parse_number(const Token *t, int *is_int, long long *i, double *d) {
    Cursor c = {t->start, t->end};
    char small[64];
    char *buf = small;
    int ok = 1;
    size_t n = (size_t)(t->end - t->start);
    if (t->start == NULL || skip_number(&c, is_int) < 0 || c.p != t->end) return 0;
    if (*is_int && n > 21) return 0; /* beyond 64 bits whatever the digits */
    if (n >= sizeof(small)) {
        buf = PyMem_Malloc(n + 1);
        if (buf == NULL) {
            PyErr_Clear();
            return 0;
        }
    }
    memcpy(buf, t->start, n);
    buf[n] = 0;
    if (*is_int) {
        errno = 0;
        *i = strtoll(buf, NULL, 10);
        ok = errno != ERANGE;
    } else {
        *d = PyOS_string_to_double(buf, NULL, NULL);
        if (*d == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            ok = 0;
        }
    }
    if (buf != small) PyMem_Free(buf);
    return ok;
}

/* Microseconds to ns as round(value * 1000) on json's int or float; 1 ok, 0 not plain. */
static int parse_us(const Token *t, int64_t *out) {
    int is_int;
    long long i;
    double d;
    if (!parse_number(t, &is_int, &i, &d)) return 0;
    return is_int ? ss_us_int_to_ns(i, out) : ss_us_double_to_ns(d, out);
}

/* A numeric pid/tid: an integer in range or an integral float; 1 ok, 0 not plain. */
static int parse_number_label(const Token *t, int64_t *out) {
    int is_int;
    long long i;
    double d;
    if (!parse_number(t, &is_int, &i, &d)) return 0;
    return is_int ? ss_label_from_int(i, out) : ss_label_from_double(d, out);
}

/* A string-or-null member as a str (NULL for null or absent); 1 ok, 0 another type, -1 error. */
static int optional_string(const Token *t, PyObject *loads, PyObject **out) {
    *out = NULL;
    if (t->start == NULL || token_is(t, "null")) return 1;
    if (*t->start != '"') return 0;
    *out = decode_string(t, loads);
    return *out == NULL ? -1 : 1;
}

/* A pid/tid member: its number, or the str to intern in *label; 1 ok, 0 not plain, -1 error. */
static int read_label(const Token *t, PyObject *loads, int64_t *out, PyObject **label) {
    *label = NULL;
    *out = 0;
    if (t->start == NULL) return 1;
    if (*t->start == '"') {
        *label = decode_string(t, loads);
        return *label == NULL ? -1 : 1;
    }
    return parse_number_label(t, out);
}

/* Appends an X event the per-event reader would accept; 1 done, 0 left to that reader (it skips
 * or rejects the event), -1 error. */
static int add_span(const Event *ev, const SsBuffer *args, PyObject *ids, PyObject *strings,
                    PyObject *args_store, PyObject *raw_type, PyObject *skip_cat, PyObject *loads,
                    SsBuffer cols[7]) {
    PyObject *name = NULL, *cat = NULL, *pid_label = NULL, *tid_label = NULL;
    int64_t pid, tid, start, dur = 0;
    int r = optional_string(&ev->name, loads, &name);
    if (r == 1) r = optional_string(&ev->cat, loads, &cat);
    if (r == 1 && cat != NULL) {
        int same = PyUnicode_Compare(cat, skip_cat);
        r = same == -1 && PyErr_Occurred() ? -1 : same != 0;
    }
    if (r == 1) r = read_label(&ev->pid, loads, &pid, &pid_label);
    if (r == 1) r = read_label(&ev->tid, loads, &tid, &tid_label);
    if (r == 1) r = parse_us(&ev->ts, &start);
    if (r == 1 && ev->dur.start != NULL) r = parse_us(&ev->dur, &dur);
    if (r == 1 && ev->args < 0) r = 0;
    int32_t ref = -1;
    if (r == 1 && ev->args == 1) {
        PyObject *raw = PyBytes_FromStringAndSize(args->data, (Py_ssize_t)args->len);
        PyObject *count = raw ? PyLong_FromSsize_t(ev->members) : NULL;
        PyObject *wrapped = count ? PyObject_CallFunctionObjArgs(raw_type, raw, count, NULL) : NULL;
        Py_XDECREF(raw);
        Py_XDECREF(count);
        ref = (int32_t)PyList_GET_SIZE(args_store);
        if (wrapped == NULL || PyList_Append(args_store, wrapped) < 0) r = -1;
        Py_XDECREF(wrapped);
    }
    /* interned only once the event is known good, so a rejected one leaves no trace */
    if (r == 1 && ss_span_append(cols, ids, strings, name, cat, pid, pid_label, tid, tid_label,
                                 start, dur, ref) < 0)
        r = -1;
    Py_XDECREF(name);
    Py_XDECREF(cat);
    Py_XDECREF(pid_label);
    Py_XDECREF(tid_label);
    return r;
}

static PyObject *scan_trace(PyObject *self, PyObject *call_args) {
    Py_buffer view;
    PyObject *ids, *strings, *args_store, *skip_cat, *raw_type, *loads;
    int drop;
    if (!PyArg_ParseTuple(call_args, "y*O!O!O!UOOp:scan_trace", &view, &PyDict_Type, &ids,
                          &PyList_Type, &strings, &PyList_Type, &args_store, &skip_cat, &raw_type,
                          &loads, &drop)) {
        return NULL;
    }
    Cursor c = {view.buf, (const char *)view.buf + view.len};
    SsBuffer args = {NULL, 0, 0};
    SsBuffer cols[7];
    memset(cols, 0, sizeof(cols));
    PyObject *rest = PyList_New(0), *result = NULL;
    const char *list_start = NULL, *list_end = NULL;
    int plain;
    if (rest == NULL) goto done;
    /* args text is copied as it is, so the whole document must be valid UTF-8 first */
    for (const char *q = c.p; q < c.end; q++) {
        if ((unsigned char)*q >= 0x80) {
            PyObject *text = PyUnicode_DecodeUTF8(q, c.end - q, NULL);
            if (text == NULL) {
                if (PyErr_ExceptionMatches(PyExc_MemoryError)) goto done;
                PyErr_Clear();
                goto not_scannable;
            }
            Py_DECREF(text);
            break;
        }
    }
    skip_ws(&c);
    int more;
    for (more = enter(&c, '{', '}'); more == 1; more = next_item(&c, '}')) {
        const char *key;
        size_t key_len;
        if (member_key(&c, &key, &key_len, &plain) < 0) goto not_scannable;
        if (!(key_len == 11 && memcmp(key, "traceEvents", 11) == 0 && c.p < c.end && *c.p == '[')) {
            if (skip_value(&c, 0) < 0) goto not_scannable;
            continue;
        }
        if (list_start != NULL) goto not_scannable; /* a repeated key: json.loads decides */
        list_start = c.p;
        Py_ssize_t index = 0;
        int more_events;
        for (more_events = enter(&c, '[', ']'); more_events == 1;
             more_events = next_item(&c, ']'), index++) {
            skip_ws(&c);
            const char *event_start = c.p;
            Event ev;
            int kind = read_event(&c, drop, &args, &ev);
            if (kind < 0) goto not_scannable;
            if (kind == 1) {
                kind = add_span(&ev, &args, ids, strings, args_store, raw_type, skip_cat, loads, cols);
                if (kind < 0) {
                    if (PyErr_ExceptionMatches(PyExc_MemoryError)) goto done;
                    PyErr_Clear(); /* a string json.loads refused: the ordinary parse words it */
                    goto not_scannable;
                }
            }
            if (kind == 0) {
                PyObject *text = PyUnicode_DecodeUTF8(event_start, c.p - event_start, NULL);
                PyObject *event = text ? PyObject_CallOneArg(loads, text) : NULL;
                Py_XDECREF(text);
                if (event == NULL) {
                    PyErr_Clear(); /* bad text: the ordinary parse words it */
                    goto not_scannable;
                }
                PyObject *pair = Py_BuildValue("(nN)", index, event);
                if (pair == NULL || PyList_Append(rest, pair) < 0) {
                    Py_XDECREF(pair);
                    goto done;
                }
                Py_DECREF(pair);
            }
        }
        if (more_events < 0) goto not_scannable;
        list_end = c.p;
    }
    if (more != 0) goto not_scannable; /* not an object, or a bad one (an empty one has no list) */
    skip_ws(&c);
    if (c.p != c.end || list_start == NULL) goto not_scannable;
    {
        const char *base = view.buf;
        SsBuffer head = {NULL, 0, 0};
        if (ss_buffer_put(&head, base, (size_t)(list_start - base)) < 0 || ss_buffer_put(&head, "[]", 2) < 0 ||
            ss_buffer_put(&head, list_end, (size_t)(c.end - list_end)) < 0) {
            PyMem_Free(head.data);
            goto done;
        }
        PyObject *head_bytes = PyBytes_FromStringAndSize(head.data, (Py_ssize_t)head.len);
        PyMem_Free(head.data);
        PyObject *columns = head_bytes ? ss_span_columns(cols) : NULL;
        if (columns != NULL) {
            result = PyTuple_Pack(3, head_bytes, rest, columns);
        }
        Py_XDECREF(head_bytes);
        Py_XDECREF(columns);
    }
    goto done;
not_scannable:
    if (!PyErr_Occurred()) {
        result = Py_NewRef(Py_None);
    }
done:
    PyBuffer_Release(&view);
    PyMem_Free(args.data);
    for (int k = 0; k < 7; k++) {
        PyMem_Free(cols[k].data);
    }
    Py_XDECREF(rest);
    return result;
}

static PyMethodDef scan_methods[] = {
    {"scan_trace", scan_trace, METH_VARARGS,
     "scan_trace(data, string_ids, strings, args_store, skip_cat, raw_args_type, loads, drop) -> "
     "(head, rest, columns) or None."},
    {NULL, NULL, 0, NULL},
};

int ss_chrome_scanner_init(PyObject *module) {
    return PyModule_AddFunctions(module, scan_methods);
}
