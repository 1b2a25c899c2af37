/* The sizes of the blocks the allocation hook counts (alloc_hook.c's, included there alone: its
 * hot path inlines these), so that a free, which names only a pointer, is counted with the size
 * its block was requested with.
 *
 * Small blocks (1-255 bytes, 16-byte aligned) have their size in a page map: one byte (a cell) per
 * 16 bytes of address space, in leaves that each cover 1 GiB of addresses (64 MiB of cells,
 * reserved address space whose pages become resident when first written, on huge pages where
 * the kernel gives them), found through a top level indexed by the address's high bits.  A
 * lookup is two dependent loads, the first almost always cached; neighbouring allocations
 * (pymalloc hands out a pool's blocks in order) touch neighbouring cells; the map's resident
 * memory is 1/16 of the address span its blocks sat in (counted with mincore) and stays until
 * the hook stops.  (A directory of 16 KiB units with 1 KiB chunks, recycled at step ends, was
 * measured at the same speed and took three times the code.)
 * Other blocks (larger, odd-aligned, empty, or with the sampled bit, which must travel with the
 * block) go to an open-addressing table (pointer -> entry, linear probing, backward-shift
 * deletion, 16 bytes per slot at most 70 % full).  All of it is mmap memory, never the hooked
 * domains.  The GIL guards it (the hook counts only with the GIL held). */
#ifndef STEPSCOPE_ALLOC_BLOCKS_H
#define STEPSCOPE_ALLOC_BLOCKS_H

#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct {
    uintptr_t ptr;
    uint64_t size; /* requested size; SS_SAMPLED_BIT set for sampled blocks */
} ss_slot;

#define SS_LEAF_SHIFT 30                                   /* 1 GiB of addresses per leaf */
#define SS_LEAF_CELLS ((size_t)1 << (SS_LEAF_SHIFT - 4))    /* one byte per 16-byte block */
#define SS_LEAVES ((size_t)1 << (48 - SS_LEAF_SHIFT))       /* user addresses below 2^48 */
#define SS_SMALL_MAX 255

static struct {
    ss_slot *slots;
    size_t capacity; /* a power of two, or 0 */
    size_t used;
    uint64_t untracked; /* blocks that could not be entered (the table could not grow) */
    uint8_t **leaves;   /* the page map's top level: a leaf of cells per GiB of addresses */
    size_t leaves_mapped;
    uint64_t small_used; /* blocks held in the page map */
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

/* Address space for a leaf of the page map: reserved, not committed (a page becomes resident
 * when first written), on huge pages where the kernel gives them, since neighbouring blocks'
 * cells are neighbours and one huge page covers 32 MiB of the heap. */
static void *map_reserved(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) {
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE);
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

/* A block's cell: leaves[ptr >> SS_LEAF_SHIFT] + (ptr >> 4) % SS_LEAF_CELLS; NULL past the
 * map's range or, without create, when the leaf is not mapped. */
static inline uint8_t *small_cell(uintptr_t ptr, int create) {
    uintptr_t leaf = ptr >> SS_LEAF_SHIFT;
    if (leaf >= SS_LEAVES || bs.leaves == NULL) {
        return NULL;
    }
    uint8_t *cells = bs.leaves[leaf];
    if (cells == NULL) {
        if (!create) {
            return NULL;
        }
        cells = (uint8_t *)map_reserved(SS_LEAF_CELLS);
        if (cells == NULL) {
            return NULL;
        }
        bs.leaves[leaf] = cells;
        bs.leaves_mapped++;
    }
    return &cells[(ptr >> 4) & (SS_LEAF_CELLS - 1)];
}

/* Enter a small block: 0, or -1 when the map had no memory (the caller uses the table). */
static inline int small_put(uintptr_t ptr, uint64_t size) {
    uint8_t *cell = small_cell(ptr, 1);
    if (cell == NULL) {
        return -1;
    }
    if (*cell == 0) {
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
    uint8_t *cell = small_cell(ptr, 0);
    if (cell == NULL) {
        return 0;
    }
    uint64_t size = *cell;
    if (size != 0) {
        *cell = 0;
        bs.small_used--;
    }
    return size;
}

/* The map's resident bytes (mincore over each mapped leaf; its pages stay resident once touched,
 * until the hook stops). */
static size_t small_resident_bytes(void) {
    if (bs.leaves == NULL) {
        return 0;
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t pages = SS_LEAF_CELLS / page;
    unsigned char *vec = (unsigned char *)malloc(pages);
    size_t bytes = (size_t)SS_LEAVES * sizeof(uint8_t *);
    for (size_t i = 0; vec != NULL && i < SS_LEAVES; i++) {
        if (bs.leaves[i] != NULL && mincore(bs.leaves[i], SS_LEAF_CELLS, vec) == 0) {
            for (size_t k = 0; k < pages; k++) {
                bytes += (vec[k] & 1) ? page : 0;
            }
        }
    }
    free(vec);
    return bytes;
}

static void small_release(void) {
    if (bs.leaves == NULL) {
        return;
    }
    for (size_t i = 0; i < SS_LEAVES; i++) {
        if (bs.leaves[i] != NULL) {
            munmap(bs.leaves[i], SS_LEAF_CELLS);
        }
    }
    munmap(bs.leaves, SS_LEAVES * sizeof(uint8_t *));
    bs.leaves = NULL;
    bs.leaves_mapped = 0;
    bs.small_used = 0;
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
    small_release();
}

/* Start empty, with a first table and the page map's top level; -1 when out of memory. */
static int blocks_start(void) {
    blocks_release();
    bs.leaves = (uint8_t **)map_zeroed(SS_LEAVES * sizeof(uint8_t *));
    if (bs.leaves == NULL) {
        return -1;
    }
    return table_grow();
}

/* The store's own bytes, and the blocks it holds. */
static size_t blocks_own_bytes(void) {
    return bs.capacity * sizeof(ss_slot) + small_resident_bytes();
}

static uint64_t blocks_live(void) { return bs.used + bs.small_used; }

#endif
