/* What the Chrome trace scanner's parts share (chrome_scanner.c: the events; chrome_samples.c: the
 * stack samples beside them): the scan's state and the value rules of the per-event reader. */
#ifndef STEPSCOPE_CHROME_SCAN_H
#define STEPSCOPE_CHROME_SCAN_H

#include "chrome_json.h"

#include <stdint.h>

typedef struct {
    Token ph, name, cat, pid, tid, ts, dur, scope, id, bp;
    const char *args_start, *args_end; /* the args object's text, when it is an object */
    int args;                          /* 0 absent or null, 1 object, -1 another type */
    int compacted;                     /* args already in the scan's args buffer */
    Py_ssize_t members;
} Event;

typedef struct {
    Token name, cat;                   /* in the document, interned when the span closes */
    const char *args_start, *args_end; /* as Event's */
    int args;
    int64_t ts;
} Begin;

typedef struct {
    int64_t pid, tid;
    Begin *open;
    Py_ssize_t len, cap;
} Track;

typedef struct {
    const char *text; /* the string's JSON text between its quotes, in the document */
    Py_ssize_t len;
    uint64_t hash;
    int64_t id;
} Slot;

typedef struct {
    PyObject *ids, *strings, *args_store, *raw_type, *skip_cat, *loads, *flow_id;
    int drop;
    const char *skip_utf8; /* skip_cat's text */
    Py_ssize_t skip_len;
    PyObject *slots_descr[3]; /* RawArgs' slot descriptors, or NULL (see raw_args_slots) */
    Slot *slots; /* interned plain strings by their text (open addressing) */
    size_t mask, used;
    SsBuffer args;
    SsBuffer spans[7], instants[7], flows[8], meta[4], counters[7];
    SsBuffer closed[7]; /* spans closed from B/E pairs, which follow the X spans */
    SsBuffer samples[6]; /* pid, tid, ts, sf index (-1 none), weight, idle */
    PyObject *sf_keys;   /* the distinct sample stack-frame keys (str), by sf index; NULL if none */
    PyObject *sf_index;  /* sf key -> index */
    Track *tracks;      /* open B events per (pid, tid) */
    Py_ssize_t ntracks, tracks_cap, unmatched_ends;
} Scan;

/* The string id of a string token (0 when absent or null); -1 with an error. */
int64_t scan_intern_token(Scan *s, const Token *t);
/* A one-character string value (json's reading of the token), else 0; -1 with an error. */
int scan_single_char(Scan *s, const Token *t);
/* Microseconds to ns as round(value * 1000) on json's int or float; 1 ok, 0 not plain. */
int scan_parse_us(const Token *t, int64_t *out);
/* A pid/tid: 0 when absent, a number in range, or a string (to intern later: *is_label).
 * 1 ok, 0 not plain. */
int scan_check_label(const Token *t, int64_t *out, int *is_label);
/* The column value of a label checked by scan_check_label (string labels interned); -1 with an
 * error set. */
int64_t scan_label_value(Scan *s, const Token *t, int64_t number, int is_label);
/* An int64 as the per-event reader's integers (an integral float too); 1 ok, 0 not one. */
int scan_int64(const Token *t, int64_t *out);
/* The "samples" list at c->p into the sample columns; 0 done, 1 not scannable, -1 error. */
int scan_samples(Cursor *c, Scan *s);

#endif
