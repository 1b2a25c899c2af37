/* The allocation hook of profile_memory: exact per-step totals of the Python heap, sampled sites.
 *
 * The hook wraps the PYMEM_DOMAIN_MEM and PYMEM_DOMAIN_OBJ allocators (PyMem_SetAllocator, the
 * originals kept and chained to).  Both domains are only called with the GIL held, so the GIL is
 * the lock: the hot path takes none.  The raw domain is left alone: pymalloc itself calls it for
 * blocks over 512 bytes (counting both would count them twice) and the interpreter calls it
 * without the GIL.  Free-threaded builds are refused at start (the caller falls back to
 * tracemalloc).
 *
 * Exact totals.  A free names only a pointer, so each block allocated while the hook is on is
 * remembered with the size it was requested with: its free is counted with that size, and a block
 * allocated before the hook (not remembered) is not counted when freed, the same totals
 * tracemalloc keeps.  Most blocks are small objects (1-255 bytes, 16-byte aligned): their sizes
 * are kept in a page map, one byte per 16 bytes of address space, in chunks of 1 KiB that each
 * cover one 16 KiB unit of addresses (a pymalloc pool), found through a small directory keyed by
 * the unit's number; a chunk is recycled when its unit holds no counted block at a step end.
 * Neighbouring allocations (pymalloc hands out a pool's blocks in order) touch the same chunk, so
 * the common case costs a cached compare and a byte store, and the map's memory is at most 1/16
 * of the small blocks' units.  Other blocks (larger, odd-aligned, empty, or sampled: the sample bit
 * must travel with them) go to an open-addressing table (pointer -> requested size, linear
 * probing, backward-shift deletion, 16 bytes per slot at most 70 % full).  A size header in
 * front of each block was not used: it would change the alignment the domain promises, and a
 * block allocated with a header before the hook stops would reach the original free() with the
 * wrong pointer afterwards.  The map and the table are raw mmap memory (never the hooked
 * domains); their bytes are reported.
 *
 * Sampled sites.  Sampling is by bytes, a Poisson process with a mean distance of `mean` bytes:
 * a countdown drawn from an exponential distribution is decreased by each allocation's size; the
 * allocation that takes it to zero is sampled, weighted back by size / (1 - exp(-size / mean)),
 * the inverse of its chance to be sampled.  Allocations of `large` bytes or more are always
 * sampled (weight = size).  A sample records the calling thread's Python frames (code object and
 * instruction offset, read by sampler_walk.c without allocating); its free is recorded too, so
 * the reader can replay which samples were alive at any point.  Events go to a bounded buffer
 * (drops are counted); `peak_mark` is the number of events recorded when the step's peak was
 * last raised, so the samples alive at the peak are those recorded before it and not yet freed.
 */
#include "stepscope_native.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "sampler_signal.h"

#define SS_HOOK_FRAMES 24
#define SS_HOOK_LAYERS 4
#define SS_SAMPLED_BIT ((uint64_t)1 << 63)

typedef struct {
    uintptr_t ptr;
    uint64_t size; /* requested size; SS_SAMPLED_BIT set for sampled blocks */
} ss_slot;

#define SS_UNIT_SHIFT 14                          /* 16 KiB of addresses per chunk */
#define SS_CHUNK_BYTES (1 << (SS_UNIT_SHIFT - 4)) /* one byte per 16-byte block */
#define SS_SLAB_CHUNKS 1024
#define SS_SMALL_MAX 255
#define SS_UNIT_CACHE 64

/* One unit of the page map: its number (address >> SS_UNIT_SHIFT, 0 for an empty slot), its
 * chunk of sizes and how many counted blocks it holds. */
typedef struct {
    uintptr_t unit;
    uint8_t *chunk;
    uint64_t live;
} ss_unit;

/* The mmap'd memory the chunks are cut from. */
typedef struct ss_slab {
    struct ss_slab *next;
    size_t bytes;
} ss_slab;

typedef struct {
    uintptr_t ptr;
    uint64_t size;    /* 0 for a free */
    double weight;
    int64_t t_ns;
    int32_t nframes;
    void *codes[SS_HOOK_FRAMES];
    int32_t positions[SS_HOOK_FRAMES];
} ss_event;

/* One installation of the hook on both domains; a layer left in a chain by an unhook that could
 * not restore the originals stays a pass-through (active == 0) for the life of the process. */
typedef struct {
    PyMemAllocatorEx original;
    int active;
} ss_layer;

static ss_layer layers[SS_HOOK_LAYERS][2]; /* [layer][0: MEM, 1: OBJ] */
static int layers_used = 0;
static int current_layer = -1;
static int passthrough_layers = 0;

