/* Native table of the open day's (user, coordinate) cells and their exact sums (engine/records.py,
 * DayAccumulator; docs/design.md §2.2: a cell's value is the exact sum of its values, rounded
 * once to the nearest float64).
 *
 * CellTable() holds one exact accumulator per cell, with no Python object kept per cell or value:
 *   add(cells, values): ``cells`` an int64 buffer of non-negative packed cells (the user's dense
 *       code above bit 31, the coordinate's code below: records._cell), ``values`` a float64
 *       buffer of the same length, or None for 1.0 each (a category hit); value i is added to
 *       cell i, a new cell created at its first value;
 *   users_present(n), coords_present(n) -> bytearray of n bytes: 1 where a cell has that user
 *       (coordinate) code; a code >= n is a ValueError;
 *   records(user_rank, coord_rank) -> (user_pos, coord, value) bytearrays of int64, int64 and
 *       float64, one entry per cell, ordered by (user_rank[user], coord_rank[coord]): user_pos is
 *       the user's rank, coord the coordinate's rank, value the cell's exact sum rounded once
 *       (an exact zero is +0.0; math.fsum's result, nan where fsum raises ValueError). Every
 *       cell's codes must have ranks in [0, len(user_rank)) and [0, len(coord_rank)), and no
 *       two cells may share both ranks (ValueError);
 *   reserve(cells): room for that many more cells, allocated at once (a size hint);
 *   len() (cells), nbytes (bytes allocated), clear().
 *
 * The accumulator is engine/exact_sums.py's fixed point, held in one signed 192-bit integer
 * (three 64-bit words, two's complement): a value with |x| < 2^40 and no bit below 2^-87 is the
 * integer x * 2^87 (below 2^127 in magnitude), so integer addition is exact and 2^64 values fit
 * before any overflow. Any other value (tiny, huge, inf, nan; never one the contract accepts
 * above 1e12) is kept aside with its cell, and that cell's value is math.fsum of the
 * accumulator's exact terms and those values. Rounding takes the magnitude's top 64 bits with a
 * sticky bit for everything below them through one uint64 -> double conversion (round to
 * nearest even: the sticky bit lies below the rounding position), then scales by a power of two
 * (exact: the result is at least 2^-87 in magnitude, far from the subnormals).
 *
 * Layout: the cells in insertion order (key + accumulator, 32 bytes) and a slot table of uint32
 * (0: empty, else the cell's index + 1), a power of two at most half full, probed linearly from
 * the key's mixed top bits, each batch's slots fetched ahead. ``add`` checks the whole batch and
 * reserves room for it before changing anything: an error leaves the table as it was. At most
 * 2**31 - 2 cells.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "hashtable.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned __int128 u128;

typedef struct {
    int64_t key;  /* the packed cell */
    uint64_t lo;  /* the accumulator, two's complement: lo + mid * 2^64 + hi * 2^128 */
    uint64_t mid;
    int64_t hi;
} Cell;

typedef struct {
    int64_t cell; /* index of the cell */
    double value;
} Aside;

typedef struct {
    PyObject_HEAD
    Cell *cells;
    Py_ssize_t count;
    Py_ssize_t capacity;
    uint8_t *has_aside; /* one bit per cell: it has values kept aside */
    Aside *aside;
    Py_ssize_t aside_count;
    Py_ssize_t aside_capacity;
    SfIndex index; /* key -> cell (hashtable.h) */
} CellTable;

#define MAX_CELLS SF_MAX_ENTRIES
#define MIN_CAPACITY 256
#define PREFETCH_AHEAD 16
#define FRACTION_BITS 87
#define COORD_BITS 31

static PyObject *fsum; /* math.fsum */

/* ``v`` is held exactly by the fixed point: |v| < 2^40 (not inf or nan) and no bit below 2^-87
 * (v * 2^87, an exact power-of-two scaling, is an integer). */
static inline int fits(double v)
{
    double m = fabs(v);
    return m < 0x1p40 && m * 0x1p87 == floor(m * 0x1p87);
}

