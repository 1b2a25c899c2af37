/* A Chrome trace's "traceEvents" read without building a Python object per event.
 *
 * scan_trace walks the document once.  Each plain event of the phases X (complete), i/I/n
 * (instant), s/t/f (flow), M (metadata), C (counter) and B/E (begin/end, paired per track) goes
 * straight into its table's columns: names, categories and string pid/tids interned through a cache
 * keyed by their JSON text, times converted to ns, args kept as compact JSON text (whitespace
 * dropped; for X and i optionally Kineto's bookkeeping keys too) wrapped in RawArgs, parsed only
 * if read (a counter's args are parsed for its values).  Every other event (unknown phases, and
 * events the per-event reader would skip or reject) is parsed with json.loads and returned with its
 * index, for the validating per-event reader.  When the document is not a well-formed object with a
 * traceEvents list (or a list of events), it returns None and the caller parses it the ordinary way
 * (which also words the error).  The ordinary path is the twin: both give the same trace. */
#include "chrome_scan.h"

#include <limits.h>

/* One event's members; X events' args compacted as soon as the phase is known.  0 / -1 bad JSON. */
static int read_event(Cursor *c, Scan *s, Event *ev) {
    int plain, more;
    memset(ev, 0, sizeof(*ev));
    for (more = cj_enter(c, '{', '}'); more == 1; more = cj_next_item(c, '}')) {
        const char *key;
        size_t key_len;
        if (cj_member_key(c, &key, &key_len, &plain) < 0) return -1;
        if (!plain) key_len = 0; /* escaped keys match nothing */
        Token value = {c->p, NULL};
#define KEY(k) (key_len == sizeof(k) - 1 && memcmp(key, k, key_len) == 0)
        if (KEY("args") && c->p < c->end && *c->p == '{') {
            ev->args = 1;
            ev->args_start = c->p;
            ev->compacted = cj_token_is(&ev->ph, "\"X\"");
            if (ev->compacted) {
                if (cj_read_args(c, s->drop, &s->args, &ev->members) < 0) return -1;
            } else if (cj_skip_value(c, 1) < 0) {
                return -1;
            }
            ev->args_end = c->p;
            continue;
        }
        if (cj_skip_value(c, 1) < 0) return -1;
        value.end = c->p;
        if (KEY("ph")) ev->ph = value;
        else if (KEY("name")) ev->name = value;
        else if (KEY("cat")) ev->cat = value;
        else if (KEY("pid")) ev->pid = value;
        else if (KEY("tid")) ev->tid = value;
        else if (KEY("ts")) ev->ts = value;
        else if (KEY("dur")) ev->dur = value;
        else if (KEY("s")) ev->scope = value;
        else if (KEY("id")) ev->id = value;
        else if (KEY("bp")) ev->bp = value;
        else if (KEY("args")) {
            ev->args = cj_token_is(&value, "null") ? 0 : -1;
            ev->args_start = NULL;
        }
#undef KEY
    }
    return more < 0 ? -1 : 0;
}

/* Whether a string token is ASCII without escapes; its FNV-1a hash in *hash. */
static int plain_text(const Token *t, uint64_t *hash) {
    uint64_t h = 1469598103934665603ULL;
    for (const char *p = t->start + 1; p < t->end - 1; p++) {
        unsigned char ch = (unsigned char)*p;
        if (ch == '\\' || ch >= 0x80) return 0;
        h = (h ^ ch) * 1099511628211ULL;
    }
    *hash = h;
    return 1;
}

static int cache_grow(Scan *s) {
    size_t cap = s->slots ? (s->mask + 1) * 2 : 1024;
    Slot *slots = PyMem_Calloc(cap, sizeof(Slot));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t k = 0; s->slots && k <= s->mask; k++) {
        if (s->slots[k].text == NULL) continue;
        size_t j = (size_t)s->slots[k].hash & (cap - 1);
        while (slots[j].text != NULL) j = (j + 1) & (cap - 1);
        slots[j] = s->slots[k];
    }
    PyMem_Free(s->slots);
    s->slots = slots;
    s->mask = cap - 1;
    return 0;
}