#if defined(__GNUC__)
static _Thread_local int paused __attribute__((tls_model("initial-exec"))) = 0;
#else
static _Thread_local int paused = 0;
#endif

static struct {
    ss_slot *slots;
    size_t capacity; /* a power of two, or 0 */
    size_t used;
    uint64_t untracked; /* blocks that could not be entered (the table could not grow) */
    ss_unit *units;     /* the page map's directory: open addressing on the unit number */
    size_t unit_capacity, units_used;
    uint64_t small_used; /* blocks held in the page map */
    /* Directory slots of recently used units, by the unit number's low bits: a program
     * allocates from a few pools at once (one per size class), neighbouring pools have
     * neighbouring numbers.  An entry is checked against the unit it should hold, so one
     * left pointing at a slot that deletion shifted is a miss, never a wrong answer; the
     * cache is cleared when the directory moves. */
    ss_unit *unit_cache[SS_UNIT_CACHE];
    uint8_t *free_chunks; /* recycled chunks, linked through their first bytes */
    ss_slab *slabs;
    size_t slab_bytes;
    int64_t current, step_peak, interval_peak;
    uint64_t step_allocated, step_freed, step_allocs, step_frees;
    int64_t countdown;
    double mean;
    uint64_t large;
    uint64_t rng;
    ss_event *events;
    size_t n_events, events_capacity, max_events;
    uint64_t first_seq;  /* sequence number of events[0] */
    uint64_t peak_mark;  /* sequence number after the last event recorded at the step's peak */
    uint64_t dropped;    /* samples lost to a full buffer */
    uint64_t lost_frees; /* frees of sampled blocks lost to a failed buffer growth */
    uint64_t samples;
} hs;

/* -- the block table -------------------------------------------------------------------------- */

/* Fibonacci hashing: the product's high bits, which every bit of the pointer reaches (pymalloc
 * hands out neighbouring blocks, so the low bits alone would cluster). */
static inline size_t slot_of(uintptr_t ptr, size_t mask) {
    uint64_t h = (uint64_t)ptr * 0x9E3779B97F4A7C15ULL;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ULL;
    return (size_t)(h >> 32) & mask;
}

/* Zeroed memory from mmap, on huge pages where the kernel gives them on request: every table
 * access is a random one, and a big table's cost is mostly TLB misses. */
static void *map_zeroed(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    if (bytes >= ((size_t)2 << 20)) {
        madvise(p, bytes, MADV_HUGEPAGE);
    }
#endif
    return p;
}

static ss_slot *slots_new(size_t capacity) { return (ss_slot *)map_zeroed(capacity * sizeof(ss_slot)); }

static void slots_free(ss_slot *slots, size_t capacity) {
    if (slots != NULL) {
        munmap(slots, capacity * sizeof(ss_slot));
    }
}

static int table_grow(void) {
    size_t capacity = hs.capacity ? hs.capacity * 2 : 4096;
    ss_slot *slots = slots_new(capacity);
    if (slots == NULL) {
        return -1;
    }
    size_t mask = capacity - 1;
    for (size_t i = 0; i < hs.capacity; i++) {
        if (hs.slots[i].ptr != 0) {
            size_t j = slot_of(hs.slots[i].ptr, mask);
            while (slots[j].ptr != 0) {
                j = (j + 1) & mask;
            }
            slots[j] = hs.slots[i];
        }
    }
    slots_free(hs.slots, hs.capacity);
    hs.slots = slots;
    hs.capacity = capacity;
    return 0;
}

static inline int table_put(uintptr_t ptr, uint64_t size) {
    if ((hs.used + 1) * 10 > hs.capacity * 7 && table_grow() < 0) {
        hs.untracked++;
        return -1;
    }
    size_t mask = hs.capacity - 1;
    size_t i = slot_of(ptr, mask);
    while (hs.slots[i].ptr != 0) {
        if (hs.slots[i].ptr == ptr) { /* a pointer freed behind the hook's back, reused */
            hs.slots[i].size = size;
            return 0;
        }
        i = (i + 1) & mask;
    }
    hs.slots[i].ptr = ptr;
    hs.slots[i].size = size;
    hs.used++;
    return 0;
}

