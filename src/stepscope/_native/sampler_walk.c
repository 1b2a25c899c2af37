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
 * The thread state comes from PyGILState_GetThisThreadState(), a thread-specific-data read that
 * becomes NULL before the interpreter frees a finishing thread's state.  Before 3.11 the walk is not
 * available (frames are heap objects there) and the caller falls back to the thread sampler. */
#define Py_BUILD_CORE 1
#include <Python.h>

#include <stdint.h>

#include "sampler_signal.h"

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
    int n = 0;
    /* A bound on the walk guards against a chain caught mid-update looping forever. */
    for (int seen = 0; frame != NULL && seen < 1000000; seen++, frame = frame->previous) {
        PyCodeObject *code = frame_code(frame);
        if (code == NULL || skipped(frame)) {
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