/* The string id of a string token (0 when absent or null); -1 with an error. */
int64_t scan_intern_token(Scan *s, const Token *t) {
    uint64_t hash;
    if (t->start == NULL || *t->start != '"') return 0;
    if (!plain_text(t, &hash)) {
        PyObject *text = cj_decode_string(t, s->loads);
        int64_t id = text ? ss_intern(text, s->ids, s->strings) : -1;
        Py_XDECREF(text);
        return id;
    }
    Py_ssize_t len = t->end - t->start - 2;
    if (s->slots == NULL && cache_grow(s) < 0) return -1;
    size_t j = (size_t)hash & s->mask;
    for (; s->slots[j].text != NULL; j = (j + 1) & s->mask) {
        Slot *slot = &s->slots[j];
        if (slot->hash == hash && slot->len == len && memcmp(slot->text, t->start + 1, (size_t)len) == 0)
            return slot->id;
    }
    PyObject *text = PyUnicode_FromStringAndSize(t->start + 1, len);
    int64_t id = text ? ss_intern(text, s->ids, s->strings) : -1;
    Py_XDECREF(text);
    if (id < 0) return -1;
    s->slots[j] = (Slot){t->start + 1, len, hash, id};
    if (++s->used * 2 > s->mask && cache_grow(s) < 0) return -1;
    return id;
}

/* Whether a token is absent, null or a string (a name or category the reader takes). */
static int optional_string(const Token *t) {
    return t->start == NULL || *t->start == '"' || cj_token_is(t, "null");
}

/* Whether a string token's value equals `text` (a str); -1 with an error. */
static int string_equals(Scan *s, const Token *t, PyObject *text) {
    uint64_t hash;
    if (plain_text(t, &hash)) {
        if (text == s->skip_cat) {
            return s->skip_len == t->end - t->start - 2 &&
                   memcmp(s->skip_utf8, t->start + 1, (size_t)s->skip_len) == 0;
        }
        Py_ssize_t len;
        const char *utf8 = PyUnicode_AsUTF8AndSize(text, &len);
        if (utf8 == NULL) return -1;
        return len == t->end - t->start - 2 && memcmp(utf8, t->start + 1, (size_t)len) == 0;
    }
    PyObject *value = cj_decode_string(t, s->loads);
    if (value == NULL) return -1;
    int same = PyUnicode_Compare(value, text);
    Py_DECREF(value);
    return same == -1 && PyErr_Occurred() ? -1 : same == 0;
}

/* A one-character string value (json's reading of the token), else 0; -1 with an error. */
int scan_single_char(Scan *s, const Token *t) {
    if (t->start == NULL || *t->start != '"') return 0;
    if (t->end - t->start == 3 && t->start[1] != '\\') return (unsigned char)t->start[1];
    PyObject *value = cj_decode_string(t, s->loads);
    if (value == NULL) return -1;
    int ch = PyUnicode_GET_LENGTH(value) == 1 && PyUnicode_READ_CHAR(value, 0) < 0x80
                 ? (int)PyUnicode_READ_CHAR(value, 0)
                 : 0;
    Py_DECREF(value);
    return ch;
}

/* Microseconds to ns as round(value * 1000) on json's int or float; 1 ok, 0 not plain. */
int scan_parse_us(const Token *t, int64_t *out) {
    int is_int;
    long long i;
    double d;
    if (!cj_parse_number(t, &is_int, &i, &d)) return 0;
    return is_int ? ss_us_int_to_ns(i, out) : ss_us_double_to_ns(d, out);
}

/* A pid/tid: 0 when absent, a number in range, or a string (to intern later: *is_label).
 * 1 ok, 0 not plain. */
int scan_check_label(const Token *t, int64_t *out, int *is_label) {
    int is_int;
    long long i;
    double d;
    *out = 0;
    *is_label = 0;
    if (t->start == NULL) return 1;
    if (*t->start == '"') {
        *is_label = 1;
        return 1;
    }
    if (!cj_parse_number(t, &is_int, &i, &d)) return 0;
    return is_int ? ss_label_from_int(i, out) : ss_label_from_double(d, out);
}