/* Remove ptr; its size (with the sampled bit) or UINT64_MAX when it was not in the table. */
static inline uint64_t table_take(uintptr_t ptr) {
    if (hs.capacity == 0) {
        return UINT64_MAX;
    }
    size_t mask = hs.capacity - 1;
    size_t i = slot_of(ptr, mask);
    while (hs.slots[i].ptr != ptr) {
        if (hs.slots[i].ptr == 0) {
            return UINT64_MAX;
        }
        i = (i + 1) & mask;
    }
    uint64_t size = hs.slots[i].size;
    /* backward-shift deletion keeps every probe chain unbroken without tombstones */
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (hs.slots[j].ptr == 0) {
            break;
        }
        size_t home = slot_of(hs.slots[j].ptr, mask);
        if (((j - home) & mask) >= ((j - i) & mask)) {
            hs.slots[i] = hs.slots[j];
            i = j;
        }
    }
    hs.slots[i].ptr = 0;
    hs.used--;
    return size;
}

/* -- the page map of small blocks ------------------------------------------------------------- */

static inline size_t unit_slot(uintptr_t unit, size_t mask) {
    return (size_t)(((uint64_t)unit * 0x9E3779B97F4A7C15ULL) >> 32) & mask;
}

static int units_grow(void) {
    size_t capacity = hs.unit_capacity ? hs.unit_capacity * 2 : 1024;
    ss_unit *units = (ss_unit *)map_zeroed(capacity * sizeof(ss_unit));
    if (units == NULL) {
        return -1;
    }
    size_t mask = capacity - 1;
    for (size_t i = 0; i < hs.unit_capacity; i++) {
        if (hs.units[i].unit != 0) {
            size_t j = unit_slot(hs.units[i].unit, mask);
            while (units[j].unit != 0) {
                j = (j + 1) & mask;
            }
            units[j] = hs.units[i];
        }
    }
    if (hs.units != NULL) {
        munmap(hs.units, hs.unit_capacity * sizeof(ss_unit));
    }
    hs.units = units;
    hs.unit_capacity = capacity;
    memset(hs.unit_cache, 0, sizeof(hs.unit_cache));
    return 0;
}

static void units_release(void) {
    if (hs.units != NULL) {
        munmap(hs.units, hs.unit_capacity * sizeof(ss_unit));
    }
    hs.units = NULL;
    hs.unit_capacity = hs.units_used = 0;
    hs.small_used = 0;
    memset(hs.unit_cache, 0, sizeof(hs.unit_cache));
    hs.free_chunks = NULL;
    while (hs.slabs != NULL) {
        ss_slab *slab = hs.slabs;
        hs.slabs = slab->next;
        munmap(slab, slab->bytes);
    }
    hs.slab_bytes = 0;
}

/* A zeroed chunk: a recycled one, or the next of a fresh slab (whose first chunk holds the
 * slab's header). */
static uint8_t *chunk_new(void) {
    uint8_t *chunk = hs.free_chunks;
    if (chunk != NULL) {
        memcpy(&hs.free_chunks, chunk, sizeof(uint8_t *));
        memset(chunk, 0, sizeof(void *));
        return chunk;
    }
    size_t bytes = (size_t)SS_SLAB_CHUNKS * SS_CHUNK_BYTES;
    ss_slab *slab = (ss_slab *)map_zeroed(bytes);
    if (slab == NULL) {
        return NULL;
    }
    slab->next = hs.slabs;
    slab->bytes = bytes;
    hs.slabs = slab;
    hs.slab_bytes += bytes;
    uint8_t *base = (uint8_t *)slab;
    for (size_t k = SS_SLAB_CHUNKS - 1; k >= 2; k--) { /* chunk 0 is the header's */
        uint8_t *c = base + k * SS_CHUNK_BYTES;
        memcpy(c, &hs.free_chunks, sizeof(uint8_t *));
        hs.free_chunks = c;
    }
    return base + SS_CHUNK_BYTES;
}

/* unit_find past the cache: probe the directory (and, with create, enter the unit). */
static ss_unit *unit_probe(uintptr_t unit, int create, ss_unit **cached) {
    if (hs.unit_capacity == 0) {
        if (!create || units_grow() < 0) {
            return NULL;
        }
    }
    size_t mask = hs.unit_capacity - 1;
    size_t i = unit_slot(unit, mask);
    while (hs.units[i].unit != unit) {
        if (hs.units[i].unit == 0) {
            if (!create) {
                return NULL;
            }
            if ((hs.units_used + 1) * 2 > hs.unit_capacity) {
                if (units_grow() < 0) {
                    return NULL;
                }
                return unit_probe(unit, create, cached);
            }
            uint8_t *chunk = chunk_new();
            if (chunk == NULL) {
                return NULL;
            }
            hs.units[i].unit = unit;
            hs.units[i].chunk = chunk;
            hs.units[i].live = 0;
            hs.units_used++;
            break;
        }
        i = (i + 1) & mask;
    }
    *cached = &hs.units[i];
    return *cached;
}

