/* JSON lexing for the Chrome trace scanner (chrome_json.c). */
#ifndef STEPSCOPE_CHROME_JSON_H
#define STEPSCOPE_CHROME_JSON_H

#include "chrome_values.h"

typedef struct {
    const char *p;
    const char *end;
} Cursor;

static inline void cj_skip_ws(Cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t')) {
        c->p++;
    }
}


typedef struct {
    const char *start, *end; /* the value's JSON text; start NULL when the key is absent */
} Token;

/* A JSON string at c->p (validated); sets *plain when it is ASCII without escapes.  0 / -1. */
int cj_skip_string(Cursor *c, int *plain);
/* A JSON number (strict grammar); *is_int when it has no fraction or exponent.  0 / -1. */
int cj_skip_number(Cursor *c, int *is_int);
/* Any JSON value (strict; NaN/Infinity are not taken).  0 / -1. */
int cj_skip_value(Cursor *c, int depth);
/* Consumes `open`; 1 = items follow, 0 = it closed at once (consumed), -1 = not there. */
int cj_enter(Cursor *c, char open, char close);
/* After an item: 1 = a comma (another item follows), 0 = `close` (consumed), -1 = bad JSON. */
int cj_next_item(Cursor *c, char close);
/* A member's key and its colon; *key, *len = the key's text, *plain = ASCII without escapes. */
int cj_member_key(Cursor *c, const char **key, size_t *len, int *plain);
/* The args object at c->p as compact text (Kineto's bookkeeping dropped when `drop`); *members =
 * how many are kept.  0 / -1 (bad JSON, or no memory with MemoryError set). */
int cj_read_args(Cursor *c, int drop, SsBuffer *o, Py_ssize_t *members);
/* Whether a token is exactly `text`. */
int cj_token_is(const Token *t, const char *text);
/* The str of a JSON string token (json.loads for escapes and non-ASCII); NULL with an error. */
PyObject *cj_decode_string(const Token *t, PyObject *loads);
/* A number token (as cj_skip_value delimits it) as json.loads reads it: an integer (*is_int) in
 * *i, else a float in *d; 0 when it is not a number, or an integer beyond 64 bits. */
int cj_parse_number(const Token *t, int *is_int, long long *i, double *d);

#endif