int64_t scan_label_value(Scan *s, const Token *t, int64_t number, int is_label) {
    if (!is_label) return number;
    int64_t id = scan_intern_token(s, t);
    return id < 0 ? -1 : LABEL_BASE + id;
}

/* A flow id as the per-event reader reads it (an int64, an integral float, a string through
 * flow_id); 1 ok, 0 not plain, -1 error. */
static int read_flow_id(Scan *s, const Token *t, int64_t *out) {
    *out = 0;
    if (t->start == NULL) return 1;
    if (*t->start == '"') {
        PyObject *text = cj_decode_string(t, s->loads);
        PyObject *number = text ? PyObject_CallOneArg(s->flow_id, text) : NULL;
        Py_XDECREF(text);
        if (number == NULL) return -1;
        *out = PyLong_AsLongLong(number);
        Py_DECREF(number);
        return *out == -1 && PyErr_Occurred() ? -1 : 1;
    }
    return scan_int64(t, out);
}

int scan_int64(const Token *t, int64_t *out) {
    int is_int;
    long long i;
    double d;
    if (!cj_parse_number(t, &is_int, &i, &d)) return 0;
    if (is_int) {
        *out = i;
        return i != LLONG_MIN;
    }
    if (!(d == floor(d) && d > -9223372036854775808.0 && d < 9223372036854775808.0)) return 0;
    *out = (int64_t)d;
    return 1;
}

/* The slots of RawArgs (raw, _size, _parsed) as data descriptors, so that its objects are made
 * without a call to its __init__ per event; 0, or -1 when it has none (then it is called). */
static int raw_args_slots(Scan *s) {
    static const char *names[3] = {"raw", "_size", "_parsed"};
    if (!PyType_Check(s->raw_type)) return -1;
    for (int k = 0; k < 3; k++) {
        PyObject *descr = PyObject_GetAttrString(s->raw_type, names[k]);
        if (descr == NULL || Py_TYPE(descr) != &PyMemberDescr_Type) {
            PyErr_Clear();
            Py_XDECREF(descr);
            for (int j = 0; j < k; j++) Py_CLEAR(s->slots_descr[j]);
            return -1;
        }
        s->slots_descr[k] = descr;
    }
    return 0;
}

/* A RawArgs over the args buffer with `members` members (new reference; NULL with an error). */
static PyObject *raw_args(Scan *s, Py_ssize_t members) {
    PyObject *raw = PyBytes_FromStringAndSize(s->args.data, (Py_ssize_t)s->args.len);
    PyObject *count = raw ? PyLong_FromSsize_t(members) : NULL;
    PyObject *made = NULL;
    if (count != NULL && s->slots_descr[2] == NULL) {
        made = PyObject_CallFunctionObjArgs(s->raw_type, raw, count, NULL);
    } else if (count != NULL) {
        PyTypeObject *type = (PyTypeObject *)s->raw_type;
        PyObject *values[3] = {raw, count, Py_None};
        made = type->tp_alloc(type, 0);
        for (int k = 0; made != NULL && k < 3; k++) {
            if (Py_TYPE(s->slots_descr[k])->tp_descr_set(s->slots_descr[k], made, values[k]) < 0)
                Py_CLEAR(made);
        }
    }
    Py_XDECREF(raw);
    Py_XDECREF(count);
    return made;
}

/* The event's args in the args store (compacted now unless read_event did, with Kineto's
 * bookkeeping dropped for X and i events when asked); *ref = its index, -1 for none; `empty`
 * stores a dict for absent or empty args.  0 / -1. */
