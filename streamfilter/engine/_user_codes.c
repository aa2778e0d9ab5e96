/* Native user coding for the open day (engine/records.py, DayAccumulator; docs/design.md §8.4).
 *
 * UserCodes() is a str -> int64 map with exactly the semantics the day's dict had:
 *   codes(ids, first[, new_ids]) -> bytearray of int64: for each id in order, its code, the ids
 *       not held yet getting ``first``, ``first + 1``, ... in order of first arrival (dense codes
 *       when ``first`` is len()) — ``dict.setdefault(id, next(counter))`` for each id not held,
 *       the counter starting at ``first``; each id that took a new code is appended to the list
 *       ``new_ids`` when one is given (not None: the day's ids by code, no Python step per id);
 *   code_of(id, code) -> int: ``dict.setdefault(id, code)``;
 *   reserve(more): room for that many more ids, allocated at once (a size hint);
 *   len(), clear().
 * Keys are compared as Python compares str (same hash, then equal text), so the codes are those
 * the dict gave. The table is hashtable.h's: the entries (hash, code, id) in insertion order and
 * a slot index keyed by the id's str hash — no Python int per code, no Python call per id. At
 * most 2**31 - 2 ids (OverflowError beyond). The table holds a reference to each id (a str
 * references nothing, so no cycle can go through it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "hashtable.h"
#include <stdint.h>
#include <string.h>

typedef struct {
    int64_t hash; /* the id's str hash: the index's key */
    int64_t code;
    PyObject *id;
} Entry;

typedef struct {
    PyObject_HEAD
    Entry *entries; /* in insertion order; ``capacity`` of them */
    Py_ssize_t count;
    Py_ssize_t capacity;
    SfIndex index; /* hash -> entry (hashtable.h) */
} UserCodes;

#define MAX_IDS SF_MAX_ENTRIES
#define MIN_CAPACITY 64
#define PREFETCH_AHEAD 16 /* look-ups between a slot's prefetch and its use */
#define ENTRY_AHEAD (PREFETCH_AHEAD / 2) /* between the entry's prefetch and its use */

/* ``id``'s hash; -1 with an exception (TypeError for an id that is not a str). */
static Py_hash_t id_hash(PyObject *id)
{
    if (!PyUnicode_Check(id)) {
        PyErr_SetString(PyExc_TypeError, "UserCodes: ids must be str");
        return -1;
    }
    return PyObject_Hash(id);
}

/* Room for ``more`` ids beyond those held, the index at most half full with them; -1 with an
 * exception, the ids held unchanged. */
static int reserve(UserCodes *self, Py_ssize_t more)
{
    if (more > MAX_IDS - self->count) {
        PyErr_SetString(PyExc_OverflowError, "UserCodes: more than 2**31 - 2 ids");
        return -1;
    }
    Py_ssize_t need = self->count + more;
    if (need > self->capacity) {
        Py_ssize_t capacity = sf_grown(self->capacity, need, MIN_CAPACITY, MAX_IDS, 4);
        if (sf_grow((void **)&self->entries, capacity, sizeof(Entry)) < 0) return -1;
        self->capacity = capacity;
    }
    const int64_t *keys = self->count > 0 ? &self->entries[0].hash : NULL;
    return sf_index_fit(&self->index, need, keys, sizeof(Entry), self->count);
}

/* The entry a hash's first slot names fetched ahead of its look-up (a hint: no effect on the
 * result; the slot itself fetched earlier, sf_prefetch_slot). A macro: GCC takes a function
 * that only prefetches for one with no effect and drops its calls. */
#define PREFETCH_ENTRY(self, hash)                                                             \
    do {                                                                                       \
        uint32_t s_ = (self)->index.slots[sf_first_slot(&(self)->index, (hash))];              \
        if (s_ != 0) __builtin_prefetch(&(self)->entries[s_ - 1]);                             \
    } while (0)