/* The unit's directory slot, or NULL (and, with create, a new one; NULL when out of memory). */
static inline ss_unit *unit_find(uintptr_t unit, int create) {
    ss_unit **cached = &hs.unit_cache[unit & (SS_UNIT_CACHE - 1)];
    if (*cached != NULL && (*cached)->unit == unit) {
        return *cached;
    }
    return unit_probe(unit, create, cached);
}

/* A unit with no counted block gives its chunk back and leaves the directory (backward-shift
 * deletion, as the table's). */
static void unit_drop(ss_unit *u) {
    memcpy(u->chunk, &hs.free_chunks, sizeof(uint8_t *));
    hs.free_chunks = u->chunk;
    size_t mask = hs.unit_capacity - 1;
    size_t i = (size_t)(u - hs.units);
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (hs.units[j].unit == 0) {
            break;
        }
        size_t home = unit_slot(hs.units[j].unit, mask);
        if (((j - home) & mask) >= ((j - i) & mask)) {
            hs.units[i] = hs.units[j];
            i = j;
        }
    }
    hs.units[i].unit = 0;
    hs.units[i].chunk = NULL;
    hs.units[i].live = 0;
    hs.units_used--;
}

/* Drop the units left empty, at a step end: dropping one as soon as it empties would make a
 * loop that allocates and frees one temporary in a pool of older blocks enter and drop its
 * unit each time.  A drop shifts later slots back into the dropped one, so it is checked
 * again; a slot shifted past the wrap-around lands in one already checked, whose units all
 * hold blocks. */
static void units_sweep(void) {
    for (size_t i = 0; i < hs.unit_capacity; i++) {
        while (hs.units[i].unit != 0 && hs.units[i].live == 0) {
            unit_drop(&hs.units[i]);
        }
    }
}

/* Enter a small block: 0, or -1 when the map had no memory (the caller uses the table). */
static inline int small_put(uintptr_t ptr, uint64_t size) {
    ss_unit *u = unit_find(ptr >> SS_UNIT_SHIFT, 1);
    if (u == NULL) {
        return -1;
    }
    uint8_t *cell = &u->chunk[(ptr >> 4) & (SS_CHUNK_BYTES - 1)];
    if (*cell == 0) {
        u->live++;
        hs.small_used++;
    } /* else: a pointer freed behind the hook's back, reused */
    *cell = (uint8_t)size;
    return 0;
}

/* Remove a small block; its size, or 0 when the map does not hold it. */
static inline uint64_t small_take(uintptr_t ptr) {
    if ((ptr & 15) != 0) {
        return 0;
    }
    ss_unit *u = unit_find(ptr >> SS_UNIT_SHIFT, 0);
    if (u == NULL) {
        return 0;
    }
    uint8_t *cell = &u->chunk[(ptr >> 4) & (SS_CHUNK_BYTES - 1)];
    uint64_t size = *cell;
    if (size != 0) {
        *cell = 0;
        hs.small_used--;
        u->live--; /* an empty unit stays until the step ends (units_sweep) */
    }
    return size;
}

/* Remember a block's size (with the sampled bit); -1 when it could not be entered. */
static inline int block_put(uintptr_t ptr, uint64_t entry) {
    if (entry >= 1 && entry <= SS_SMALL_MAX && (ptr & 15) == 0 && small_put(ptr, entry) == 0) {
        return 0;
    }
    return table_put(ptr, entry);
}

/* Forget a block; its entry, or UINT64_MAX when it was not remembered. */
static inline uint64_t block_take(uintptr_t ptr) {
    uint64_t size = small_take(ptr);
    return size != 0 ? size : (hs.used != 0 ? table_take(ptr) : UINT64_MAX);
}

/* -- sampling --------------------------------------------------------------------------------- */

static inline uint64_t next_random(void) {
    uint64_t x = hs.rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    hs.rng = x;
    return x * 0x2545F4914F6CDD1DULL;
}

static int64_t next_gap(void) {
    double u = ((double)(next_random() >> 11) + 0.5) / 9007199254740992.0; /* (0, 1) */
    double gap = -log(u) * hs.mean;
    return gap < 1.0 ? 1 : (int64_t)gap;
}

/* A slot for one event.  Samples stop at max_events per drain (dropped and counted); the frees
 * of sampled blocks are never capped (they are bounded by the samples alive): a lost free would
 * leave its sample alive forever in the reader's replay. */