/* The fixed point of ``v`` (magnitude ``*n``, sign ``*negative``); 0 when it does not fit. */
static inline int to_fixed(double v, u128 *n, int *negative)
{
    if (!fits(v)) return 0;
    double s = fabs(v) * 0x1p87;
    *negative = signbit(v) != 0;
    if (s == 0.0) {
        *n = 0;
        return 1;
    }
    int e;
    double f = frexp(s, &e);                 /* s = f * 2^e, 0.5 <= f < 1 */
    uint64_t mant = (uint64_t)ldexp(f, 53); /* exact */
    int shift = e - 53;
    *n = shift >= 0 ? (u128)mant << shift : (u128)(mant >> -shift); /* s is an integer */
    return 1;
}

static inline void accumulate(Cell *c, u128 n, int negative)
{
    u128 low = ((u128)c->mid << 64) | c->lo;
    u128 sum;
    if (!negative) {
        sum = low + n;
        c->hi += sum < low;
    } else {
        sum = low - n;
        c->hi -= low < n;
    }
    c->lo = (uint64_t)sum;
    c->mid = (uint64_t)(sum >> 64);
}

/* The accumulator's magnitude as three words (least significant first); its sign returned. */
static inline int magnitude(const Cell *c, uint64_t w[3])
{
    int negative = c->hi < 0;
    if (!negative) {
        w[0] = c->lo;
        w[1] = c->mid;
        w[2] = (uint64_t)c->hi;
    } else { /* two's complement: ~x + 1 */
        w[0] = ~c->lo + 1;
        uint64_t carry = w[0] == 0;
        w[1] = ~c->mid + carry;
        carry = carry && w[1] == 0;
        w[2] = ~(uint64_t)c->hi + carry;
    }
    return negative;
}

/* The accumulator's value rounded once to the nearest double (ties to even); +0.0 for zero. */
static double round_cell(const Cell *c)
{
    uint64_t w[3];
    int negative = magnitude(c, w);
    int length = w[2]   ? 128 + 64 - __builtin_clzll(w[2])
                 : w[1] ? 64 + 64 - __builtin_clzll(w[1])
                 : w[0] ? 64 - __builtin_clzll(w[0])
                        : 0;
    if (length == 0) return 0.0;
    int shift = length > 64 ? length - 64 : 0; /* the top 64 bits start here */
    int q = shift / 64, r = shift % 64;
    uint64_t word = r ? (w[q] >> r) | (q + 1 < 3 ? w[q + 1] << (64 - r) : 0) : w[q];
    uint64_t sticky = r ? (w[q] & ((1ULL << r) - 1)) != 0 : 0;
    for (int k = 0; k < q; k++) sticky |= w[k] != 0;
    /* 2^(shift - 87) from its bits: shift - 87 lies in [-87, 41], a normal exponent, so the
     * product is exact */
    union {
        uint64_t bits;
        double d;
    } scale = {.bits = (uint64_t)(1023 + shift - FRACTION_BITS) << 52};
    double d = (double)(word | sticky) * scale.d;
    return negative ? -d : d;
}

/* A cell with values aside: math.fsum of its accumulator's exact terms (48-bit pieces) and
 * those values, + 0.0; nan where fsum raises ValueError (inf + -inf). */
static int fsum_cell(const Cell *c, const Aside *aside, Py_ssize_t n_aside, double *out)
{
    uint64_t w[3];
    int negative = magnitude(c, w);
    PyObject *terms = PyList_New(0);
    if (terms == NULL) return -1;
    for (int k = 0; k < 4; k++) { /* bits [48k, 48k + 48) of the magnitude */
        int bit = 48 * k, q = bit / 64, r = bit % 64;
        uint64_t piece = (w[q] >> r) | (r > 16 && q + 1 < 3 ? w[q + 1] << (64 - r) : 0);
        piece &= (1ULL << 48) - 1;
        double term = ldexp((double)piece, bit - FRACTION_BITS);
        PyObject *t = PyFloat_FromDouble(negative ? -term : term);
        if (t == NULL || PyList_Append(terms, t) < 0) {
            Py_XDECREF(t);
            Py_DECREF(terms);
            return -1;
        }
        Py_DECREF(t);
    }
    for (Py_ssize_t i = 0; i < n_aside; i++) {
        PyObject *t = PyFloat_FromDouble(aside[i].value);
        if (t == NULL || PyList_Append(terms, t) < 0) {
            Py_XDECREF(t);
            Py_DECREF(terms);
            return -1;
        }
        Py_DECREF(t);
    }
    PyObject *sum = PyObject_CallOneArg(fsum, terms);
    Py_DECREF(terms);
    if (sum == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_ValueError)) return -1;
        PyErr_Clear();
        *out = NAN;
        return 0;
    }
    *out = PyFloat_AsDouble(sum) + 0.0;
    Py_DECREF(sum);
    return PyErr_Occurred() ? -1 : 0;
}

