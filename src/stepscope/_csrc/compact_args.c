/* The compact form's ARGS section, version 2, written (twin and layout: trace/compact_args.py;
 * read back by compact_splice.c).
 *
 * split_args takes a trace's args mappings (a RawJsonObject's own text, read from its slots; any
 * other mapping through the Python fallback, json_bytes), cuts each text's top-level plain
 * integers out (the grammar of chrome_json.c for keys, strings, literals and numbers; nested
 * values are skipped by their brackets, strings inside them strict), interns the rest as a
 * template and the keys by their text, and writes the values one zigzag-delta varint column per
 * key.  A text that does not scan as one JSON object is a template without holes. */
#include "chrome_json.h"

#include <structmember.h>

#define MAX_NESTING 64 /* open brackets inside one top-level value (MAX_NESTING of the twin) */

static PyObject *s_raw, *s_parsed, *s_size; /* interned attribute names */

/* Where a type keeps a __slots__ member (read straight from each object: a window's args are
 * thousands), or -1 to ask for the attribute. */
typedef struct {
    Py_ssize_t raw, parsed, size;
} RawSlots;

static Py_ssize_t slot_offset(PyObject *type, PyObject *name) {
    PyObject *descr = PyObject_GetAttr(type, name);
    Py_ssize_t offset = -1;
    if (descr == NULL) {
        PyErr_Clear();
    } else if (Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type == T_OBJECT_EX) offset = member->offset;
    }
    Py_XDECREF(descr);
    return offset;
}

/* The member (a new reference), from its slot when it is set there, else as the attribute. */
static PyObject *member(PyObject *obj, Py_ssize_t offset, PyObject *name) {
    PyObject *value = offset >= 0 ? *(PyObject **)((char *)obj + offset) : NULL;
    return value != NULL ? Py_NewRef(value) : PyObject_GetAttr(obj, name);
}

/* A RawJsonObject's key count as its __len__ gives it: _size until parsed, then the dict's. */
static Py_ssize_t raw_size(PyObject *obj, const RawSlots *slots) {
    PyObject *parsed = member(obj, slots->parsed, s_parsed);
    if (parsed == NULL) return -1;
    Py_ssize_t n;
    if (parsed == Py_None) {
        PyObject *size = member(obj, slots->size, s_size);
        n = size == NULL ? -1 : PyLong_AsSsize_t(size);
        Py_XDECREF(size);
    } else {
        n = PyObject_Size(parsed);
    }
    Py_DECREF(parsed);
    return n;
}

/* A mapping's compact JSON text (new reference) and key count: a RawJsonObject's own text, any
 * other mapping through the Python `fallback`; NULL with an error. */
static PyObject *args_text(PyObject *obj, PyObject *raw_type, PyObject *fallback,
                           const RawSlots *slots, Py_ssize_t *size) {
    PyObject *text;
    if ((PyObject *)Py_TYPE(obj) == raw_type) {
        text = member(obj, slots->raw, s_raw);
        *size = text == NULL ? -1 : raw_size(obj, slots);
    } else {
        text = PyObject_CallOneArg(fallback, obj);
        *size = text == NULL ? -1 : PyObject_Size(obj);
    }
    if (text != NULL && *size >= 0 && !PyBytes_Check(text))
        PyErr_SetString(PyExc_TypeError, "split_args: an args text is not bytes");
    else if (text != NULL && *size >= 0)
        return text;
    Py_XDECREF(text);
    return NULL;
}

/* Records (byte strings) by first appearance, found again by content: keys and templates. */
typedef struct {
    SsBuffer data;   /* the records one after another */
    size_t *ends;    /* record i ends at ends[i] */
    uint64_t *hashes;
    Py_ssize_t count, cap;
    Py_ssize_t *slots; /* record index + 1, 0 = free; open addressing */
    size_t mask;
} Interned;

/* Two independent lanes, so a template's hundred-odd bytes take few dependent multiplies. */
static uint64_t hash_bytes(const char *p, size_t n) {
    uint64_t a = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n, b = 0x2545F4914F6CDD1DULL, w, v;
    for (; n >= 16; p += 16, n -= 16) {
        memcpy(&w, p, 8);
        memcpy(&v, p + 8, 8);
        a = (a ^ w) * 0xff51afd7ed558ccdULL;
        b = (b ^ v) * 0xc4ceb9fe1a85ec53ULL;
        a ^= a >> 31;
        b ^= b >> 29;
    }
    w = v = 0;
    memcpy(&w, p, n < 8 ? n : 8);
    if (n > 8) memcpy(&v, p + 8, n - 8);
    a = (a ^ w ^ (b << 1)) * 0xff51afd7ed558ccdULL;
    a ^= (b ^ v) * 0xc4ceb9fe1a85ec53ULL;
    return a ^ (a >> 32);
}

