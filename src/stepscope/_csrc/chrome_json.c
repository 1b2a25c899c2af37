/* The JSON lexing the Chrome trace scanner stands on: strict validation of values without building
 * them, args objects copied as compact text (optionally without Kineto's bookkeeping keys), and
 * the decoding of single string and number tokens as json.loads reads them. */
#include "chrome_json.h"

#include <errno.h>
#include <stdlib.h>

#define MAX_INT_DIGITS 4300 /* CPython's default int_max_str_digits */
#define MAX_MEMBERS 64 /* args members kept on the stack; more go to the heap */
#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL
/* bytes a string scan stops at: a quote, a backslash, a control or non-ASCII byte */
#define SPECIAL(ch) ((ch) == '"' || (ch) == '\\' || (ch) < 0x20 || (ch) >= 0x80)

/* A JSON string at c->p (validated); sets *plain when it is ASCII without escapes.  0 / -1. */
int cj_skip_string(Cursor *c, int *plain) {
    if (c->p >= c->end || *c->p != '"') {
        return -1;
    }
    c->p++;
    *plain = 1;
    while (c->p < c->end) {
        /* eight bytes at a time while none is a quote, a backslash, a control or non-ASCII byte */
        while (c->end - c->p >= 8) {
            uint64_t w, quote, slash;
            memcpy(&w, c->p, 8);
            quote = w ^ (ONES * '"');
            slash = w ^ (ONES * '\\');
            if (((w - ONES * 0x20) | (quote - ONES) | (slash - ONES) | w) & HIGHS) break;
            c->p += 8;
        }
        while (c->p < c->end && !SPECIAL((unsigned char)*c->p)) c->p++;
        if (c->p >= c->end) break;
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
int cj_skip_number(Cursor *c, int *is_int) {
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
int cj_enter(Cursor *c, char open, char close) {
    if (c->p >= c->end || *c->p != open) return -1;
    c->p++;
    cj_skip_ws(c);
    if (c->p < c->end && *c->p == close) {
        c->p++;
        return 0;
    }
    return 1;
}

/* After an item: 1 = a comma (another item follows), 0 = `close` (consumed), -1 = bad JSON. */
int cj_next_item(Cursor *c, char close) {
    cj_skip_ws(c);
    if (c->p < c->end && (*c->p == ',' || *c->p == close)) {
        return *c->p++ == ',';
    }
    return -1;
}

/* A member's key and its colon; *key, *len = the key's text, *plain = ASCII without escapes. */
int cj_member_key(Cursor *c, const char **key, size_t *len, int *plain) {
    cj_skip_ws(c);
    *key = c->p + 1;
    if (cj_skip_string(c, plain) < 0) return -1;
    *len = (size_t)(c->p - 1 - *key);
    cj_skip_ws(c);
    if (c->p >= c->end || *c->p != ':') return -1;
    c->p++;
    cj_skip_ws(c);
    return 0;
}

/* Any JSON value (strict; NaN/Infinity are not taken).  0 / -1. */
int cj_skip_value(Cursor *c, int depth) {
    int plain, is_int, more;
    const char *key;
    size_t len;
    if (depth > 200) return -1;
    cj_skip_ws(c);
    if (c->p >= c->end) return -1;
    switch (*c->p) {
    case '"':
        return cj_skip_string(c, &plain);
    case '{':
        for (more = cj_enter(c, '{', '}'); more == 1; more = cj_next_item(c, '}')) {
            if (cj_member_key(c, &key, &len, &plain) < 0 || cj_skip_value(c, depth + 1) < 0) return -1;
        }
        return more;
    case '[':
        for (more = cj_enter(c, '[', ']'); more == 1; more = cj_next_item(c, ']')) {
            if (cj_skip_value(c, depth + 1) < 0) return -1;
        }
        return more;
    case 't':
        return skip_literal(c, "true");
    case 'f':
        return skip_literal(c, "false");
    case 'n':
        return skip_literal(c, "null");
    default:
        return cj_skip_number(c, &is_int);
    }
}

/* Copies the JSON text [from, to) without whitespace outside strings. */
static int put_compact(SsBuffer *o, const char *from, const char *to) {
    if (ss_buffer_reserve(o, (size_t)(to - from)) < 0) return -1;
    char *out = o->data + o->len;
    int in_string = 0;
    for (const char *p = from; p < to; p++) {
        char ch = *p;
        *out = ch;
        if (in_string) {
            if (ch == '\\' && p + 1 < to) {
                *++out = *++p;
            } else if (ch == '"') {
                in_string = 0;
            }
            out++;
        } else {
            in_string = ch == '"';
            out += !(ch == ' ' || ch == '\n' || ch == '\r' || ch == '\t');
        }
    }
    o->len = (size_t)(out - o->data);
    return 0;
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
int cj_read_args(Cursor *c, int drop, SsBuffer *o, Py_ssize_t *members) {
    Member local[MAX_MEMBERS], *all = local;
    Py_ssize_t count = 0, cap = MAX_MEMBERS;
    int plain, r = -1;
    const char *start = c->p;
    int more;
    for (more = cj_enter(c, '{', '}'); more == 1; more = cj_next_item(c, '}')) {
        Member m;
        size_t key_len;
        if (cj_member_key(c, &m.key, &key_len, &plain) < 0) goto out;
        m.key_end = m.key + key_len;
        m.value = c->p;
        if (cj_skip_value(c, 1) < 0) goto out;
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

int cj_token_is(const Token *t, const char *text) {
    size_t n = strlen(text);
    return t->start != NULL && (size_t)(t->end - t->start) == n && memcmp(t->start, text, n) == 0;
}

/* The str of a JSON string token (json.loads for escapes and non-ASCII); NULL with an error. */
PyObject *cj_decode_string(const Token *t, PyObject *loads) {
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

/* The double nearest m / 10**k (ties to even) for 2**53 < m < 2**64 and 1 <= k <= 19 (such as
 * Kineto's "1712195495519695.812"): the quotient of m * 2**64 by 10**k holds 54 or more bits,
 * rounded to 53 with the remainder as the sticky part. */
static double exact_quotient(uint64_t m, int k) {
    unsigned __int128 p = 1;
    for (int j = 0; j < k; j++) p *= 10;
    unsigned __int128 n = (unsigned __int128)m << 64;
    unsigned __int128 q = n / p, r = n % p;
    int bits = 0;
    for (unsigned __int128 x = q; x != 0; x >>= 1) bits++;
    int drop = bits - 53;
    uint64_t kept;
    int up;
    if (drop > 0) {
        unsigned __int128 low = q & (((unsigned __int128)1 << drop) - 1);
        unsigned __int128 half = (unsigned __int128)1 << (drop - 1);
        kept = (uint64_t)(q >> drop);
        up = low > half || (low == half && (r != 0 || (kept & 1)));
    } else {
        kept = (uint64_t)q;
        up = 2 * r > p || (2 * r == p && (kept & 1));
        drop = 0;
    }
    return ldexp((double)(kept + (uint64_t)up), drop - 64);
}

/* A decimal number of at most 19 significant digits, when its double is found exactly with
 * integers: a mantissa of 53 bits and a power of ten exact in a double take one correctly rounded
 * multiplication or division (Clinger's fast path); a longer mantissa with 1 to 19 decimals takes
 * exact_quotient.  1 done, 0 not this case. */
static int fast_double(const char *p, const char *end, double *out) {
    static const double powers[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                    1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                    1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    int negative = *p == '-', digits = 0, exp10 = 0;
    uint64_t mantissa = 0;
    p += negative;
    for (; p < end && *p >= '0' && *p <= '9'; p++, digits++) mantissa = mantissa * 10 + (uint64_t)(*p - '0');
    if (p < end && *p == '.') {
        for (p++; p < end && *p >= '0' && *p <= '9'; p++, digits++, exp10--)
            mantissa = mantissa * 10 + (uint64_t)(*p - '0');
    }
    if (p < end) { /* an exponent */
        int sign = 1, e = 0;
        p++;
        if (*p == '+' || *p == '-') sign = *p++ == '-' ? -1 : 1;
        for (; p < end; p++) {
            e = e * 10 + (*p - '0');
            if (e > 1000) return 0;
        }
        exp10 += sign * e;
    }
    if (digits > 19) return 0;
    double v;
    if (mantissa <= ((uint64_t)1 << 53) && exp10 >= -22 && exp10 <= 22) {
        v = (double)mantissa;
        v = exp10 < 0 ? v / powers[-exp10] : v * powers[exp10];
    } else if (mantissa > ((uint64_t)1 << 53) && exp10 < 0 && exp10 >= -19) {
        v = exact_quotient(mantissa, -exp10);
    } else {
        return 0;
    }
    *out = negative ? -v : v;
    return 1;
}

/* A number token as json.loads reads it: an integer (*is_int) in *i, else a float in *d.
 * 0 when it is not a number, or an integer beyond 64 bits.  Tokens of any length are read
 * (a long float such as 0.000...1 is still a float to json.loads). */
int cj_parse_number(const Token *t, int *is_int, long long *i, double *d) {
    char small[64];
    char *buf = small;
    int ok = 1;
    size_t n = (size_t)(t->end - t->start);
    /* tokens come from cj_skip_value: one that starts like a number is a valid number */
    if (t->start == NULL || !(*t->start == '-' || (*t->start >= '0' && *t->start <= '9'))) return 0;
    *is_int = 1;
    for (const char *p = t->start; p < t->end; p++) {
        if (*p == '.' || *p == 'e' || *p == 'E') {
            *is_int = 0;
            break;
        }
    }
    if (*is_int) {
        /* up to 18 digits cannot overflow; longer ones go to strtoll's range check */
        const char *p = t->start + (*t->start == '-');
        if (t->end - p <= 18) {
            long long v = 0;
            for (; p < t->end; p++) v = v * 10 + (*p - '0');
            *i = *t->start == '-' ? -v : v;
            return 1;
        }
        if (n > 21) return 0; /* beyond 64 bits whatever the digits */
    } else if (fast_double(t->start, t->end, d)) {
        return 1;
    }
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
        /* the C library's correctly rounded strtod when it reads the whole token (it does not in
         * a locale with another decimal point, or on overflow), else CPython's own */
        char *stop;
        errno = 0;
        *d = strtod(buf, &stop);
        if (stop != buf + n || errno == ERANGE) {
            *d = PyOS_string_to_double(buf, NULL, NULL);
            if (*d == -1.0 && PyErr_Occurred()) {
                PyErr_Clear();
                ok = 0;
            }
        }
    }
    if (buf != small) PyMem_Free(buf);
    return ok;
}