/* Room for ``cells`` more cells and ``aside`` more values kept aside, the slot table at most
 * half full with them all; -1 with an exception, the table unchanged. */
static int reserve(CellTable *self, Py_ssize_t cells, Py_ssize_t aside)
{
    if (cells > MAX_CELLS - self->count) {
        PyErr_SetString(PyExc_OverflowError, "CellTable: more than 2**31 - 2 cells");
        return -1;
    }
    Py_ssize_t need = self->count + cells;
    if (need > self->capacity) {
        Py_ssize_t capacity = sf_grown(self->capacity, need, MIN_CAPACITY, MAX_CELLS, 4);
        Py_ssize_t old_bytes = (self->capacity + 7) / 8, bytes = (capacity + 7) / 8;
        if (sf_grow((void **)&self->cells, capacity, sizeof(Cell)) < 0 ||
            sf_grow((void **)&self->has_aside, bytes, 1) < 0)
            return -1;
        memset(self->has_aside + old_bytes, 0, (size_t)(bytes - old_bytes));
        self->capacity = capacity;
    }
    if (aside > PY_SSIZE_T_MAX / 2 - self->aside_count) {
        PyErr_NoMemory();
        return -1;
    }
    if (self->aside_count + aside > self->aside_capacity) {
        Py_ssize_t capacity = sf_grown(self->aside_capacity, self->aside_count + aside, 16,
                                       PY_SSIZE_T_MAX / 2, 4);
        if (sf_grow((void **)&self->aside, capacity, sizeof(Aside)) < 0) return -1;
        self->aside_capacity = capacity;
    }
    const int64_t *keys = self->count > 0 ? &self->cells[0].key : NULL;
    return sf_index_fit(&self->index, need, keys, sizeof(Cell), self->count);
}

static void release(CellTable *self)
{
    PyMem_Free(self->cells);
    PyMem_Free(self->has_aside);
    PyMem_Free(self->aside);
    sf_index_free(&self->index);
    self->cells = NULL;
    self->has_aside = NULL;
    self->aside = NULL;
    self->count = self->capacity = self->aside_count = self->aside_capacity = 0;
}

/* ``obj``'s buffer: 1-D, C-contiguous, of ``kind`` ('i': signed integers, 'd': doubles) of 8
 * bytes in native order; -1 with an exception (the buffer not held). */
