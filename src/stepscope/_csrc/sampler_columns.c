/* The stack sampler's interned tables and sample columns (see sampler.h): each (code object,
 * instruction offset) is one frame and each (parent, frame) pair one stack node, kept once in
 * open-addressing maps; a sample is a row of (thread, time, stack, idle) columns.  Lines are
 * resolved only at export. */
#include "sampler.h"

#include <stdlib.h>
#include <string.h>

static inline size_t mix(uint64_t a, uint64_t b) {
    uint64_t x = a * 0x9E3779B97F4A7C15ULL ^ (b + 0x632BE59BD9B4E019ULL + (a << 6) + (a >> 2));
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 29;
    return (size_t)x;
}

static int map_grow(Map *m) {
    size_t cap = m->cap ? m->cap * 2 : 1024;
    Slot *slots = calloc(cap, sizeof(Slot));
    if (slots == NULL) {
        return -1;
    }
    for (size_t i = 0; i < m->cap; i++) {
        Slot *s = &m->slots[i];
        if (!s->used) {
            continue;
        }
        size_t j = mix(s->a, s->b) & (cap - 1);
        while (slots[j].used) {
            j = (j + 1) & (cap - 1);
        }
        slots[j] = *s;
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return 0;
}

/* The value slot for (a, b); a new slot gets value -1 and *is_new = 1.  NULL when out of memory. */
static int32_t *map_slot(Map *m, uint64_t a, uint64_t b, int *is_new) {
    if ((m->count + 1) * 2 > m->cap && map_grow(m) < 0) {
        return NULL;
    }
    size_t j = mix(a, b) & (m->cap - 1);
    while (m->slots[j].used) {
        if (m->slots[j].a == a && m->slots[j].b == b) {
            *is_new = 0;
            return &m->slots[j].value;
        }
        j = (j + 1) & (m->cap - 1);
    }
    m->slots[j].used = 1;
    m->slots[j].a = a;
    m->slots[j].b = b;
    m->slots[j].value = -1;
    m->count++;
    *is_new = 1;
    return &m->slots[j].value;
}

int sm_column_push(Column *c, const void *value) {
    if (c->len == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 256;
        char *data = realloc(c->data, cap * c->item);
        if (data == NULL) {
            return -1;
        }
        c->data = data;
        c->cap = cap;
    }
    memcpy(c->data + c->len * c->item, value, c->item);
    c->len++;
    return 0;
}

PyObject *sm_column_bytes(const Column *c) {
    return PyBytes_FromStringAndSize(c->data ? c->data : "", (Py_ssize_t)(c->len * c->item));
}


int32_t sm_intern_frame(Sampler *self, PyCodeObject *code, int pos) {
    int is_new;
    int32_t *slot = map_slot(&self->frame_ids, (uint64_t)(uintptr_t)code, (uint64_t)(int64_t)pos,
                             &is_new);
    if (slot == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (!is_new) {
        return *slot;
    }
    int code_new;
    int32_t *code_slot = map_slot(&self->code_ids, (uint64_t)(uintptr_t)code, UINT64_MAX,
                                  &code_new);
    if (code_slot == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (code_new) {
        if (PyList_Append(self->codes, (PyObject *)code) < 0) { /* keeps the pointer unique */
            return -1;
        }
        *code_slot = (int32_t)(PyList_GET_SIZE(self->codes) - 1);
    }
    int32_t fid = (int32_t)self->frame_code.len;
    int32_t pos32 = pos;
    if (sm_column_push(&self->frame_code, code_slot) < 0 || sm_column_push(&self->frame_pos, &pos32) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    *slot = fid;
    return fid;
}

int32_t sm_intern_stack(Sampler *self, int32_t parent, int32_t frame) {
    int is_new;
    int32_t *slot = map_slot(&self->stack_ids, (uint64_t)(int64_t)parent, (uint64_t)frame, &is_new);
    if (slot == NULL) {
        PyErr_NoMemory();
        return -2;
    }
    if (is_new) {
        int32_t sid = (int32_t)self->stack_parent.len;
        if (sm_column_push(&self->stack_parent, &parent) < 0 ||
            sm_column_push(&self->stack_frame, &frame) < 0) {
            PyErr_NoMemory();
            return -2;
        }
        *slot = sid;
    }
    return *slot;
}

static int frame_position(PyFrameObject *frame) {
#if SS_HAVE_LASTI
    return PyFrame_GetLasti(frame);
#else
    return PyFrame_GetLineNumber(frame);
#endif
}

/* The stack id of a frame chain (-1 for none), or -2 with an exception set; `frame` is a new
 * reference that this function releases. */
int32_t sm_stack_of_frame(Sampler *self, PyFrameObject *frame) {
    int n = 0;
    int truncated = 0;
    while (frame != NULL) {
        if (n == self->max_depth) {
            truncated = 1;
            Py_DECREF(frame);
            break;
        }
        PyCodeObject *code = PyFrame_GetCode(frame);
        int32_t fid = sm_intern_frame(self, code, frame_position(frame));
        Py_DECREF(code);
        if (fid < 0) {
            Py_DECREF(frame);
            return -2;
        }
        self->scratch[n++] = fid;
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    int32_t stack = -1;
    if (truncated) {
        stack = sm_intern_stack(self, -1, 0);
    }
    for (int i = n - 1; i >= 0 && stack != -2; i--) {
        stack = sm_intern_stack(self, stack, self->scratch[i]);
    }
    return stack;
}

int sm_push_sample(Sampler *self, int64_t tid, int64_t ts, int32_t stack, uint8_t idle) {
    if (sm_column_push(&self->sample_tid, &tid) < 0 || sm_column_push(&self->sample_ts, &ts) < 0 ||
        sm_column_push(&self->sample_stack, &stack) < 0 || sm_column_push(&self->sample_idle, &idle) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}
