/* The index every native hash table shares (engine/_pair_set.c, engine/_cell_table.c,
 * engine/_user_codes.c; docs/design.md §8.4): entries live in dense columns, in insertion order,
 * and the index maps a 64-bit key (a packed pair or cell, a str's hash) to its entry — an
 * open-addressing table of uint32 slots (entry + 1; 0: empty), probed linearly from the key's
 * mixed top bits, at most half full, rebuilt from the dense keys when it grows. The caller
 * compares its own entries; this header holds what every table does alike: the key mixer, the
 * slot table's growth and prefetch, and the dense columns' growth.
 */
#ifndef STREAMFILTER_HASHTABLE_H
#define STREAMFILTER_HASHTABLE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    uint32_t *slots; /* NULL (no entry yet) or mask + 1 slots */
    size_t mask;
    int shift; /* 64 - log2(mask + 1): a key's first slot is its top bits, mixed */
} SfIndex;

/* the most entries an index holds (a slot holds entry + 1 <= INT32_MAX) */
#define SF_MAX_ENTRIES ((Py_ssize_t)INT32_MAX - 1)
#define SF_MIN_SLOTS 1024

/* A key's bits mixed so that its top bits depend on all of them (keys that differ only in low
 * bits — sequential codes — spread over the table). */
static inline uint64_t sf_mix(uint64_t x)
{
    x ^= x >> 32;
    x *= 0xD6E8FEB86659FD93ULL;
    x ^= x >> 29;
    return x;
}

static inline size_t sf_first_slot(const SfIndex *ix, int64_t key)
{
    return (size_t)(sf_mix((uint64_t)key) >> ix->shift);
}

static inline size_t sf_next_slot(const SfIndex *ix, size_t j) { return (j + 1) & ix->mask; }

/* Fetch the cache line of a key's first slot ahead of its look-up (a hint: no effect on the
 * result). A batch's look-ups land in random slots of an index larger than the caches, so each
 * would otherwise wait for memory in turn. A macro: GCC takes a function that only prefetches
 * for one with no effect and drops its calls. */
#define sf_prefetch_slot(ix, key) __builtin_prefetch(&(ix)->slots[sf_first_slot((ix), (key))])

/* Room in the index for ``need`` entries, at most half full: a larger slot table, filled again
 * from the ``count`` entries' keys (the int64 at ``keys + i * stride``). -1 with MemoryError,
 * the index unchanged. */
static inline int sf_index_fit(SfIndex *ix, Py_ssize_t need, const void *keys, size_t stride,
                               Py_ssize_t count)
{
    size_t slots = ix->slots == NULL ? 0 : ix->mask + 1;
    if (slots / 2 >= (size_t)need) return 0;
    size_t size = slots < SF_MIN_SLOTS ? SF_MIN_SLOTS : slots;
    while (size / 2 < (size_t)need) {
        if (size > SIZE_MAX / 2 / sizeof(uint32_t)) {
            PyErr_NoMemory();
            return -1;
        }
        size *= 2;
    }
    int bits = 0;
    while (((size_t)1 << bits) < size) bits++;
    uint32_t *table = PyMem_Calloc(size, sizeof(uint32_t));
    if (table == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyMem_Free(ix->slots);
    ix->slots = table;
    ix->mask = size - 1;
    ix->shift = 64 - bits;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t key;
        memcpy(&key, (const char *)keys + (size_t)i * stride, sizeof key);
        size_t j = sf_first_slot(ix, key);
        while (table[j] != 0) j = sf_next_slot(ix, j);
        table[j] = (uint32_t)(i + 1);
    }
    return 0;
}

static inline void sf_index_free(SfIndex *ix)
{
    PyMem_Free(ix->slots);
    ix->slots = NULL;
    ix->mask = 0;
    ix->shift = 0;
}

/* The index's bytes (sys.getsizeof). */
static inline size_t sf_index_bytes(const SfIndex *ix)
{
    return ix->slots == NULL ? 0 : (ix->mask + 1) * sizeof(uint32_t);
}

/* Grow a dense column to ``capacity`` entries of ``size`` bytes; the pointer is updated only on
 * success, so a failure leaves the column as it was. -1 with MemoryError. */
static inline int sf_grow(void **column, Py_ssize_t capacity, size_t size)
{
    if ((size_t)capacity > SIZE_MAX / size) {
        PyErr_NoMemory();
        return -1;
    }
    void *p = PyMem_Realloc(*column, (size_t)capacity * size);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *column = p;
    return 0;
}

/* A column's next capacity for ``need`` entries: at least ``least``, and ``capacity /
 * fraction`` more than now (amortised O(1) copies; large columns are mapped apart, so realloc
 * moves their pages without copying), at most ``most``. */
static inline Py_ssize_t sf_grown(Py_ssize_t capacity, Py_ssize_t need, Py_ssize_t least,
                                  Py_ssize_t most, Py_ssize_t fraction)
{
    capacity = capacity < least ? least : capacity;
    Py_ssize_t more = capacity > most - capacity / fraction ? most : capacity + capacity / fraction;
    return need > more ? need : more;
}

#endif