static int interned_grow(Interned *t) {
    size_t size = t->mask ? (t->mask + 1) * 2 : 64;
    Py_ssize_t *slots = PyMem_Calloc(size, sizeof *slots);
    if (slots == NULL) return -1;
    for (Py_ssize_t i = 0; i < t->count; i++) {
        size_t at = t->hashes[i] & (size - 1);
        while (slots[at]) at = (at + 1) & (size - 1);
        slots[at] = i + 1;
    }
    PyMem_Free(t->slots);
    t->slots = slots;
    t->mask = size - 1;
    return 0;
}

/* The index of the record `rec` (added when new), or -1 with MemoryError set. */
static Py_ssize_t interned_index(Interned *t, const char *rec, size_t len) {
    if ((size_t)t->count * 2 >= t->mask && interned_grow(t) < 0) goto nomem;
    uint64_t h = hash_bytes(rec, len);
    size_t at = h & t->mask;
    for (Py_ssize_t slot; (slot = t->slots[at]) != 0; at = (at + 1) & t->mask) {
        Py_ssize_t i = slot - 1;
        size_t start = i ? t->ends[i - 1] : 0;
        if (t->hashes[i] == h && t->ends[i] - start == len && memcmp(t->data.data + start, rec, len) == 0)
            return i;
    }
    if (t->count == t->cap) {
        Py_ssize_t cap = t->cap ? t->cap * 2 : 64;
        size_t *ends = PyMem_Realloc(t->ends, cap * sizeof *ends);
        if (ends == NULL) goto nomem;
        t->ends = ends;
        uint64_t *hashes = PyMem_Realloc(t->hashes, cap * sizeof *hashes);
        if (hashes == NULL) goto nomem;
        t->hashes = hashes;
        t->cap = cap;
    }
    if (ss_buffer_put(&t->data, rec, len) < 0) return -1;
    t->ends[t->count] = t->data.len;
    t->hashes[t->count] = h;
    t->slots[at] = t->count + 1;
    return t->count++;
nomem:
    PyErr_NoMemory();
    return -1;
}

static void interned_free(Interned *t) {
    PyMem_Free(t->data.data);
    PyMem_Free(t->ends);
    PyMem_Free(t->hashes);
    PyMem_Free(t->slots);
}

static inline int put_varint(SsBuffer *b, uint64_t u) {
    if (ss_buffer_reserve(b, 10) < 0) return -1;
    uint8_t *p = (uint8_t *)b->data + b->len, *start = p;
    for (; u >= 0x80; u >>= 7) *p++ = (uint8_t)(u | 0x80);
    *p++ = (uint8_t)u;
    b->len += (size_t)(p - start);
    return 0;
}

typedef struct {
    const char *start, *end, *key; /* the value's text; the key's text between its quotes */
    size_t key_len;
    int64_t value;
} Hole;

typedef struct {
    Hole *at;
    Py_ssize_t count, cap;
} Holes;

/* The end of the string at p (its opening quote), or NULL when it is not a strict JSON string:
 * plain ones here, those with escapes or control bytes by cj_skip_string. */
static inline const char *string_end(const char *p, const char *end) {
    for (const char *q = p + 1; q < end; q++) {
        unsigned char ch = (unsigned char)*q;
        if (ch == '"') return q + 1;
        if (ch == '\\' || ch < 0x20) break;
    }
    Cursor c = {p, end};
    int plain;
    return cj_skip_string(&c, &plain) < 0 ? NULL : c.p;
}

static inline const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    return p;
}

static const unsigned char NESTED_STOP[256] = {['"'] = 1, ['{'] = 1, ['}'] = 1, ['['] = 1, [']'] = 1};

/* The end of the object or list at p: brackets matched (at most MAX_NESTING open), strings
 * strict; NULL when it is not one. */