static ss_event *new_event(int is_free) {
    if (hs.n_events >= hs.max_events && !is_free) {
        hs.dropped++;
        return NULL;
    }
    if (hs.n_events == hs.events_capacity) {
        size_t capacity = hs.events_capacity ? hs.events_capacity * 2 : 256;
        if (capacity > hs.max_events && !is_free) {
            capacity = hs.max_events;
        }
        ss_event *events = (ss_event *)realloc(hs.events, capacity * sizeof(ss_event));
        if (events == NULL) {
            if (is_free) {
                hs.lost_frees++;
            } else {
                hs.dropped++;
            }
            return NULL;
        }
        hs.events = events;
        hs.events_capacity = capacity;
    }
    return &hs.events[hs.n_events++];
}

/* Record a sample; 0 when it was dropped (its block is then not marked as sampled). */
static int record_sample(uintptr_t ptr, uint64_t size, double weight) {
    ss_event *e = new_event(0);
    if (e == NULL) {
        return 0;
    }
    hs.samples++;
    e->ptr = ptr;
    e->size = size;
    e->weight = weight;
    e->t_ns = ss_now_ns();
    int truncated = 0;
    int n = ss_walk_this_thread(e->codes, e->positions, SS_HOOK_FRAMES, &truncated);
    e->nframes = n < 0 ? 0 : n;
    for (int k = 0; k < e->nframes; k++) {
        Py_INCREF((PyObject *)e->codes[k]);
    }
    return 1;
}

static void record_free(uintptr_t ptr) {
    ss_event *e = new_event(1);
    if (e != NULL) {
        e->ptr = ptr;
        e->size = 0;
        e->weight = 0.0;
        e->t_ns = 0;
        e->nframes = 0;
    }
}

/* -- the hot path ----------------------------------------------------------------------------- */

static inline void on_alloc(void *p, size_t size) {
    uint64_t entry = (uint64_t)size;
    if (size >= hs.large) {
        if (record_sample((uintptr_t)p, size, (double)size)) {
            entry |= SS_SAMPLED_BIT;
        }
    } else {
        hs.countdown -= (int64_t)size;
        if (hs.countdown <= 0) {
            double chance = 1.0 - exp(-(double)size / hs.mean);
            if (record_sample((uintptr_t)p, size, chance > 0 ? (double)size / chance : hs.mean)) {
                entry |= SS_SAMPLED_BIT;
            }
            hs.countdown = next_gap();
        }
    }
    if (block_put((uintptr_t)p, entry) < 0) {
        return;
    }
    hs.current += (int64_t)size;
    hs.step_allocated += size;
    hs.step_allocs++;
    if (hs.current > hs.step_peak) {
        hs.step_peak = hs.current;
        hs.peak_mark = hs.first_seq + hs.n_events;
    }
    if (hs.current > hs.interval_peak) {
        hs.interval_peak = hs.current;
    }
}

static inline void on_free(void *p) {
    uint64_t entry = block_take((uintptr_t)p);
    if (entry == UINT64_MAX) {
        return;
    }
    uint64_t size = entry & ~SS_SAMPLED_BIT;
    hs.current -= (int64_t)size;
    hs.step_freed += size;
    hs.step_frees++;
    if (entry & SS_SAMPLED_BIT) {
        record_free((uintptr_t)p);
    }
}

/* From 3.12 a sub-interpreter may run under its own GIL, while the allocator hooks are shared
 * by the whole process: only the interpreter that started the hook (whose GIL guards the
 * table) is counted; the others pass through. */
static PyInterpreterState *hook_interp = NULL;

static inline int own_interpreter(void) {
#if PY_VERSION_HEX >= 0x030D0000
    PyThreadState *ts = PyThreadState_GetUnchecked();
    return ts != NULL && ts->interp == hook_interp;
#elif PY_VERSION_HEX >= 0x030C0000
    PyThreadState *ts = _PyThreadState_UncheckedGet();
    return ts != NULL && ts->interp == hook_interp;
#else
    return 1;
#endif
}

/* Allocations of a paused thread (stepscope's own work) are not counted; frees always are, so
 * a counted block freed during a pause leaves the table. */
static inline int counting(ss_layer *layer) { return layer->active && !paused && own_interpreter(); }

static inline int counting_frees(ss_layer *layer) { return layer->active && own_interpreter(); }

static void *hook_malloc(void *ctx, size_t size) {
    ss_layer *layer = (ss_layer *)ctx;
    void *p = layer->original.malloc(layer->original.ctx, size);
    if (p != NULL && counting(layer)) {
        on_alloc(p, size);
    }
    return p;
}