static int buffer_of(PyObject *obj, Py_buffer *view, char kind, const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    const uint16_t one = 1;
    const char native = *(const char *)&one ? '<' : '>';
    const char *f = view->format != NULL ? view->format : "B";
    if (*f == '@' || *f == '=' || *f == native || (native == '>' && *f == '!')) f++;
    int ok = kind == 'd' ? *f == 'd' : (*f == 'l' || *f == 'q');
    if (!ok || f[1] != '\0' || view->itemsize != 8 || view->ndim != 1) {
        PyErr_Format(PyExc_TypeError, "CellTable: %s must be a 1-D C-contiguous %s buffer", what,
                     kind == 'd' ? "float64" : "int64");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *CellTable_add(CellTable *self, PyObject *args)
{
    PyObject *cells_obj, *values_obj;
    if (!PyArg_ParseTuple(args, "OO:add", &cells_obj, &values_obj)) return NULL;
    Py_buffer cv, vv = {0};
    if (buffer_of(cells_obj, &cv, 'i', "cells") < 0) return NULL;
    int ones = values_obj == Py_None;
    if (!ones && buffer_of(values_obj, &vv, 'd', "values") < 0) {
        PyBuffer_Release(&cv);
        return NULL;
    }
    Py_ssize_t n = cv.shape[0];
    const int64_t *keys = cv.buf;
    const double *values = ones ? NULL : vv.buf;
    PyObject *result = NULL;
    if (!ones && vv.shape[0] != n) {
        PyErr_SetString(PyExc_ValueError, "CellTable.add: cells and values differ in length");
        goto done;
    }
    /* check everything and count the values kept aside before changing anything */
    Py_ssize_t aside = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (keys[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "CellTable.add: a cell is negative");
            goto done;
        }
        if (!ones && !fits(values[i])) aside++;
    }
    if (reserve(self, n, aside) < 0) goto done; /* the worst case: every cell new */
    u128 one_fixed = (u128)1 << FRACTION_BITS;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + PREFETCH_AHEAD < n) sf_prefetch_slot(&self->index, keys[i + PREFETCH_AHEAD]);
        int64_t key = keys[i];
        size_t j = sf_first_slot(&self->index, key);
        Py_ssize_t at;
        for (;;) {
            uint32_t s = self->index.slots[j];
            if (s == 0) { /* a new cell */
                at = self->count++;
                self->index.slots[j] = (uint32_t)(at + 1);
                Cell *c = &self->cells[at];
                c->key = key;
                c->lo = c->mid = 0;
                c->hi = 0;
                break;
            }
            if (self->cells[s - 1].key == key) {
                at = (Py_ssize_t)s - 1;
                break;
            }
            j = sf_next_slot(&self->index, j);
        }
        if (ones) {
            accumulate(&self->cells[at], one_fixed, 0);
            continue;
        }
        u128 m;
        int negative;
        if (to_fixed(values[i], &m, &negative)) {
            accumulate(&self->cells[at], m, negative);
        } else {
            self->aside[self->aside_count].cell = at;
            self->aside[self->aside_count].value = values[i];
            self->aside_count++;
            self->has_aside[at / 8] |= (uint8_t)(1u << (at % 8));
        }
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&cv);
    if (!ones) PyBuffer_Release(&vv);
    return result;
}

/* 1 per code (user: shift 31, mask none; coordinate: shift 0, mask 2^31 - 1) held by a cell. */
static PyObject *present(CellTable *self, PyObject *args, int user)
{
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "n", &n)) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "CellTable: n must be >= 0");
        return NULL;
    }
    PyObject *out = PyByteArray_FromStringAndSize(NULL, n);
    if (out == NULL) return NULL;
    uint8_t *mark = (uint8_t *)PyByteArray_AS_STRING(out);
    memset(mark, 0, (size_t)n);
    for (Py_ssize_t i = 0; i < self->count; i++) {
        int64_t key = self->cells[i].key;
        int64_t code = user ? key >> COORD_BITS : key & (((int64_t)1 << COORD_BITS) - 1);
        if (code >= n) {
            Py_DECREF(out);
            PyErr_Format(PyExc_ValueError, "CellTable: a cell's %s code is >= %zd",
                         user ? "user" : "coordinate", n);
            return NULL;
        }
        mark[code] = 1;
    }
    return out;
}

static PyObject *CellTable_users_present(CellTable *self, PyObject *args)
{
    return present(self, args, 1);
}

static PyObject *CellTable_coords_present(CellTable *self, PyObject *args)
{
    return present(self, args, 0);
}

static inline int64_t rank_of(const CellTable *self, const int64_t *user_rank, Py_ssize_t i)
{
    return user_rank[self->cells[i].key >> COORD_BITS];
}

static int by_cell(const void *a, const void *b)
{
    int64_t x = ((const Aside *)a)->cell, y = ((const Aside *)b)->cell;
    return (x > y) - (x < y);
}