/* The code of ``id`` whose hash is ``hash`` (inserting ``code`` if it is not held), room for
 * one more id reserved; -1 with an exception on error. */
static int lookup_hashed(UserCodes *self, PyObject *id, Py_hash_t hash, int64_t code,
                         int64_t *out)
{
    size_t j = sf_first_slot(&self->index, hash);
    for (;;) {
        uint32_t s = self->index.slots[j];
        if (s == 0) {
            Entry *e = &self->entries[self->count++];
            e->hash = hash;
            e->code = code;
            e->id = Py_NewRef(id);
            self->index.slots[j] = (uint32_t)self->count;
            *out = code;
            return 0;
        }
        const Entry *e = &self->entries[s - 1];
        if (e->hash == hash) {
            if (e->id == id) {
                *out = e->code;
                return 0;
            }
            int eq = PyUnicode_Compare(e->id, id);
            if (eq == -1 && PyErr_Occurred()) return -1;
            if (eq == 0) {
                *out = e->code;
                return 0;
            }
        }
        j = sf_next_slot(&self->index, j);
    }
}

/* The code of ``id`` (inserting ``code`` if it is not held); -1 with an exception on error. */
static int lookup(UserCodes *self, PyObject *id, int64_t code, int64_t *out)
{
    Py_hash_t hash = id_hash(id);
    if (hash == -1 || reserve(self, 1) < 0) return -1;
    return lookup_hashed(self, id, hash, code, out);
}

static void release(UserCodes *self)
{
    for (Py_ssize_t i = 0; i < self->count; i++) Py_DECREF(self->entries[i].id);
    PyMem_Free(self->entries);
    sf_index_free(&self->index);
    self->entries = NULL;
    self->count = self->capacity = 0;
}

static int UserCodes_init(UserCodes *self, PyObject *args, PyObject *kwargs)
{
    if (!PyArg_ParseTuple(args, ":UserCodes") || (kwargs != NULL && PyDict_Size(kwargs) > 0)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "UserCodes() takes no arguments");
        return -1;
    }
    release(self);
    return 0;
}