static int store_args(Scan *s, Event *ev, int phase, int32_t *ref) {
    int empty = phase == 'M', drop = (phase == 'X' || phase == 'i') && s->drop;
    *ref = -1;
    if (ev->args == 1 && (!ev->compacted || (s->drop && !drop))) {
        Cursor c = {ev->args_start, ev->args_end};
        if (cj_read_args(&c, drop, &s->args, &ev->members) < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "args text changed while read");
            return -1;
        }
    }
    PyObject *stored;
    if (ev->args == 1 && (ev->members > 0 || !empty)) {
        stored = raw_args(s, ev->members);
    } else if (empty) {
        stored = PyDict_New();
    } else {
        return 0;
    }
    *ref = (int32_t)PyList_GET_SIZE(s->args_store);
    int r = stored == NULL || PyList_Append(s->args_store, stored) < 0 ? -1 : 0;
    Py_XDECREF(stored);
    return r;
}

#define PUT(col, value)                                                                            \
    do {                                                                                           \
        __typeof__(value) v_ = (value);                                                            \
        if (ss_buffer_put(&(col), &v_, sizeof(v_)) < 0) return -1;                                 \
    } while (0)

/* A counter event: one row per numeric member of its args (json.loads reads the args text, as the
 * per-event reader's values); 1 done, 0 left to the per-event reader (no numeric value, or a bad
 * field), -1 error. */
static int add_counter(Scan *s, Event *ev, int64_t pid, int pid_label, int64_t tid, int tid_label,
                       int64_t ts) {
    if (ev->args != 1) return 0; /* no values (a skip), or args of another type (an error) */
    PyObject *text = PyUnicode_DecodeUTF8(ev->args_start, ev->args_end - ev->args_start, NULL);
    PyObject *values = text ? PyObject_CallOneArg(s->loads, text) : NULL;
    Py_XDECREF(text);
    if (values == NULL) return -1;
    PyObject *key, *value;
    Py_ssize_t pos = 0, rows = 0;
    int64_t name = 0;
    int r = PyDict_CheckExact(values) ? 1 : -1;
    while (r == 1 && PyDict_Next(values, &pos, &key, &value)) {
        double number;
        if (PyFloat_CheckExact(value)) {
            number = PyFloat_AS_DOUBLE(value);
        } else if (PyLong_CheckExact(value)) {
            number = PyLong_AsDouble(value);
            if (number == -1.0 && PyErr_Occurred()) {
                if (!PyErr_ExceptionMatches(PyExc_OverflowError)) r = -1;
                PyErr_Clear(); /* float() of it fails: not a value */
                continue;
            }
        } else {
            continue;
        }
        if (rows == 0) { /* the event's fields, interned once it has a value */
            name = scan_intern_token(s, &ev->name);
            if (name < 0 || (pid = scan_label_value(s, &ev->pid, pid, pid_label)) == -1 ||
                (tid = scan_label_value(s, &ev->tid, tid, tid_label)) == -1) {
                if (PyErr_Occurred()) r = -1;
                break;
            }
        }
        int64_t series = ss_intern(key, s->ids, s->strings);
        uint32_t name32 = (uint32_t)name, series32 = (uint32_t)series;
        uint8_t first = rows++ == 0;
        SsBuffer *c = s->counters;
        if (series < 0 || ss_buffer_put(&c[0], &name32, 4) < 0 || ss_buffer_put(&c[1], &pid, 8) < 0 ||
            ss_buffer_put(&c[2], &tid, 8) < 0 || ss_buffer_put(&c[3], &ts, 8) < 0 ||
            ss_buffer_put(&c[4], &series32, 4) < 0 || ss_buffer_put(&c[5], &number, 8) < 0 ||
            ss_buffer_put(&c[6], &first, 1) < 0)
            r = -1;
    }
    Py_DECREF(values);
    return r < 0 ? -1 : rows > 0;
}

