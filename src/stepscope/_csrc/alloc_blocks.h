/* The sizes of the blocks the allocation hook counts (alloc_hook.c's, included there alone: its
 * hot path inlines these), so that a free, which names only a pointer, is counted with the size
 * its block was requested with.
 *
 * Small blocks (1-255 bytes, 16-byte aligned) have their size in a page map: one byte per 16
 * bytes of address space, in chunks of 1 KiB that each cover a 16 KiB unit of addresses (a
 * pymalloc pool), found through a small open-addressing directory keyed by the unit's number;
 * a chunk is recycled when its unit holds no counted block at a step end.  Neighbouring
 * allocations (pymalloc hands out a pool's blocks in order) touch the same chunk, so the common
 * case is a cached compare and a byte store, and the map's memory is at most 1/16 of the units
 * its blocks sit in.
 * Other blocks (larger, odd-aligned, empty, or with the sampled bit, which must travel with the
 * block) go to an open-addressing table (pointer -> entry, linear probing, backward-shift
 * deletion, 16 bytes per slot at most 70 % full).  All of it is mmap memory, never the hooked
 * domains.  The GIL guards it (the hook counts only with the GIL held). */
#ifndef STEPSCOPE_ALLOC_BLOCKS_H
#define STEPSCOPE_ALLOC_BLOCKS_H

#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

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
} bs;

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
    size_t capacity = bs.capacity ? bs.capacity * 2 : 4096;
    ss_slot *slots = slots_new(capacity);
    if (slots == NULL) {
        return -1;
    }
    size_t mask = capacity - 1;
    for (size_t i = 0; i < bs.capacity; i++) {
        if (bs.slots[i].ptr != 0) {
            size_t j = slot_of(bs.slots[i].ptr, mask);
            while (slots[j].ptr != 0) {
                j = (j + 1) & mask;
            }
            slots[j] = bs.slots[i];
        }
    }
    slots_free(bs.slots, bs.capacity);
    bs.slots = slots;
    bs.capacity = capacity;
    return 0;
}

static inline int table_put(uintptr_t ptr, uint64_t size) {
    if ((bs.used + 1) * 10 > bs.capacity * 7 && table_grow() < 0) {
        bs.untracked++;
        return -1;
    }
    size_t mask = bs.capacity - 1;
    size_t i = slot_of(ptr, mask);
    while (bs.slots[i].ptr != 0) {
        if (bs.slots[i].ptr == ptr) { /* a pointer freed behind the hook's back, reused */
            bs.slots[i].size = size;
            return 0;
        }
        i = (i + 1) & mask;
    }
    bs.slots[i].ptr = ptr;
    bs.slots[i].size = size;
    bs.used++;
    return 0;
}

/* Remove ptr; its size (with the sampled bit) or UINT64_MAX when it was not in the table. */
static inline uint64_t table_take(uintptr_t ptr) {
    if (bs.capacity == 0) {
        return UINT64_MAX;
    }
    size_t mask = bs.capacity - 1;
    size_t i = slot_of(ptr, mask);
    while (bs.slots[i].ptr != ptr) {
        if (bs.slots[i].ptr == 0) {
            return UINT64_MAX;
        }
        i = (i + 1) & mask;
    }
    uint64_t size = bs.slots[i].size;
    /* backward-shift deletion keeps every probe chain unbroken without tombstones */
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (bs.slots[j].ptr == 0) {
            break;
        }
        size_t home = slot_of(bs.slots[j].ptr, mask);
        if (((j - home) & mask) >= ((j - i) & mask)) {
            bs.slots[i] = bs.slots[j];
            i = j;
        }
    }
    bs.slots[i].ptr = 0;
    bs.used--;
    return size;
}

/* -- the page map of small blocks ------------------------------------------------------------- */

static inline size_t unit_slot(uintptr_t unit, size_t mask) {
    return (size_t)(((uint64_t)unit * 0x9E3779B97F4A7C15ULL) >> 32) & mask;
}

static int units_grow(void) {
    size_t capacity = bs.unit_capacity ? bs.unit_capacity * 2 : 1024;
    ss_unit *units = (ss_unit *)map_zeroed(capacity * sizeof(ss_unit));
    if (units == NULL) {
        return -1;
    }
    size_t mask = capacity - 1;
    for (size_t i = 0; i < bs.unit_capacity; i++) {
        if (bs.units[i].unit != 0) {
            size_t j = unit_slot(bs.units[i].unit, mask);
            while (units[j].unit != 0) {
                j = (j + 1) & mask;
            }
            units[j] = bs.units[i];
        }
    }
    if (bs.units != NULL) {
        munmap(bs.units, bs.unit_capacity * sizeof(ss_unit));
    }
    bs.units = units;
    bs.unit_capacity = capacity;
    memset(bs.unit_cache, 0, sizeof(bs.unit_cache));
    return 0;
}

static void units_release(void) {
    if (bs.units != NULL) {
        munmap(bs.units, bs.unit_capacity * sizeof(ss_unit));
    }
    bs.units = NULL;
    bs.unit_capacity = bs.units_used = 0;
    bs.small_used = 0;
    memset(bs.unit_cache, 0, sizeof(bs.unit_cache));
    bs.free_chunks = NULL;
    while (bs.slabs != NULL) {
        ss_slab *slab = bs.slabs;
        bs.slabs = slab->next;
        munmap(slab, slab->bytes);
    }
    bs.slab_bytes = 0;
}