static const char *nested_end(const char *p, const char *end) {
    uint64_t objects = 0; /* one bit per open bracket: 1 = an object */
    int depth = 0;
    for (;;) {
        while (p < end && !NESTED_STOP[(unsigned char)*p]) p++;
        if (p >= end) return NULL;
        char ch = *p;
        if (ch == '"') {
            if ((p = string_end(p, end)) == NULL) return NULL;
            continue;
        }
        if (ch == '{' || ch == '[') {
            if (depth == MAX_NESTING) return NULL;
            objects = (objects << 1) | (ch == '{');
            depth++;
        } else {
            if ((int)(objects & 1) != (ch == '}')) return NULL;
            objects >>= 1;
            if (--depth == 0) return p + 1;
        }
        p++;
    }
}

/* A plain integer literal [p, end) (the strict grammar's) as an int64: 0 for -0 or beyond. */
static inline int plain_int(const char *p, const char *end, int64_t *out) {
    int negative = *p == '-';
    p += negative;
    if (end - p > 19 || (negative && end - p == 1 && *p == '0')) return 0;
    uint64_t u = 0;
    for (; p < end; p++) u = u * 10 + (uint64_t)(*p - '0');
    if (u > (uint64_t)INT64_MAX + (uint64_t)negative) return 0;
    *out = negative ? (int64_t)(0 - u) : (int64_t)u;
    return 1;
}

#define IS_DIGIT(ch) ((unsigned)((ch) - '0') < 10)

/* The end of the number at p (NULL when it is not one); *hole when it is a plain integer of 64
 * bits, its value in *value.  Short integers are read here, the rest by cj_skip_number. */
static inline const char *number_end(const char *p, const char *end, int *hole, int64_t *value) {
    const char *digits = p + (*p == '-'), *q = digits;
    while (q < end && IS_DIGIT(*q) && q - digits < 18) q++;
    if (q > digits && (*digits != '0' || q - digits == 1) &&
        (q == end || !(IS_DIGIT(*q) || *q == '.' || *q == 'e' || *q == 'E'))) {
        *hole = plain_int(p, q, value); /* 18 digits at most: only -0 is not a hole */
        return q;
    }
    Cursor c = {p, end};
    int is_int;
    if (cj_skip_number(&c, &is_int) < 0) return NULL;
    *hole = is_int && plain_int(p, c.p, value);
    return c.p;
}