/* The open B events of a track, added when new; NULL with an error. */
static Track *track(Scan *s, int64_t pid, int64_t tid) {
    for (Py_ssize_t k = s->ntracks - 1; k >= 0; k--) {
        if (s->tracks[k].pid == pid && s->tracks[k].tid == tid) return &s->tracks[k];
    }
    if (s->ntracks == s->tracks_cap) {
        Py_ssize_t cap = s->tracks_cap ? s->tracks_cap * 2 : 16;
        Track *grown = PyMem_Realloc(s->tracks, (size_t)cap * sizeof(Track));
        if (grown == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        s->tracks = grown;
        s->tracks_cap = cap;
    }
    Track *t = &s->tracks[s->ntracks++];
    *t = (Track){pid, tid, NULL, 0, 0};
    return t;
}

/* A B event: pushed on its track until its E.  1 / -1. */
static int begin(Scan *s, const Event *ev, int64_t pid, int64_t tid, int64_t ts) {
    Track *t = track(s, pid, tid);
    if (t == NULL) return -1;
    if (t->len == t->cap) {
        Py_ssize_t cap = t->cap ? t->cap * 2 : 8;
        Begin *grown = PyMem_Realloc(t->open, (size_t)cap * sizeof(Begin));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        t->open = grown;
        t->cap = cap;
    }
    t->open[t->len++] = (Begin){ev->name, ev->cat, ev->args_start, ev->args_end, ev->args, ts};
    return 1;
}

/* An E event: closes the last open B of its track into a span (args read then, as the per-event
 * reader does: a B whose args are not an object makes the document one for that reader, which
 * words the error), or counts as unmatched.  1, -1 error, -2 not scannable. */
static int end(Scan *s, int64_t pid, int64_t tid, int64_t ts) {
    Track *t = track(s, pid, tid);
    if (t == NULL) return -1;
    if (t->len == 0) {
        s->unmatched_ends++;
        return 1;
    }
    Begin b = t->open[--t->len];
    int64_t dur;
    if (b.args < 0 || __builtin_sub_overflow(ts, b.ts, &dur)) return -2;
    Event args = {.args_start = b.args_start, .args_end = b.args_end, .args = b.args};
    int32_t ref;
    if (store_args(s, &args, 'B', &ref) < 0) return -1;
    int64_t name = scan_intern_token(s, &b.name), cat = scan_intern_token(s, &b.cat);
    if (name < 0 || cat < 0) return -1;
    uint32_t name32 = (uint32_t)name, cat32 = (uint32_t)cat;
    SsBuffer *c = s->closed;
    PUT(c[0], name32); PUT(c[1], cat32); PUT(c[2], pid); PUT(c[3], tid);
    PUT(c[4], b.ts); PUT(c[5], dur); PUT(c[6], ref);
    return 1;
}

/* Appends a plain event to its table: 1 done, 0 left to the per-event reader (another phase, or an
 * event it skips or rejects), -1 error.  Nothing is interned until the event is known good. */
static int add_event(Scan *s, Event *ev) {
    int phase = scan_single_char(s, &ev->ph);
    if (phase <= 0) return phase;
    if (!strchr("XiInstfMCBE", phase)) return 0;
    /* what the per-event reader checks: no category of M, C or E events, no name of E events */
    if ((phase != 'E' && !optional_string(&ev->name)) ||
        (!strchr("MCE", phase) && !optional_string(&ev->cat)))
        return 0;
    if (ev->cat.start != NULL && *ev->cat.start == '"') {
        int same = string_equals(s, &ev->cat, s->skip_cat);
        if (same != 0) return same < 0 ? -1 : 0; /* sampled spans: the per-event reader skips them */
    }
    int64_t pid, tid, ts = 0, dur = 0, flow = 0;
    int pid_label, tid_label, r;
    if (!scan_check_label(&ev->pid, &pid, &pid_label) || !scan_check_label(&ev->tid, &tid, &tid_label)) return 0;
    if (phase != 'M' && !scan_parse_us(&ev->ts, &ts)) return 0;
    if (phase == 'C') return add_counter(s, ev, pid, pid_label, tid, tid_label, ts);
    if (phase == 'B' || phase == 'E') {
        if ((pid = scan_label_value(s, &ev->pid, pid, pid_label)) == -1 && PyErr_Occurred()) return -1;
        if ((tid = scan_label_value(s, &ev->tid, tid, tid_label)) == -1 && PyErr_Occurred()) return -1;
        return phase == 'B' ? begin(s, ev, pid, tid, ts) : end(s, pid, tid, ts);
    }
    if (phase == 'X' && ev->dur.start != NULL && !scan_parse_us(&ev->dur, &dur)) return 0;
    if (ev->args < 0 && phase != 's' && phase != 't' && phase != 'f') return 0;
    if (strchr("stf", phase) && (r = read_flow_id(s, &ev->id, &flow)) != 1) return r;
    int scope = 't', binding = 0;
    if (phase == 'i' || phase == 'I' || phase == 'n') {
        if ((scope = scan_single_char(s, &ev->scope)) < 0) return -1;
        if (scope != 't' && scope != 'p' && scope != 'g') scope = 't';
    }
    if (strchr("stf", phase) && (binding = scan_single_char(s, &ev->bp)) < 0) return -1;
    int32_t ref = -1;
    if (!strchr("stf", phase) && store_args(s, ev, phase, &ref) < 0) return -1;
    int64_t name = scan_intern_token(s, &ev->name);
    int64_t cat = phase == 'M' ? 0 : scan_intern_token(s, &ev->cat);
    if (name < 0 || cat < 0) return -1;
    if ((pid = scan_label_value(s, &ev->pid, pid, pid_label)) == -1 && PyErr_Occurred()) return -1;
    if ((tid = scan_label_value(s, &ev->tid, tid, tid_label)) == -1 && PyErr_Occurred()) return -1;
    uint32_t name32 = (uint32_t)name, cat32 = (uint32_t)cat;
    if (phase == 'X') {
        SsBuffer *c = s->spans;
        PUT(c[0], name32); PUT(c[1], cat32); PUT(c[2], pid); PUT(c[3], tid);
        PUT(c[4], ts); PUT(c[5], dur); PUT(c[6], ref);
    } else if (phase == 'M') {
        SsBuffer *c = s->meta;
        PUT(c[0], name32); PUT(c[1], pid); PUT(c[2], tid); PUT(c[3], ref);
    } else if (strchr("stf", phase)) {
        SsBuffer *c = s->flows;
        PUT(c[0], name32); PUT(c[1], cat32); PUT(c[2], pid); PUT(c[3], tid);
        PUT(c[4], ts); PUT(c[5], flow); PUT(c[6], (uint8_t)phase);
        PUT(c[7], (uint8_t)(binding == 'e' ? 'e' : 0));
    } else {
        SsBuffer *c = s->instants;
        PUT(c[0], name32); PUT(c[1], cat32); PUT(c[2], pid); PUT(c[3], tid);
        PUT(c[4], ts); PUT(c[5], (uint8_t)scope); PUT(c[6], ref);
    }
    return 1;
}
#undef PUT

/* The columns of one table as a tuple of bytes; NULL with an error. */
static PyObject *table_bytes(const SsBuffer *cols, int n) {
    PyObject *columns = PyTuple_New(n);
    for (int k = 0; columns != NULL && k < n; k++) {
        PyObject *data = PyBytes_FromStringAndSize(cols[k].data ? cols[k].data : "", (Py_ssize_t)cols[k].len);
        if (data == NULL) {
            Py_CLEAR(columns);
            break;
        }
        PyTuple_SET_ITEM(columns, k, data);
    }
    return columns;
}

/* Whether the bytes are valid UTF-8 (ASCII checked eight bytes at a time); -1 with an error. */
static int valid_utf8(const char *p, const char *end) {
    while (end - p >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        if (word & 0x8080808080808080ULL) break;
        p += 8;
    }
    for (; p < end; p++) {
        if ((unsigned char)*p >= 0x80) {
            PyObject *text = PyUnicode_DecodeUTF8(p, end - p, NULL);
            if (text == NULL) {
                if (PyErr_ExceptionMatches(PyExc_MemoryError)) return -1;
                PyErr_Clear();
                return 0;
            }
            Py_DECREF(text);
            return 1;
        }
    }
    return 1;
}

/* The events list at c->p: plain events into the tables, the others json.loads'ed into `rest` as
 * (index, event).  0 done, 1 not scannable (the ordinary parse decides), -1 error. */
static int scan_events(Cursor *c, Scan *s, PyObject *rest) {
    Py_ssize_t index = 0;
    int more;
    for (more = cj_enter(c, '[', ']'); more == 1; more = cj_next_item(c, ']'), index++) {
        cj_skip_ws(c);
        const char *event_start = c->p;
        int kind = 0;
        if (c->p < c->end && *c->p == '{') {
            Event ev;
            if (read_event(c, s, &ev) < 0) return 1;
            kind = add_event(s, &ev);
            if (kind < 0) {
                if (PyErr_ExceptionMatches(PyExc_MemoryError)) return -1;
                PyErr_Clear(); /* a string json.loads refused: the ordinary parse words it */
                return 1;
            }
        } else if (cj_skip_value(c, 0) < 0) {
            return 1;
        }
        if (kind == 0) {
            PyObject *text = PyUnicode_DecodeUTF8(event_start, c->p - event_start, NULL);
            PyObject *event = text ? PyObject_CallOneArg(s->loads, text) : NULL;
            Py_XDECREF(text);
            if (event == NULL) {
                if (PyErr_ExceptionMatches(PyExc_MemoryError)) return -1;
                PyErr_Clear(); /* bad text: the ordinary parse words it */
                return 1;
            }
            PyObject *pair = Py_BuildValue("(nN)", index, event);
            int failed = pair == NULL || PyList_Append(rest, pair) < 0;
            Py_XDECREF(pair);
            if (failed) return -1;
        }
    }
    return more < 0;
}

/* The document: a list of events, or an object with one traceEvents list and at most one samples
 * list (list_start[k], list_end[k] bracket them).  0 done, 1 not scannable, -1 error. */
static int scan_document(Cursor *c, Scan *s, PyObject *rest, const char *list_start[2],
                         const char *list_end[2]) {
    int plain, r, more;
    cj_skip_ws(c);
    if (c->p < c->end && *c->p == '[') {
        *list_start = c->p;
        if ((r = scan_events(c, s, rest)) != 0) return r;
        *list_end = c->p;
        cj_skip_ws(c);
        return c->p != c->end;
    }
    for (more = cj_enter(c, '{', '}'); more == 1; more = cj_next_item(c, '}')) {
        const char *key;
        size_t key_len;
        if (cj_member_key(c, &key, &key_len, &plain) < 0) return 1;
        int events = key_len == 11 && memcmp(key, "traceEvents", 11) == 0;
        int samples = key_len == 7 && memcmp(key, "samples", 7) == 0;
        if (!(events || samples) || c->p >= c->end || *c->p != '[') {
            if (cj_skip_value(c, 0) < 0) return 1;
            continue;
        }
        const char **range = events ? list_start : list_start + 1;
        if (range[0] != NULL) return 1; /* a repeated key: json.loads decides */
        range[0] = c->p;
        if ((r = events ? scan_events(c, s, rest) : scan_samples(c, s)) != 0) return r;
        (events ? list_end : list_end + 1)[0] = c->p;
    }
    if (more != 0) return 1; /* not an object, or a bad one (an empty one has no list) */
    cj_skip_ws(c);
    return c->p != c->end || *list_start == NULL;
}

static void scan_free(Scan *s) {
    for (int k = 0; k < 3; k++) Py_XDECREF(s->slots_descr[k]);
    PyMem_Free(s->slots);
    PyMem_Free(s->args.data);
    SsBuffer *tables[6] = {s->spans, s->instants, s->flows, s->meta, s->counters, s->closed};
    int widths[6] = {7, 7, 8, 4, 7, 7};
    for (int t = 0; t < 6; t++) {
        for (int k = 0; k < widths[t]; k++) PyMem_Free(tables[t][k].data);
    }
    for (Py_ssize_t k = 0; k < s->ntracks; k++) PyMem_Free(s->tracks[k].open);
    PyMem_Free(s->tracks);
    for (int k = 0; k < 6; k++) PyMem_Free(s->samples[k].data);
    Py_XDECREF(s->sf_keys);
    Py_XDECREF(s->sf_index);
}

/* How many B events are still open at the end of the document. */
static Py_ssize_t unmatched_begins(const Scan *s) {
    Py_ssize_t open = 0;
    for (Py_ssize_t k = 0; k < s->ntracks; k++) open += s->tracks[k].len;
    return open;
}

static PyObject *scan_trace(PyObject *self, PyObject *call_args) {
    Py_buffer view;
    Scan s;
    memset(&s, 0, sizeof(s));
    if (!PyArg_ParseTuple(call_args, "y*O!O!O!UOOOp:scan_trace", &view, &PyDict_Type, &s.ids,
                          &PyList_Type, &s.strings, &PyList_Type, &s.args_store, &s.skip_cat,
                          &s.raw_type, &s.loads, &s.flow_id, &s.drop)) {
        return NULL;
    }
    s.skip_utf8 = PyUnicode_AsUTF8AndSize(s.skip_cat, &s.skip_len);
    if (s.skip_utf8 == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    raw_args_slots(&s); /* without them, RawArgs is called */
    Cursor c = {view.buf, (const char *)view.buf + view.len};
    const char *list_start[2] = {NULL, NULL}, *list_end[2] = {NULL, NULL};
    PyObject *rest = PyList_New(0), *result = NULL;
    int r = rest == NULL ? -1 : valid_utf8(c.p, c.end);
    /* args text is copied as it is, so the whole document must be valid UTF-8 first */
    if (r == 1) r = scan_document(&c, &s, rest, list_start, list_end);
    else if (r == 0) r = 1;
    if (r == 1) {
        result = Py_NewRef(Py_None);
    } else if (r == 0) {
        /* the head: the document with its lists emptied, in document order */
        int first = list_start[1] != NULL && list_start[1] < list_start[0];
        const char *from = view.buf;
        SsBuffer head = {NULL, 0, 0};
        r = 0;
        for (int k = 0; k < 2 && r == 0; k++) {
            int j = k ^ first;
            if (list_start[j] == NULL) continue;
            if (ss_buffer_put(&head, from, (size_t)(list_start[j] - from)) < 0 ||
                ss_buffer_put(&head, "[]", 2) < 0)
                r = -1;
            from = list_end[j];
        }
        if (r == 0 && ss_buffer_put(&head, from, (size_t)(c.end - from)) == 0) {
            PyObject *tables = Py_BuildValue(
                "(NNNNNN)", table_bytes(s.spans, 7), table_bytes(s.instants, 7), table_bytes(s.flows, 8),
                table_bytes(s.meta, 4), table_bytes(s.counters, 7), table_bytes(s.closed, 7));
            PyObject *samples = s.sf_keys == NULL
                                    ? Py_NewRef(Py_None)
                                    : Py_BuildValue("(NO)", table_bytes(s.samples, 6), s.sf_keys);
            if (tables != NULL && samples != NULL) {
                result = Py_BuildValue("(y#OO(nn)O)", head.data, (Py_ssize_t)head.len, rest, tables,
                                       s.unmatched_ends, unmatched_begins(&s), samples);
            }
            Py_XDECREF(tables);
            Py_XDECREF(samples);
        }
        PyMem_Free(head.data);
    }
    PyBuffer_Release(&view);
    scan_free(&s);
    Py_XDECREF(rest);
    return result;
}

static PyMethodDef scan_methods[] = {
    {"scan_trace", scan_trace, METH_VARARGS,
     "scan_trace(data, string_ids, strings, args_store, skip_cat, raw_args_type, loads, flow_id, drop)"
     " -> (head, rest, (spans, instants, flows, meta, counters, closed spans), (unmatched E, unmatched B),"
     " (sample columns, stack-frame keys) or None) or None."},
    {NULL, NULL, 0, NULL},
};

int ss_chrome_scanner_init(PyObject *module) {
    return PyModule_AddFunctions(module, scan_methods);
}