/* A zeroed chunk: a recycled one, or the next of a fresh slab (whose first chunk holds the
 * slab's header). */
static uint8_t *chunk_new(void) {
    uint8_t *chunk = bs.free_chunks;
    if (chunk != NULL) {
        memcpy(&bs.free_chunks, chunk, sizeof(uint8_t *));
        memset(chunk, 0, sizeof(void *));
        return chunk;
    }
    size_t bytes = (size_t)SS_SLAB_CHUNKS * SS_CHUNK_BYTES;
    ss_slab *slab = (ss_slab *)map_zeroed(bytes);
    if (slab == NULL) {
        return NULL;
    }
    slab->next = bs.slabs;
    slab->bytes = bytes;
    bs.slabs = slab;
    bs.slab_bytes += bytes;
    uint8_t *base = (uint8_t *)slab;
    for (size_t k = SS_SLAB_CHUNKS - 1; k >= 2; k--) { /* chunk 0 is the header's */
        uint8_t *c = base + k * SS_CHUNK_BYTES;
        memcpy(c, &bs.free_chunks, sizeof(uint8_t *));
        bs.free_chunks = c;
    }
    return base + SS_CHUNK_BYTES;
}

/* unit_find past the cache: probe the directory (and, with create, enter the unit). */
static ss_unit *unit_probe(uintptr_t unit, int create, ss_unit **cached) {
    if (bs.unit_capacity == 0) {
        if (!create || units_grow() < 0) {
            return NULL;
        }
    }
    size_t mask = bs.unit_capacity - 1;
    size_t i = unit_slot(unit, mask);
    while (bs.units[i].unit != unit) {
        if (bs.units[i].unit == 0) {
            if (!create) {
                return NULL;
            }
            if ((bs.units_used + 1) * 2 > bs.unit_capacity) {
                if (units_grow() < 0) {
                    return NULL;
                }
                return unit_probe(unit, create, cached);
            }
            uint8_t *chunk = chunk_new();
            if (chunk == NULL) {
                return NULL;
            }
            bs.units[i].unit = unit;
            bs.units[i].chunk = chunk;
            bs.units[i].live = 0;
            bs.units_used++;
            break;
        }
        i = (i + 1) & mask;
    }
    *cached = &bs.units[i];
    return *cached;
}

/* The unit's directory slot, or NULL (and, with create, a new one; NULL when out of memory). */
static inline ss_unit *unit_find(uintptr_t unit, int create) {
    ss_unit **cached = &bs.unit_cache[unit & (SS_UNIT_CACHE - 1)];
    if (*cached != NULL && (*cached)->unit == unit) {
        return *cached;
    }
    return unit_probe(unit, create, cached);
}

/* A unit with no counted block gives its chunk back and leaves the directory (backward-shift
 * deletion, as the table's). */
static void unit_drop(ss_unit *u) {
    memcpy(u->chunk, &bs.free_chunks, sizeof(uint8_t *));
    bs.free_chunks = u->chunk;
    size_t mask = bs.unit_capacity - 1;
    size_t i = (size_t)(u - bs.units);
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (bs.units[j].unit == 0) {
            break;
        }
        size_t home = unit_slot(bs.units[j].unit, mask);
        if (((j - home) & mask) >= ((j - i) & mask)) {
            bs.units[i] = bs.units[j];
            i = j;
        }
    }
    bs.units[i].unit = 0;
    bs.units[i].chunk = NULL;
    bs.units[i].live = 0;
    bs.units_used--;
}

/* Drop the units left empty, at a step end: dropping one as soon as it empties would make a
 * loop that allocates and frees one temporary in a pool of older blocks enter and drop its
 * unit each time.  A drop shifts later slots back into the dropped one, so it is checked
 * again; a slot shifted past the wrap-around lands in one already checked, whose units all
 * hold blocks. */
static void units_sweep(void) {
    for (size_t i = 0; i < bs.unit_capacity; i++) {
        while (bs.units[i].unit != 0 && bs.units[i].live == 0) {
            unit_drop(&bs.units[i]);
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
        bs.small_used++;
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
        bs.small_used--;
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
    return size != 0 ? size : (bs.used != 0 ? table_take(ptr) : UINT64_MAX);
}

/* Forget every block and give the store's memory back. */
static void blocks_release(void) {
    slots_free(bs.slots, bs.capacity);
    bs.slots = NULL;
    bs.capacity = bs.used = 0;
    bs.untracked = 0;
    units_release();
}

/* Start empty, with a first table; -1 when out of memory. */
static int blocks_start(void) {
    blocks_release();
    return table_grow();
}

/* The store's own bytes, and the blocks it holds. */
static size_t blocks_own_bytes(void) {
    return bs.capacity * sizeof(ss_slot) + bs.unit_capacity * sizeof(ss_unit) + bs.slab_bytes;
}

static uint64_t blocks_live(void) { return bs.used + bs.small_used; }

#endif