static void *hook_calloc(void *ctx, size_t nelem, size_t elsize) {
    ss_layer *layer = (ss_layer *)ctx;
    void *p = layer->original.calloc(layer->original.ctx, nelem, elsize);
    if (p != NULL && counting(layer)) {
        on_alloc(p, nelem * elsize);
    }
    return p;
}

static void *hook_realloc(void *ctx, void *ptr, size_t size) {
    ss_layer *layer = (ss_layer *)ctx;
    void *p = layer->original.realloc(layer->original.ctx, ptr, size);
    if (p != NULL && counting_frees(layer)) {
        if (ptr != NULL) {
            on_free(ptr);
        }
        if (!paused) {
            on_alloc(p, size);
        }
    }
    return p;
}

static void hook_free(void *ctx, void *ptr) {
    ss_layer *layer = (ss_layer *)ctx;
    if (ptr != NULL && counting_frees(layer)) {
        on_free(ptr);
    }
    layer->original.free(layer->original.ctx, ptr);
}

/* -- numpy's data allocations ------------------------------------------------------------------
 * numpy (>= 1.22) allocates array data through a handler, by default a static struct of its own
 * (PyDataMem_DefaultHandler, entry 306 of its C API table, layout version 1).  Its allocator
 * functions are swapped for these while the hook runs, so every context and thread that uses the
 * default handler is counted (PyDataMem_SetHandler would cover only the calling context).  numpy
 * may allocate without the GIL: such calls pass through uncounted.  Arrays made before or after
 * the swap reach the free they were made with: no block carries anything of the hook's. */
typedef struct {
    void *ctx;
    void *(*malloc)(void *ctx, size_t size);
    void *(*calloc)(void *ctx, size_t nelem, size_t elsize);
    void *(*realloc)(void *ctx, void *ptr, size_t new_size);
    void (*free)(void *ctx, void *ptr, size_t size);
} ss_numpy_allocator;

typedef struct {
    char name[127];
    uint8_t version;
    ss_numpy_allocator allocator;
} ss_numpy_handler;

static ss_numpy_handler *numpy_handler = NULL;
static ss_numpy_allocator numpy_original;
static int numpy_active = 0;

static inline int numpy_counting(void) {
    return numpy_active && PyGILState_Check() && own_interpreter();
}

static void *np_malloc(void *ctx, size_t size) {
    void *p = numpy_original.malloc(numpy_original.ctx, size);
    if (p != NULL && numpy_counting() && !paused) {
        on_alloc(p, size);
    }
    return p;
}

static void *np_calloc(void *ctx, size_t nelem, size_t elsize) {
    void *p = numpy_original.calloc(numpy_original.ctx, nelem, elsize);
    if (p != NULL && numpy_counting() && !paused) {
        on_alloc(p, nelem * elsize);
    }
    return p;
}

static void *np_realloc(void *ctx, void *ptr, size_t size) {
    void *p = numpy_original.realloc(numpy_original.ctx, ptr, size);
    if (p != NULL && numpy_counting()) {
        if (ptr != NULL) {
            on_free(ptr);
        }
        if (!paused) {
            on_alloc(p, size);
        }
    }
    return p;
}

static void np_free(void *ctx, void *ptr, size_t size) {
    if (ptr != NULL && numpy_counting()) {
        on_free(ptr);
    }
    numpy_original.free(numpy_original.ctx, ptr, size);
}

static void numpy_unhook(void) {
    if (numpy_handler != NULL) {
        numpy_active = 0;
        numpy_handler->allocator = numpy_original;
        numpy_handler = NULL;
    }
}

static PyObject *hook_numpy(PyObject *self, PyObject *api) {
    (void)self;
    if (current_layer < 0) {
        PyErr_SetString(PyExc_RuntimeError, "start the allocation hook before hooking numpy");
        return NULL;
    }
    if (numpy_handler != NULL) {
        Py_RETURN_TRUE;
    }
    void **table = (void **)PyCapsule_GetPointer(api, NULL);
    if (table == NULL) {
        return NULL;
    }
    PyObject *capsule = *(PyObject **)table[306];
    if (capsule == NULL || !PyCapsule_IsValid(capsule, "mem_handler")) {
        Py_RETURN_FALSE;
    }
    ss_numpy_handler *handler = (ss_numpy_handler *)PyCapsule_GetPointer(capsule, "mem_handler");
    if (handler == NULL || handler->version != 1 || handler->allocator.malloc == np_malloc) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    numpy_original = handler->allocator;
    numpy_handler = handler;
    ss_numpy_allocator ours = {NULL, np_malloc, np_calloc, np_realloc, np_free};
    handler->allocator = ours;
    numpy_active = 1;
    Py_RETURN_TRUE;
}

