/* Async-signal-safe walk of the calling thread's Python frames, for the signal sampler.
 *
 * This is the one translation unit of stepscope that reads CPython internals: the public frame
 * API (PyThreadState_GetFrame, PyFrame_GetBack) creates frame objects, which allocates, so it
 * cannot run in a signal handler.  Instead this file defines Py_BUILD_CORE to see the interpreter's
 * own frame records (_PyInterpreterFrame in internal/pycore_frame.h) and only reads them: no
 * allocation, no locks, no reference counting.  The layouts differ per version:
 *   3.11, 3.12  tstate->cframe->current_frame, frame->f_code, frame->prev_instr
 *   3.13        tstate->current_frame, frame->f_executable, frame->instr_ptr
 * and the header's inline helpers (_PyFrame_IsIncomplete, _PyInterpreterFrame_LASTI) hide the rest.
 * Frames still being set up, and 3.12+ C-stack shim frames, are skipped (as the public API does).
 * A thread can be interrupted while its frame chain is in flux: on 3.11/3.12 a new C-level eval
 * call publishes its _PyCFrame before setting its current_frame (left uninitialised for a few
 * instructions, so it may hold a leftover pointer to a frame popped long ago, whose code object
 * may be freed), and 3.11.0 cleared a returning frame (dropping its code object, possibly
 * unmapping its stack chunk) while it was still the current frame (3.11.1 unlinks it first;
 * sampler.c refuses signal mode on 3.11.0).  Only the innermost pointer can be stale (every
 * `previous` link points to a live frame, which holds a reference to its code), so that one is
 * checked before it is read: it must lie in the used part of one of the thread's data-stack
 * chunks (below datastack_top, or the saved top of an older chunk; the interpreter unlinks a
 * chunk before freeing it), or else be the frame of a running generator, verified through
 * process_vm_readv on this process (which fails cleanly on a bad address): it sits in a
 * generator object in the "executing" state and names a code object.  And a call publishes its
 * new frame as the current one before it sets the frame's `previous` link: 3.11.7's CALL, as
 * compiled, stores current_frame first (nothing orders the two stores for a signal handler),
 * so for a few instructions the innermost frame's `previous` is whatever that data-stack slot
 * held before.  Such a frame has not started (it is "incomplete": prev_instr before its first
 * instruction), so an incomplete innermost frame is not followed.  A sample whose innermost
 * frame fails these checks is dropped (counted by the engine). */
#define Py_BUILD_CORE 1
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "sampler_signal.h"

#if defined(__linux__)
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>
#endif

#if PY_VERSION_HEX >= 0x030B0000
#include <internal/pycore_frame.h>

int ss_walk_available(void) { return 1; }

static inline PyCodeObject *frame_code(_PyInterpreterFrame *frame) {
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *executable = frame->f_executable;
    if (executable == NULL || Py_TYPE(executable) != &PyCode_Type) {
        return NULL;
    }
    return (PyCodeObject *)executable;
#else
    return frame->f_code;
#endif
}

static inline int skipped(_PyInterpreterFrame *frame) {
#if PY_VERSION_HEX >= 0x030C0000
    if (frame->owner == FRAME_OWNED_BY_CSTACK) {
        return 1;
    }
#endif
    return _PyFrame_IsIncomplete(frame);
}

/* Whether [p, p + size) lies in the used part of one of the thread's data-stack chunks: below
 * datastack_top in the newest chunk, below the saved `top` in older ones.  A frame that has been
 * popped lies above it, so a stale pointer to one (whose code may be freed) is refused. */
static int in_chunks(PyThreadState *ts, const void *p, size_t size) {
    int guard = 0;
    _PyStackChunk *newest = ts->datastack_chunk;
    for (_PyStackChunk *chunk = newest; chunk != NULL && guard < 100000;
         chunk = chunk->previous, guard++) {
        const char *start = (const char *)chunk->data;
        const char *end = chunk == newest ? (const char *)ts->datastack_top
                                          : (const char *)&chunk->data[chunk->top];
        if ((const char *)p >= start && (const char *)p + size <= end) {
            return 1;
        }
    }
    return 0;
}