static PyObject *CellTable_records(CellTable *self, PyObject *args)
{
    PyObject *user_obj, *coord_obj;
    if (!PyArg_ParseTuple(args, "OO:records", &user_obj, &coord_obj)) return NULL;
    Py_buffer uv, kv;
    if (buffer_of(user_obj, &uv, 'i', "user_rank") < 0) return NULL;
    if (buffer_of(coord_obj, &kv, 'i', "coord_rank") < 0) {
        PyBuffer_Release(&uv);
        return NULL;
    }
    const int64_t *user_rank = uv.buf, *coord_rank = kv.buf;
    Py_ssize_t n_users = uv.shape[0], n_coords = kv.shape[0], n = self->count;
    PyObject *pos_out = NULL, *coord_out = NULL, *value_out = NULL, *result = NULL;
    Py_ssize_t *start = NULL;
    int64_t mask = ((int64_t)1 << COORD_BITS) - 1;
    /* every cell's ranks in range */
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t u = self->cells[i].key >> COORD_BITS, k = self->cells[i].key & mask;
        if (u >= n_users || k >= n_coords || user_rank[u] < 0 || user_rank[u] >= n_users ||
            coord_rank[k] < 0 || coord_rank[k] >= n_coords) {
            PyErr_SetString(PyExc_ValueError, "CellTable.records: a cell's code has no rank");
            goto done;
        }
    }
    /* counting sort by the user's rank: one pass over the cells in memory order, each cell's
     * ranks and value written straight to its place; then each user's few cells sorted by
     * coordinate rank in place */
    start = PyMem_Calloc((size_t)n_users + 1, sizeof(Py_ssize_t));
    if (start == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + PREFETCH_AHEAD < n)
            __builtin_prefetch(&start[rank_of(self, user_rank, i + PREFETCH_AHEAD) + 1], 1);
        start[rank_of(self, user_rank, i) + 1]++;
    }
    for (Py_ssize_t r = 0; r < n_users; r++) start[r + 1] += start[r];
    pos_out = PyByteArray_FromStringAndSize(NULL, n * 8);
    coord_out = PyByteArray_FromStringAndSize(NULL, n * 8);
    value_out = PyByteArray_FromStringAndSize(NULL, n * 8);
    if (pos_out == NULL || coord_out == NULL || value_out == NULL) goto done;
    int64_t *pos = (int64_t *)PyByteArray_AS_STRING(pos_out);
    int64_t *coord = (int64_t *)PyByteArray_AS_STRING(coord_out);
    double *value = (double *)PyByteArray_AS_STRING(value_out);
    if (self->aside_count > 1) qsort(self->aside, (size_t)self->aside_count, sizeof(Aside), by_cell);
    Py_ssize_t a = 0; /* the aside values are in cell order: one sweep along the cells */
    for (Py_ssize_t i = 0; i < n; i++) {
        /* the run's next place is fetched 2 * PREFETCH_AHEAD cells ahead, the value's and
         * coordinate's slots there PREFETCH_AHEAD ahead (a random write each otherwise) */
        if (i + 2 * PREFETCH_AHEAD < n)
            __builtin_prefetch(&start[rank_of(self, user_rank, i + 2 * PREFETCH_AHEAD)], 1);
        if (i + PREFETCH_AHEAD < n) {
            Py_ssize_t ahead = start[rank_of(self, user_rank, i + PREFETCH_AHEAD)];
            __builtin_prefetch(&coord[ahead], 1);
            __builtin_prefetch(&value[ahead], 1);
        }
        const Cell *c = &self->cells[i];
        int64_t r = user_rank[c->key >> COORD_BITS];
        Py_ssize_t p = start[r]++;
        coord[p] = coord_rank[c->key & mask];
        if (!(self->has_aside[i / 8] & (1u << (i % 8)))) {
            value[p] = round_cell(c);
            continue;
        }
        Py_ssize_t first = a;
        while (a < self->aside_count && self->aside[a].cell == i) a++;
        if (fsum_cell(c, self->aside + first, a - first, &value[p]) < 0) goto done;
    }
    /* start[r] is now the end of rank r's run */
    for (Py_ssize_t r = 0; r < n_users; r++) {
        Py_ssize_t lo = r == 0 ? 0 : start[r - 1], hi = start[r];
        for (Py_ssize_t p = lo; p < hi; p++) pos[p] = r;
        for (Py_ssize_t p = lo + 1; p < hi; p++) { /* insertion sort: a user has few cells */
            int64_t ck = coord[p];
            double v = value[p];
            Py_ssize_t q = p;
            while (q > lo && coord[q - 1] > ck) {
                coord[q] = coord[q - 1];
                value[q] = value[q - 1];
                q--;
            }
            if (q > lo && coord[q - 1] == ck) {
                PyErr_SetString(PyExc_ValueError, "CellTable.records: two cells share ranks");
                goto done;
            }
            coord[q] = ck;
            value[q] = v;
        }
    }
    result = PyTuple_Pack(3, pos_out, coord_out, value_out);