static const PyMemAllocatorDomain domains[2] = {PYMEM_DOMAIN_MEM, PYMEM_DOMAIN_OBJ};

static int is_ours(const PyMemAllocatorEx *a, ss_layer *layer) {
    return a->malloc == hook_malloc && a->ctx == (void *)layer;
}

/* -- the Python interface --------------------------------------------------------------------- */

/* Take the buffered events out of the buffer before any Python object is made or released:
 * that can run a collection whose frees record events (into a fresh buffer). */
static ss_event *detach_events(size_t *n) {
    ss_event *events = hs.events;
    *n = hs.n_events;
    hs.first_seq += hs.n_events;
    hs.events = NULL;
    hs.n_events = hs.events_capacity = 0;
    return events;
}

static void release_events(ss_event *events, size_t n) {
    for (size_t i = 0; i < n; i++) {
        for (int k = 0; k < events[i].nframes; k++) {
            Py_DECREF((PyObject *)events[i].codes[k]);
        }
    }
    free(events);
}

static void release_all(void) {
    paused++;
    ss_slot *slots = hs.slots;
    size_t capacity = hs.capacity;
    hs.slots = NULL;
    hs.capacity = hs.used = 0;
    slots_free(slots, capacity);
    units_release();
    size_t n;
    ss_event *events = detach_events(&n);
    release_events(events, n);
    while (hs.n_events) { /* frees recorded while releasing */
        events = detach_events(&n);
        release_events(events, n);
    }
    paused--;
}

static PyObject *hook_start(PyObject *self, PyObject *args) {
    (void)self;
    double mean;
    unsigned long long large, max_events, seed;
    if (!PyArg_ParseTuple(args, "dKKK", &mean, &large, &max_events, &seed)) {
        return NULL;
    }
#ifdef Py_GIL_DISABLED
    PyErr_SetString(PyExc_RuntimeError, "the allocation hook needs the GIL (free-threaded build)");
    return NULL;
#endif
    if (!ss_walk_available()) {
        PyErr_SetString(PyExc_RuntimeError, "the allocation hook reads frames on Python 3.11+ only");
        return NULL;
    }
    if (current_layer >= 0) {
        PyErr_SetString(PyExc_RuntimeError, "the allocation hook is already running");
        return NULL;
    }
    if (layers_used == SS_HOOK_LAYERS) {
        PyErr_SetString(PyExc_RuntimeError,
                        "the allocation hook was left in other hooks' chains too often to start again");
        return NULL;
    }
    if (!(mean >= 1.0) || max_events == 0) {
        PyErr_SetString(PyExc_ValueError, "mean must be >= 1 byte and max_events > 0");
        return NULL;
    }
    release_all();
    memset(&hs, 0, sizeof(hs));
    hs.mean = mean;
    hs.large = large;
    hs.max_events = (size_t)max_events;
    hs.rng = seed ? seed : 0x9E3779B97F4A7C15ULL;
    hs.countdown = next_gap();
    if (table_grow() < 0) {
        return PyErr_NoMemory();
    }
    hook_interp = PyInterpreterState_Get();
    int layer = layers_used++;
    for (int d = 0; d < 2; d++) {
        ss_layer *l = &layers[layer][d];
        PyMem_GetAllocator(domains[d], &l->original);
        l->active = 1;
        PyMemAllocatorEx hook = {l, hook_malloc, hook_calloc, hook_realloc, hook_free};
        PyMem_SetAllocator(domains[d], &hook);
    }
    current_layer = layer;
    Py_RETURN_NONE;
}

static PyObject *hook_stop(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    if (current_layer < 0) {
        Py_RETURN_NONE;
    }
    numpy_unhook();
    int restored = 1;
    for (int d = 0; d < 2; d++) {
        ss_layer *l = &layers[current_layer][d];
        PyMemAllocatorEx now;
        PyMem_GetAllocator(domains[d], &now);
        l->active = 0;
        if (is_ours(&now, l)) {
            PyMem_SetAllocator(domains[d], &l->original);
        } else {
            restored = 0; /* someone hooked after us: stay in their chain as a pass-through */
        }
    }
    if (restored) {
        layers_used = current_layer; /* the layer's slots can be used again */
    } else {
        passthrough_layers++;
    }
    current_layer = -1;
    release_all();
    return PyBool_FromLong(restored);
}