static int add_hole(Holes *h, const char *start, const char *end, const char *key, size_t len,
                    int64_t value) {
    if (h->count == h->cap) {
        Py_ssize_t cap = h->cap ? h->cap * 2 : 16;
        Hole *at = PyMem_Realloc(h->at, cap * sizeof *at);
        if (at == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        h->at = at;
        h->cap = cap;
    }
    h->at[h->count++] = (Hole){start, end, key, len, value};
    return 0;
}

/* The top-level plain integers of one args text into `h`: 1 when it scans cleanly, 0 when it is
 * to be stored whole, -1 with MemoryError set.  The grammar of chrome_json.c's cj_enter,
 * cj_member_key and cj_next_item, inlined: a window's texts are many and short. */
static int scan_text(const char *text, size_t n, Holes *h) {
    const char *p = text, *end = text + n;
    h->count = 0;
    p = skip_ws(p, end);
    if (p >= end || *p != '{') return 0;
    p = skip_ws(p + 1, end);
    if (p < end && *p == '}') return skip_ws(p + 1, end) == end;
    for (;;) {
        if (p >= end || *p != '"') return 0;
        const char *key = p + 1;
        if ((p = string_end(p, end)) == NULL) return 0;
        size_t key_len = (size_t)(p - 1 - key);
        p = skip_ws(p, end);
        if (p >= end || *p != ':') return 0;
        p = skip_ws(p + 1, end);
        if (p >= end) return 0;
        char ch = *p;
        if (ch == '"') {
            p = string_end(p, end);
        } else if (ch == '{' || ch == '[') {
            p = nested_end(p, end);
        } else if (ch == '-' || IS_DIGIT(ch)) {
            const char *start = p;
            int hole;
            int64_t value;
            p = number_end(p, end, &hole, &value);
            if (p != NULL && hole && add_hole(h, start, p, key, key_len, value) < 0) return -1;
        } else {
            const char *word = ch == 't' ? "true" : ch == 'f' ? "false" : ch == 'n' ? "null" : "";
            size_t len = strlen(word);
            p = len && (size_t)(end - p) >= len && memcmp(p, word, len) == 0 ? p + len : NULL;
        }
        if (p == NULL) return 0;
        p = skip_ws(p, end);
        if (p < end && *p == ',') {
            p = skip_ws(p + 1, end);
        } else if (p < end && *p == '}') {
            return skip_ws(p + 1, end) == end;
        } else {
            return 0;
        }
    }
}

typedef struct {
    size_t head;          /* the template's numbers before its pieces (key count to the last gap) */
    size_t text_len;      /* its pieces' bytes */
    int64_t size;         /* the mapping's key count */
    Py_ssize_t first_key; /* its holes' column indexes and gaps: key_of[first_key...], gap_of[...] */
    Py_ssize_t holes;
    Py_ssize_t next;      /* the template that followed it last time, -1 for none yet */
} TemplateInfo;

#define CONTEXTS 1024 /* the templates that followed the last three, remembered (direct-mapped) */

typedef struct {
    uint64_t key; /* the three templates before, mixed; 0 = none */
    Py_ssize_t next;
} Context;

typedef struct {
    Interned keys, templates; /* templates as found again: numbers and pieces, no key indexes */
    Context *contexts;
    Py_ssize_t recent[3]; /* the last three rows' templates, the last first (-1: none) */
    SsBuffer record, rows, info, key_of, gap_of; /* TemplateInfo; Py_ssize_t; Py_ssize_t */
    SsBuffer *columns;                          /* columns[k]: key k's values as zigzag-delta varints */
    int64_t *previous;                          /* the last value of each column */
    Py_ssize_t ncolumns;
    Holes holes;
} Split;

static void split_free(Split *s) {
    interned_free(&s->keys);
    interned_free(&s->templates);
    PyMem_Free(s->record.data);
    PyMem_Free(s->rows.data);
    PyMem_Free(s->info.data);
    PyMem_Free(s->key_of.data);
    PyMem_Free(s->gap_of.data);
    for (Py_ssize_t k = 0; k < s->ncolumns; k++) PyMem_Free(s->columns[k].data);
    PyMem_Free(s->columns);
    PyMem_Free(s->previous);
    PyMem_Free(s->holes.at);
    PyMem_Free(s->contexts);
}

/* The key's column index (a new column for a new key), or -1 with MemoryError set. */
static Py_ssize_t column_of(Split *s, const char *key, size_t len) {
    Py_ssize_t k = interned_index(&s->keys, key, len);
    if (k < 0 || k < s->ncolumns) return k;
    SsBuffer *columns = PyMem_Realloc(s->columns, (k + 1) * sizeof *columns);
    if (columns != NULL) s->columns = columns;
    int64_t *previous = PyMem_Realloc(s->previous, (k + 1) * sizeof *previous);
    if (previous != NULL) s->previous = previous;
    if (columns == NULL || previous == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    s->columns[k] = (SsBuffer){NULL, 0, 0};
    s->previous[k] = 0;
    s->ncolumns = k + 1;
    return k;
}

/* A new template (the holes just scanned): its holes' column indexes and gaps. */
static int add_template(Split *s, const char *text, size_t head, int64_t size, Py_ssize_t count) {
    TemplateInfo info = {head, s->record.len - head, size,
                         (Py_ssize_t)(s->key_of.len / sizeof(Py_ssize_t)), count, -1};
    const char *prev = text;
    for (Py_ssize_t i = 0; i < count; prev = s->holes.at[i++].end) {
        Py_ssize_t k = column_of(s, s->holes.at[i].key, s->holes.at[i].key_len);
        Py_ssize_t gap = s->holes.at[i].start - prev;
        if (k < 0 || ss_buffer_put(&s->key_of, &k, sizeof k) < 0 ||
            ss_buffer_put(&s->gap_of, &gap, sizeof gap) < 0)
            return -1;
    }
    return ss_buffer_put(&s->info, &info, sizeof info);
}

/* The template of a text as the scan finds it (interned; a new one added). */
static Py_ssize_t scanned_template(Split *s, const char *text, size_t n, int64_t size) {
    int clean = scan_text(text, n, &s->holes);
    if (clean < 0) return -1;
    if (!clean) s->holes.count = 0;
    Py_ssize_t count = s->holes.count;
    const Hole *holes = s->holes.at;
    s->record.len = 0;
    if (put_varint(&s->record, (uint64_t)size) < 0 || put_varint(&s->record, (uint64_t)count) < 0)
        return -1;
    const char *prev = text;
    for (Py_ssize_t i = 0; i < count; prev = holes[i++].end) {
        if (put_varint(&s->record, (uint64_t)(holes[i].start - prev)) < 0) return -1;
    }
    if (put_varint(&s->record, (uint64_t)(text + n - prev)) < 0) return -1;
    size_t head = s->record.len;
    prev = text;
    for (Py_ssize_t i = 0; i < count; prev = holes[i++].end) {
        if (ss_buffer_put(&s->record, prev, (size_t)(holes[i].start - prev)) < 0) return -1;
    }
    if (ss_buffer_put(&s->record, prev, (size_t)(text + n - prev)) < 0) return -1;
    Py_ssize_t known = s->templates.count;
    Py_ssize_t t = interned_index(&s->templates, s->record.data, s->record.len);
    if (t == known && add_template(s, text, head, size, count) < 0) return -1;
    return t;
}

/* Whether a text is template t with other integers, its values then in s->holes: the pieces
 * match and each hole holds a plain integer of at most 18 digits, which the scan would cut
 * there too (the piece after a hole starts with what ends a number).  Else the text is scanned. */
static int matches(Split *s, Py_ssize_t t, const char *text, size_t n, int64_t size) {
    const TemplateInfo *info = (const TemplateInfo *)s->info.data + t;
    if (info->size != size) return 0;
    const Py_ssize_t *gaps = (const Py_ssize_t *)s->gap_of.data + info->first_key;
    const char *pieces = s->templates.data.data + (t ? s->templates.ends[t - 1] : 0) + info->head;
    const char *piece = pieces, *p = text, *end = text + n;
    for (Py_ssize_t i = 0; i < info->holes; i++) { /* holes.cap >= the count of any template */
        size_t gap = (size_t)gaps[i];
        if ((size_t)(end - p) < gap || memcmp(p, piece, gap) != 0) return 0;
        p += gap;
        piece += gap;
        const char *digits = p + (p < end && *p == '-'), *q = digits;
        while (q < end && IS_DIGIT(*q) && q - digits < 18) q++;
        Hole *h = &s->holes.at[i];
        if (q == digits || (*digits == '0' && q - digits > 1) || (q < end && IS_DIGIT(*q)) ||
            !plain_int(p, q, &h->value))
            return 0;
        h->start = p;
        p = h->end = q;
    }
    size_t last = info->text_len - (size_t)(piece - pieces);
    s->holes.count = info->holes;
    return (size_t)(end - p) == last && memcmp(p, piece, last) == 0;
}

/* One mapping: its template, its values onto their columns and its row.  Its template is
 * first guessed (the one that followed the same three templates last time, else the previous
 * row's: a window repeats its steps) and checked against the text; else the text is scanned and
 * its template found by its numbers and pieces (the keys are in its pieces: the column indexes
 * of a new one only are worked out). */
static int split_text(Split *s, const char *text, size_t n, int64_t size) {
    TemplateInfo *infos = (TemplateInfo *)s->info.data;
    Py_ssize_t t1 = s->recent[0];
    uint64_t key = ((uint64_t)(t1 + 1) * 0x9E3779B97F4A7C15ULL) ^
                   ((uint64_t)(s->recent[1] + 1) * 0xC2B2AE3D27D4EB4FULL) ^
                   ((uint64_t)(s->recent[2] + 1) * 0x165667B19E3779F9ULL) ^ 1;
    Context *context = &s->contexts[key >> 54];
    Py_ssize_t guess = context->key == key ? context->next : t1 >= 0 ? infos[t1].next : -1;
    Py_ssize_t t = guess;
    if (guess < 0 || !matches(s, guess, text, n, size)) {
        t = scanned_template(s, text, n, size);
        if (t < 0) return -1;
        infos = (TemplateInfo *)s->info.data;
    }
    if (t1 >= 0) infos[t1].next = t;
    *context = (Context){key, t};
    s->recent[2] = s->recent[1];
    s->recent[1] = t1;
    s->recent[0] = t;
    const Py_ssize_t *key_of = (const Py_ssize_t *)s->key_of.data + infos[t].first_key;
    for (Py_ssize_t i = 0; i < infos[t].holes; i++) {
        Py_ssize_t k = key_of[i];
        int64_t value = s->holes.at[i].value;
        uint64_t delta = (uint64_t)value - (uint64_t)s->previous[k];
        s->previous[k] = value;
        if (put_varint(&s->columns[k], (delta << 1) ^ (uint64_t)((int64_t)delta >> 63)) < 0) return -1;
    }
    return put_varint(&s->rows, (uint64_t)t);
}

static PyObject *split_payload(Split *s, Py_ssize_t rows) {
    SsBuffer out = {NULL, 0, 0};
    PyObject *result = NULL;
    if (put_varint(&out, (uint64_t)rows) < 0 || put_varint(&out, (uint64_t)s->templates.count) < 0 ||
        put_varint(&out, (uint64_t)s->keys.count) < 0)
        goto done;
    for (Py_ssize_t k = 0; k < s->keys.count; k++) {
        size_t start = k ? s->keys.ends[k - 1] : 0, len = s->keys.ends[k] - start;
        if (put_varint(&out, len) < 0 || ss_buffer_put(&out, s->keys.data.data + start, len) < 0)
            goto done;
    }
    const TemplateInfo *info = (const TemplateInfo *)s->info.data;
    const Py_ssize_t *key_of = (const Py_ssize_t *)s->key_of.data;
    size_t key_count = s->key_of.len / sizeof *key_of;
    for (Py_ssize_t t = 0; t < s->templates.count; t++) {
        const char *record = s->templates.data.data + (t ? s->templates.ends[t - 1] : 0);
        const char *end = s->templates.data.data + s->templates.ends[t];
        size_t keys_end = t + 1 < s->templates.count ? (size_t)info[t + 1].first_key : key_count;
        if (ss_buffer_put(&out, record, info[t].head) < 0) goto done;
        for (size_t i = (size_t)info[t].first_key; i < keys_end; i++) {
            if (put_varint(&out, (uint64_t)key_of[i]) < 0) goto done;
        }
        if (ss_buffer_put(&out, record + info[t].head, (size_t)(end - record) - info[t].head) < 0) goto done;
    }
    if (ss_buffer_put(&out, s->rows.data, s->rows.len) < 0) goto done;
    for (Py_ssize_t k = 0; k < s->ncolumns; k++) {
        if (put_varint(&out, s->columns[k].len) < 0 ||
            ss_buffer_put(&out, s->columns[k].data, s->columns[k].len) < 0)
            goto done;
    }
    result = PyBytes_FromStringAndSize(out.data, (Py_ssize_t)out.len);
done:
    PyMem_Free(out.data);
    return result;
}

static PyObject *split_args(PyObject *self, PyObject *call_args) {
    PyObject *seq, *raw_type, *fallback;
    if (!PyArg_ParseTuple(call_args, "OOO:split_args", &seq, &raw_type, &fallback)) return NULL;
    PyObject *items = PySequence_Fast(seq, "split_args: args must be a sequence");
    if (items == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    PyObject *sizes = PyBytes_FromStringAndSize(NULL, n * 8), *payload = NULL, *result = NULL;
    Split s = {0};
    s.recent[0] = s.recent[1] = s.recent[2] = -1;
    s.contexts = PyMem_Calloc(CONTEXTS, sizeof *s.contexts);
    if (sizes == NULL || s.contexts == NULL) {
        if (s.contexts == NULL) PyErr_NoMemory();
        goto done;
    }
    int64_t *size_out = (int64_t *)PyBytes_AS_STRING(sizes);
    RawSlots slots = {slot_offset(raw_type, s_raw), slot_offset(raw_type, s_parsed),
                      slot_offset(raw_type, s_size)};
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t size;
        PyObject *text = args_text(PySequence_Fast_GET_ITEM(items, i), raw_type, fallback, &slots, &size);
        if (text == NULL) goto done;
        size_out[i] = (int64_t)size;
        int failed = split_text(&s, PyBytes_AS_STRING(text), (size_t)PyBytes_GET_SIZE(text), size) < 0;
        Py_DECREF(text);
        if (failed) goto done;
    }
    payload = split_payload(&s, n);
    if (payload != NULL) result = PyTuple_Pack(2, payload, sizes);
done:
    split_free(&s);
    Py_XDECREF(payload);
    Py_XDECREF(sizes);
    Py_DECREF(items);
    return result;
}

static PyMethodDef compact_args_methods[] = {
    {"split_args", split_args, METH_VARARGS,
     "split_args(args, raw_type, fallback) -> (the ARGS payload: templates and integer columns, "
     "int64 key counts)."},
    {NULL, NULL, 0, NULL},
};

int ss_compact_args_init(PyObject *module) {
    s_raw = PyUnicode_InternFromString("raw");
    s_parsed = PyUnicode_InternFromString("_parsed");
    s_size = PyUnicode_InternFromString("_size");
    if (s_raw == NULL || s_parsed == NULL || s_size == NULL) return -1;
    return PyModule_AddFunctions(module, compact_args_methods);
}