done:
    PyMem_Free(start);
    Py_XDECREF(pos_out);
    Py_XDECREF(coord_out);
    Py_XDECREF(value_out);
    PyBuffer_Release(&uv);
    PyBuffer_Release(&kv);
    return result;
}

/* reserve(cells): room for ``cells`` more cells (the day's expected size) in one allocation
 * instead of a chain of growths, each copying the cells and rehashing the slots. */
static PyObject *CellTable_reserve(CellTable *self, PyObject *args)
{
    Py_ssize_t cells;
    if (!PyArg_ParseTuple(args, "n:reserve", &cells)) return NULL;
    if (cells < 0) {
        PyErr_SetString(PyExc_ValueError, "CellTable.reserve: a negative count");
        return NULL;
    }
    if (reserve(self, cells, 0) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *CellTable_clear(CellTable *self, PyObject *Py_UNUSED(ignored))
{
    release(self);
    Py_RETURN_NONE;
}

static PyObject *CellTable_nbytes(CellTable *self, void *Py_UNUSED(closure))
{
    size_t bytes = (size_t)self->capacity * sizeof(Cell) + (size_t)(self->capacity + 7) / 8 +
                   (size_t)self->aside_capacity * sizeof(Aside) + sf_index_bytes(&self->index);
    return PyLong_FromSize_t(bytes);
}

static Py_ssize_t CellTable_len(CellTable *self) { return self->count; }

static int CellTable_init(CellTable *self, PyObject *args, PyObject *kwargs)
{
    if (!PyArg_ParseTuple(args, ":CellTable") || (kwargs != NULL && PyDict_Size(kwargs) > 0)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "CellTable() takes no arguments");
        return -1;
    }
    release(self);
    return 0;
}

static void CellTable_dealloc(CellTable *self)
{
    release(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef CellTable_methods[] = {
    {"add", (PyCFunction)CellTable_add, METH_VARARGS,
     "add(cells, values): add values[i] (1.0 each when values is None) to cell cells[i]"},
    {"users_present", (PyCFunction)CellTable_users_present, METH_VARARGS,
     "users_present(n) -> bytearray: 1 where a cell has that user code"},
    {"coords_present", (PyCFunction)CellTable_coords_present, METH_VARARGS,
     "coords_present(n) -> bytearray: 1 where a cell has that coordinate code"},
    {"records", (PyCFunction)CellTable_records, METH_VARARGS,
     "records(user_rank, coord_rank) -> (user_pos, coord, value): every cell by its ranks, its "
     "exact sum rounded once"},
    {"reserve", (PyCFunction)CellTable_reserve, METH_VARARGS,
     "reserve(cells): room for that many more cells without growing"},
    {"clear", (PyCFunction)CellTable_clear, METH_NOARGS, "Drop every cell (frees the memory)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef CellTable_getset[] = {
    {"nbytes", (getter)CellTable_nbytes, NULL, "The bytes allocated for the cells.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods CellTable_as_sequence = {
    .sq_length = (lenfunc)CellTable_len,
};

static PyTypeObject CellTableType = {
    .ob_base = PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "streamfilter.engine._cell_table.CellTable",
    .tp_basicsize = sizeof(CellTable),
    .tp_dealloc = (destructor)CellTable_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The open day's (user, coordinate) cells and their exact sums (engine/records.py).",
    .tp_methods = CellTable_methods,
    .tp_getset = CellTable_getset,
    .tp_as_sequence = &CellTable_as_sequence,
    .tp_init = (initproc)CellTable_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_cell_table",
    .m_doc = "Native table of the open day's cells and their exact sums (engine/records.py).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__cell_table(void)
{
    PyObject *math = PyImport_ImportModule("math");
    if (math == NULL) return NULL;
    fsum = PyObject_GetAttrString(math, "fsum");
    Py_DECREF(math);
    if (fsum == NULL) return NULL;
    if (PyType_Ready(&CellTableType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&CellTableType);
    if (PyModule_AddObject(m, "CellTable", (PyObject *)&CellTableType) < 0) {
        Py_DECREF(&CellTableType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