static PyObject *hook_end_step(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    PyObject *row = Py_BuildValue("{sLsLsKsKsKsKsK}", "current", (long long)hs.current, "peak",
                                  (long long)hs.step_peak, "allocated",
                                  (unsigned long long)hs.step_allocated, "freed",
                                  (unsigned long long)hs.step_freed, "allocs",
                                  (unsigned long long)hs.step_allocs, "frees",
                                  (unsigned long long)hs.step_frees, "peak_mark",
                                  (unsigned long long)hs.peak_mark);
    if (row != NULL) {
        units_sweep();
        hs.step_peak = hs.current;
        hs.step_allocated = hs.step_freed = hs.step_allocs = hs.step_frees = 0;
        hs.peak_mark = hs.first_seq + hs.n_events;
    }
    return row;
}

static PyObject *hook_poll(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    PyObject *out = Py_BuildValue("LL", (long long)hs.current, (long long)hs.interval_peak);
    hs.interval_peak = hs.current;
    return out;
}

static PyObject *hook_drain(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    paused++;
    unsigned long long first = (unsigned long long)hs.first_seq;
    size_t n;
    ss_event *events = detach_events(&n);
    PyObject *list = PyList_New((Py_ssize_t)n);
    PyObject *result = NULL;
    if (list == NULL) {
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        ss_event *e = &events[i];
        PyObject *frames = PyTuple_New(e->nframes);
        if (frames == NULL) {
            Py_DECREF(list);
            goto done;
        }
        for (int k = 0; k < e->nframes; k++) {
            PyObject *pair = Py_BuildValue("(Oi)", (PyObject *)e->codes[k], (int)e->positions[k]);
            if (pair == NULL) {
                Py_DECREF(frames);
                Py_DECREF(list);
                goto done;
            }
            PyTuple_SET_ITEM(frames, k, pair);
        }
        PyObject *item = Py_BuildValue("(KKdLN)", (unsigned long long)e->ptr,
                                       (unsigned long long)e->size, e->weight, (long long)e->t_ns,
                                       frames);
        if (item == NULL) {
            Py_DECREF(list);
            goto done;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    result = Py_BuildValue("(KN)", first, list);
done:
    release_events(events, n);
    paused--;
    return result;
}

static PyObject *hook_stats(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    size_t own = hs.capacity * sizeof(ss_slot) + hs.events_capacity * sizeof(ss_event) +
                 hs.unit_capacity * sizeof(ss_unit) + hs.slab_bytes;
    return Py_BuildValue("{sKsKsKsKsKsKsisn}", "own_bytes", (unsigned long long)own, "live_blocks",
                         (unsigned long long)(hs.used + hs.small_used), "untracked", (unsigned long long)hs.untracked,
                         "dropped", (unsigned long long)hs.dropped, "lost_frees",
                         (unsigned long long)hs.lost_frees, "samples",
                         (unsigned long long)hs.samples, "passthrough_layers", passthrough_layers,
                         "buffered", (Py_ssize_t)hs.n_events);
}

static PyObject *hook_pause(PyObject *self, PyObject *arg) {
    (void)self;
    int on = PyObject_IsTrue(arg);
    if (on < 0) {
        return NULL;
    }
    paused += on ? 1 : (paused > 0 ? -1 : 0);
    Py_RETURN_NONE;
}

static PyMethodDef hook_methods[] = {
    {"_alloc_hook_start", hook_start, METH_VARARGS,
     "Hook the MEM and OBJ domains: (mean_bytes, large_bytes, max_events, seed)."},
    {"_alloc_hook_stop", hook_stop, METH_NOARGS,
     "Unhook; True when the originals were restored, False when left as a pass-through."},
    {"_alloc_hook_end_step", hook_end_step, METH_NOARGS,
     "The closing step's exact counters; the next step starts from the current bytes."},
    {"_alloc_hook_poll", hook_poll, METH_NOARGS, "(current, highest since the last poll)."},
    {"_alloc_hook_drain", hook_drain, METH_NOARGS,
     "(first sequence number, [(ptr, size, weight, t_ns, frames)]), size 0 for a free."},
    {"_alloc_hook_stats", hook_stats, METH_NOARGS, "The hook's own memory, drops and samples."},
    {"_alloc_hook_numpy", hook_numpy, METH_O,
     "Count numpy's default data allocations too (its _ARRAY_API capsule); False if unsupported."},
    {"_alloc_hook_pause", hook_pause, METH_O,
     "Stop (True) or resume (False) counting this thread's allocations (nests)."},
    {NULL, NULL, 0, NULL},
};

int ss_alloc_hook_init(PyObject *module) { return PyModule_AddFunctions(module, hook_methods); }
