/* The stepscope._native module: each C part registers its functions, types and constants on it
 * (the ss_*_init functions of stepscope_native.h). */
#include "stepscope_native.h"

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "stepscope._native",
    .m_doc = "C parts of stepscope: the clock, the Chrome trace writer and reader, record_function, "
             "the function tracer, the stack sampler, the step recorder's ring, the allocation "
             "hook, span nesting and the compact form's columns and args (stepscope._ext chooses them or "
             "their pure-Python twins).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *module = PyModule_Create(&native_module);
    if (module == NULL) {
        return NULL;
    }
    if (ss_clock_init(module) < 0 || ss_chrome_writer_init(module) < 0 || ss_annotations_init(module) < 0 ||
        ss_tracer_init(module) < 0 || ss_sampler_init(module) < 0 || ss_chrome_columns_init(module) < 0 ||
        ss_chrome_args_init(module) < 0 ||
        ss_chrome_scanner_init(module) < 0 || ss_step_times_init(module) < 0 ||
        ss_alloc_hook_init(module) < 0 || ss_span_nesting_init(module) < 0 ||
        ss_compact_columns_init(module) < 0 || ss_compact_args_init(module) < 0 ||
        ss_compact_splice_init(module) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