static void UserCodes_dealloc(UserCodes *self)
{
    release(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *UserCodes_codes(UserCodes *self, PyObject *args)
{
    PyObject *ids, *new_ids = Py_None;
    long long first;
    if (!PyArg_ParseTuple(args, "O!L|O:codes", &PyList_Type, &ids, &first, &new_ids))
        return NULL;
    if (new_ids == Py_None) {
        new_ids = NULL;
    } else if (!PyList_Check(new_ids)) {
        PyErr_SetString(PyExc_TypeError, "codes: new_ids must be a list or None");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(ids);
    PyObject *out = PyByteArray_FromStringAndSize(NULL, n * 8);
    if (out == NULL) return NULL;
    int64_t *codes = (int64_t *)PyByteArray_AS_STRING(out);
    /* the hashes first; then the look-ups in order, each slot fetched PREFETCH_AHEAD ids early
     * and its entry ENTRY_AHEAD ids early. The ids are read from a copy of the list: a str
     * subclass's __hash__ is Python code, which could change the list meanwhile. */
    PyObject *items = PyList_GetSlice(ids, 0, n);
    Py_hash_t *hashes = PyMem_Malloc(n > 0 ? (size_t)n * sizeof(Py_hash_t) : 1);
    if (items == NULL || hashes == NULL) {
        if (hashes == NULL) PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        hashes[i] = id_hash(PyList_GET_ITEM(items, i));
        if (hashes[i] == -1) goto fail;
    }
    /* an index to prefetch from (a growth below only makes the pending prefetches useless,
     * never wrong) */
    if (n > 0 && reserve(self, 1) < 0) goto fail;
    for (Py_ssize_t i = 0; i < n && i < PREFETCH_AHEAD; i++)
        sf_prefetch_slot(&self->index, hashes[i]);
    for (Py_ssize_t i = 0; i < n && i < ENTRY_AHEAD; i++) PREFETCH_ENTRY(self, hashes[i]);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + PREFETCH_AHEAD < n) sf_prefetch_slot(&self->index, hashes[i + PREFETCH_AHEAD]);
        if (i + ENTRY_AHEAD < n) PREFETCH_ENTRY(self, hashes[i + ENTRY_AHEAD]);
        /* room for one more id, grown as ids are added (not for the whole batch: most of a
         * batch may be ids already held, and an index sized for them all would be twice as
         * large) */
        if (reserve(self, 1) < 0) goto fail;
        PyObject *id = PyList_GET_ITEM(items, i);
        Py_ssize_t held = self->count;
        if (lookup_hashed(self, id, hashes[i], (int64_t)first, &codes[i]) < 0) goto fail;
        if (self->count > held) { /* the id was new: it took ``first`` */
            first++;
            if (new_ids != NULL && PyList_Append(new_ids, id) < 0) goto fail;
        }
    }
    PyMem_Free(hashes);
    Py_DECREF(items);
    return out;
fail:
    PyMem_Free(hashes);
    Py_XDECREF(items);
    Py_DECREF(out);
    return NULL;
}

static PyObject *UserCodes_code_of(UserCodes *self, PyObject *args)
{
    PyObject *id;
    long long code;
    int64_t out;
    if (!PyArg_ParseTuple(args, "OL:code_of", &id, &code)) return NULL;
    if (lookup(self, id, (int64_t)code, &out) < 0) return NULL;
    return PyLong_FromLongLong(out);
}

/* reserve(more): room for ``more`` more ids (the day's expected users) in one allocation instead
 * of a chain of growths, each rehashing every id held. */
static PyObject *UserCodes_reserve(UserCodes *self, PyObject *args)
{
    Py_ssize_t more;
    if (!PyArg_ParseTuple(args, "n:reserve", &more)) return NULL;
    if (more < 0 || more > MAX_IDS - self->count) {
        PyErr_SetString(PyExc_ValueError, "UserCodes.reserve: a count out of range");
        return NULL;
    }
    if (reserve(self, more) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *UserCodes_clear(UserCodes *self, PyObject *Py_UNUSED(ignored))
{
    release(self);
    Py_RETURN_NONE;
}

static Py_ssize_t UserCodes_len(UserCodes *self) { return self->count; }

static PyMethodDef UserCodes_methods[] = {
    {"codes", (PyCFunction)UserCodes_codes, METH_VARARGS,
     "codes(ids, first) -> bytearray of int64 codes (new ids get first, first + 1, ... in order)"},
    {"code_of", (PyCFunction)UserCodes_code_of, METH_VARARGS,
     "code_of(id, code) -> the id's code (code if it was not held: then it is held)"},
    {"reserve", (PyCFunction)UserCodes_reserve, METH_VARARGS,
     "reserve(more): room for that many more ids without growing"},
    {"clear", (PyCFunction)UserCodes_clear, METH_NOARGS, "Drop every id (frees the table)."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods UserCodes_as_sequence = {
    .sq_length = (lenfunc)UserCodes_len,
};

static PyTypeObject UserCodesType = {
    .ob_base = PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "streamfilter.engine._user_codes.UserCodes",
    .tp_basicsize = sizeof(UserCodes),
    .tp_dealloc = (destructor)UserCodes_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "str -> int64 codes with dict.setdefault's semantics (engine/records.py).",
    .tp_methods = UserCodes_methods,
    .tp_as_sequence = &UserCodes_as_sequence,
    .tp_init = (initproc)UserCodes_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_user_codes",
    .m_doc = "Native user coding for the open day (engine/records.py).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__user_codes(void)
{
    if (PyType_Ready(&UserCodesType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&UserCodesType);
    if (PyModule_AddObject(m, "UserCodes", (PyObject *)&UserCodesType) < 0) {
        Py_DECREF(&UserCodesType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