/* Copy n bytes from this process's memory without faulting; 0 on success. */
static int safe_read(void *dst, const void *src, size_t n) {
#if defined(__linux__) && defined(SYS_process_vm_readv)
    struct iovec local = {dst, n};
    struct iovec remote = {(void *)src, n};
    return syscall(SYS_process_vm_readv, getpid(), &local, 1, &remote, 1, 0) == (long)n ? 0 : -1;
#else
    (void)dst;
    (void)src;
    (void)n;
    return -1;
#endif
}

/* Whether a frame outside the data stack is the frame of a generator (or coroutine) that is
 * running: the generator object around it (read in one copy) has a generator type and the
 * "executing" state, and the frame names a code object.  A stale pointer to a suspended,
 * finished or freed generator's frame is refused. */
static int generator_frame(_PyInterpreterFrame *frame) {
    union {
        PyGenObject gen;
        char raw[offsetof(PyGenObject, gi_iframe) + sizeof(_PyInterpreterFrame)];
    } copy;
    const char *gen = (const char *)frame - offsetof(PyGenObject, gi_iframe);
    if (safe_read(&copy, gen, sizeof(copy.raw)) < 0) {
        return 0;
    }
    PyTypeObject *type = copy.gen.ob_base.ob_type;
    if (type != &PyGen_Type && type != &PyCoro_Type && type != &PyAsyncGen_Type) {
        return 0;
    }
    if (copy.gen.gi_frame_state != FRAME_EXECUTING) {
        return 0;
    }
    const _PyInterpreterFrame *inner =
        (const _PyInterpreterFrame *)(copy.raw + offsetof(PyGenObject, gi_iframe));
    if (inner->owner != FRAME_OWNED_BY_GENERATOR) {
        return 0;
    }
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *code = inner->f_executable;
#else
    PyObject *code = (PyObject *)inner->f_code;
#endif
    if (code == NULL || safe_read(&type, &code->ob_type, sizeof(type)) < 0) {
        return 0;
    }
    return type == &PyCode_Type;
}

int ss_walk_this_thread(void **codes, int32_t *positions, int max_depth, int *truncated) {
    PyThreadState *ts = PyGILState_GetThisThreadState();
    *truncated = 0;
    if (ts == NULL) {
        return -1;
    }
#if PY_VERSION_HEX >= 0x030D0000
    _PyInterpreterFrame *frame = ts->current_frame;
#else
    _PyInterpreterFrame *frame = ts->cframe == NULL ? NULL : ts->cframe->current_frame;
#endif
    if (frame != NULL && !in_chunks(ts, frame, offsetof(_PyInterpreterFrame, localsplus)) &&
        !generator_frame(frame)) {
        return -2; /* caught mid-update: no sample */
    }
    if (frame != NULL && frame->owner != FRAME_OWNED_BY_GENERATOR && _PyFrame_IsIncomplete(frame)) {
        /* A frame just pushed by a call and not started yet: its `previous` link may not be
         * set (the compiler may store current_frame before new_frame->previous, as 3.11.7's
         * CALL does), so it names a stale slot of the data stack.  No sample. */
        return -2;
    }
    int n = 0;
    /* A bound on the walk guards against a chain caught mid-update looping forever. */
    for (int seen = 0; frame != NULL && seen < 1000000; seen++, frame = frame->previous) {
        PyCodeObject *code = frame_code(frame);
        if (code == NULL) {
            break;
        }
        if (skipped(frame)) {
            continue;
        }
        if (n == max_depth) {
            *truncated = 1;
            break;
        }
        codes[n] = code;
        /* A byte offset, as PyFrame_GetLasti reports it, so both samplers share frame keys. */
        positions[n] = (int32_t)(_PyInterpreterFrame_LASTI(frame) * (int)sizeof(_Py_CODEUNIT));
        n++;
    }
    return n;
}

#else

int ss_walk_available(void) { return 0; }

int ss_walk_this_thread(void **codes, int32_t *positions, int max_depth, int *truncated) {
    (void)codes;
    (void)positions;
    (void)max_depth;
    *truncated = 0;
    return -1;
}

#endif
