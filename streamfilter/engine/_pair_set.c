/* Native set of the open day's (user code, event id) pairs (engine/records.py, the event-id
 * index behind SeenEventIds; docs/design.md §2.2: an event repeating an event_id the same user
 * already sent that day is counted once).
 *
 * PairSet() is the exact set of pairs, with no Python object kept per pair:
 *   insert(users, event_ids) -> bytes: ``users`` an int32 buffer, ``event_ids`` a list of str of
 *       the same length; byte i is 1 where pair i is new — neither held before nor earlier in
 *       the batch — and 0 otherwise; the new pairs are added, in order;
 *   insert_keyed(keys, users, event_ids) -> bytes: the same, the pairs' int64 keys given (the
 *       caller keyed the batch with event_ids.pair_keys: they are stored and used as given);
 *   insert_spans(users, block, starts, lengths) -> bytes: insert's answer for the event ids
 *       block[starts[i]:starts[i] + lengths[i]] (int64 and int32 buffers; engine/lines.py,
 *       EventIdSpans: no str per id). Each span must lie in the block and be ASCII — then its
 *       bytes are the id's UTF-8 and their hash is the str's (CPython hashes a str's 1-byte
 *       code units) — else ValueError, and nothing is added;
 *   contains(user, event_id), contains_keyed(key, user, event_id) -> bool;
 *   add(user, event_id) -> bool: insert one pair, True if it was new;
 *   len(), nbytes (the bytes allocated for the pairs: columns, text and slot table);
 *   export() -> (keys, users, starts, lengths, text): the pairs in insertion order as packed
 *       columns (int64, int32, int64, int32 and the ids' bytes back to back), the columns of a
 *       records.PairRun once sorted by key;
 *   take() -> export()'s tuple, the set emptied as it is built: the slot table freed first,
 *       then each column once copied (a spill holds the pairs about once, not twice);
 *   clear(): drop every pair and free the memory.
 *
 * A pair's key is event_ids.pair_keys's, bit for bit: (uint64)hash(id) xor (uint64)user times
 * 0x9E3779B97F4A7C15 (wrapping), read as int64. An id's bytes are event_ids.id_bytes's: UTF-8,
 * lone surrogates kept (surrogatepass). A key match is confirmed by comparing the user code and
 * the id's bytes, so the answers are exact whatever the keys.
 *
 * Layout: dense columns appended in insertion order (keys, users, starts, lengths) and one text
 * arena, each grown to what a batch needs and by an eighth at least (so at most ~12.5% unused);
 * a slot table of uint32 (0: empty, else the pair's index + 1), a power of two at most half
 * full, probed linearly from the key's mixed top bits and rebuilt from the dense keys when it
 * grows. A batch is checked (types, lengths) and encoded first, then room
 * is reserved for all its pairs and bytes, and only then is anything changed: an error leaves the
 * set as it was. At most 2**31 - 2 pairs (OverflowError beyond).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "hashtable.h"
#include <stdint.h>
#include <string.h>

typedef struct {
    PyObject_HEAD
    int64_t *keys;    /* the dense columns, in insertion order; ``capacity`` entries each */
    int32_t *users;
    int64_t *starts;  /* offset of the pair's id in ``text`` */
    int32_t *lengths; /* its length in bytes */
    Py_ssize_t count;
    Py_ssize_t capacity;
    char *text; /* the ids' bytes back to back */
    Py_ssize_t text_len;
    Py_ssize_t text_capacity;
    SfIndex index; /* key -> pair (hashtable.h) */
} PairSet;

#define MAX_PAIRS SF_MAX_ENTRIES
#define MIN_CAPACITY 256
#define MIN_TEXT 4096
#define USER_MIX 0x9E3779B97F4A7C15ULL /* event_ids._USER_MIX */

/* event_ids.pair_keys of one pair: its id's hash given */
static inline int64_t pair_key(Py_hash_t hash, int32_t user)
{
    uint64_t mixed = (uint64_t)(int64_t)hash ^ ((uint64_t)(int64_t)user * USER_MIX);
    int64_t key;
    memcpy(&key, &mixed, sizeof key); /* reinterpreted, as numpy's view(np.int64) */
    return key;
}

/* One id to insert or look up: its bytes (borrowed from the str, or from ``tmp``: bytes the
 * caller releases) and its key. */
typedef struct {
    const char *data;
    Py_ssize_t len;
    int64_t key;
    PyObject *tmp;
} Id;

/* ``id``'s bytes as event_ids.id_bytes gives them; -1 with an exception (TypeError for an id
 * that is not exactly a str; OverflowError past INT32_MAX bytes). */
static int id_bytes(PyObject *id, Id *out)
{
    out->tmp = NULL;
    if (!PyUnicode_CheckExact(id)) {
        PyErr_Format(PyExc_TypeError, "PairSet: event ids must be str, not %.100s",
                     Py_TYPE(id)->tp_name);
        return -1;
    }
    out->data = PyUnicode_AsUTF8AndSize(id, &out->len); /* compact ASCII: the str's own bytes */
    if (out->data == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return -1;
        PyErr_Clear(); /* a lone surrogate: kept, as surrogatepass does */
        out->tmp = PyUnicode_AsEncodedString(id, "utf-8", "surrogatepass");
        if (out->tmp == NULL) return -1;
        out->data = PyBytes_AS_STRING(out->tmp);
        out->len = PyBytes_GET_SIZE(out->tmp);
    }
    if (out->len > INT32_MAX) {
        Py_CLEAR(out->tmp);
        PyErr_SetString(PyExc_OverflowError, "PairSet: an event id exceeds 2**31 - 1 bytes");
        return -1;
    }
    return 0;
}

/* The index of the pair held, or -1; ``*slot`` is where it is (or where it would go). */
static Py_ssize_t find(const PairSet *self, const Id *id, int32_t user, size_t *slot)
{
    size_t j = sf_first_slot(&self->index, id->key);
    for (;;) {
        uint32_t s = self->index.slots[j];
        if (s == 0) {
            *slot = j;
            return -1;
        }
        Py_ssize_t i = (Py_ssize_t)s - 1;
        /* (no text at all while every id held is empty: memcmp is not given NULL) */
        if (self->keys[i] == id->key && self->users[i] == user && self->lengths[i] == id->len &&
            (id->len == 0 ||
             memcmp(self->text + self->starts[i], id->data, (size_t)id->len) == 0)) {
            *slot = j;
            return i;
        }
        j = sf_next_slot(&self->index, j);
    }
}

/* Add a pair found absent at ``slot``; room was reserved (cannot fail). */
static void append(PairSet *self, const Id *id, int32_t user, size_t slot)
{
    Py_ssize_t i = self->count++;
    self->keys[i] = id->key;
    self->users[i] = user;
    self->starts[i] = self->text_len;
    self->lengths[i] = (int32_t)id->len;
    if (id->len > 0) memcpy(self->text + self->text_len, id->data, (size_t)id->len);
    self->text_len += id->len;
    self->index.slots[slot] = (uint32_t)(i + 1);
}

/* Room for ``pairs`` more pairs and ``text`` more bytes, the slot table at most half full with
 * them all; -1 with an exception, the pairs held unchanged. */
static int reserve(PairSet *self, Py_ssize_t pairs, Py_ssize_t text)
{
    if (pairs > MAX_PAIRS - self->count) {
        PyErr_SetString(PyExc_OverflowError, "PairSet: more than 2**31 - 2 pairs");
        return -1;
    }
    Py_ssize_t need = self->count + pairs;
    if (need > self->capacity) {
        /* an eighth more at least: at most 12.5% unused, not half */
        Py_ssize_t capacity = sf_grown(self->capacity, need, MIN_CAPACITY, MAX_PAIRS, 8);
        /* a column grown before another fails is only bigger than ``capacity`` says: harmless */
        if (sf_grow((void **)&self->keys, capacity, sizeof(int64_t)) < 0 ||
            sf_grow((void **)&self->users, capacity, sizeof(int32_t)) < 0 ||
            sf_grow((void **)&self->starts, capacity, sizeof(int64_t)) < 0 ||
            sf_grow((void **)&self->lengths, capacity, sizeof(int32_t)) < 0)
            return -1;
        self->capacity = capacity;
    }
    if (text > PY_SSIZE_T_MAX - self->text_len) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t need_text = self->text_len + text;
    if (need_text > self->text_capacity) {
        Py_ssize_t capacity = sf_grown(self->text_capacity, need_text, MIN_TEXT, PY_SSIZE_T_MAX, 8);
        if (sf_grow((void **)&self->text, capacity, 1) < 0) return -1;
        self->text_capacity = capacity;
    }
    return sf_index_fit(&self->index, need, self->keys, sizeof(int64_t), self->count);
}

static void release(PairSet *self)
{
    PyMem_Free(self->keys);
    PyMem_Free(self->users);
    PyMem_Free(self->starts);
    PyMem_Free(self->lengths);
    PyMem_Free(self->text);
    sf_index_free(&self->index);
    self->keys = self->starts = NULL;
    self->users = self->lengths = NULL;
    self->text = NULL;
    self->count = self->capacity = self->text_len = self->text_capacity = 0;
}

/* ``obj``'s buffer, which must be 1-D, C-contiguous and of signed integers of ``itemsize``
 * bytes in native order; -1 with an exception (the buffer not held). */
static int int_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    const uint16_t one = 1;
    const char native = *(const char *)&one ? '<' : '>';
    const char *f = view->format != NULL ? view->format : "B";
    if (*f == '@' || *f == '=' || *f == native || (native == '>' && *f == '!')) f++;
    int integer = (*f == 'i' || *f == 'l' || *f == 'q') && f[1] == '\0';
    if (!integer || view->itemsize != itemsize || view->ndim != 1) {
        PyErr_Format(PyExc_TypeError, "PairSet: %s must be a 1-D C-contiguous int%d buffer", what,
                     (int)(8 * itemsize));
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* The batch's pairs, checked and encoded (``text`` bytes in all; room not yet reserved), go
 * in, in order; byte i of ``result`` (n bytes) is 1 where pair i was new. -1 with an
 * exception and nothing changed if room cannot be made. */
static int add_encoded(PairSet *self, const Id *batch, const int32_t *users, Py_ssize_t n,
                       Py_ssize_t text, PyObject *result)
{
    if (reserve(self, n, text) < 0) return -1;
    /* nothing below can fail */
    for (Py_ssize_t i = 0; i < n; i++) {
        size_t slot;
        if (find(self, &batch[i], users[i], &slot) >= 0) {
            PyBytes_AS_STRING(result)[i] = 0;
        } else {
            append(self, &batch[i], users[i], slot);
            PyBytes_AS_STRING(result)[i] = 1;
        }
    }
    return 0;
}

/* insert and insert_keyed: ``keys_obj`` NULL to key the pairs here. */
static PyObject *insert_batch(PairSet *self, PyObject *keys_obj, PyObject *users_obj,
                              PyObject *ids)
{
    Py_buffer keys_view = {0}, users_view;
    if (!PyList_Check(ids)) {
        PyErr_SetString(PyExc_TypeError, "PairSet: event_ids must be a list of str");
        return NULL;
    }
    if (keys_obj != NULL && int_buffer(keys_obj, &keys_view, 8, "keys") < 0) return NULL;
    if (int_buffer(users_obj, &users_view, 4, "users") < 0) {
        if (keys_obj != NULL) PyBuffer_Release(&keys_view);
        return NULL;
    }
    PyObject *result = NULL;
    Id *batch = NULL;
    Py_ssize_t n = PyList_GET_SIZE(ids), encoded = 0, text = 0;
    const int32_t *users = users_view.buf;
    const int64_t *keys = keys_obj != NULL ? keys_view.buf : NULL;
    if (users_view.shape[0] != n || (keys != NULL && keys_view.shape[0] != n)) {
        PyErr_SetString(PyExc_ValueError, "PairSet: one user (and key) per event id");
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, n);
    if (result == NULL) goto done;
    if (n == 0) goto done;
    batch = PyMem_Calloc((size_t)n, sizeof(Id));
    if (batch == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    /* first every id checked and encoded (no Python code runs: the list cannot change) */
    for (; encoded < n; encoded++) {
        PyObject *id = PyList_GET_ITEM(ids, encoded);
        Id *e = &batch[encoded];
        if (id_bytes(id, e) < 0) goto fail;
        if (keys != NULL) {
            e->key = keys[encoded];
        } else {
            Py_hash_t hash = PyObject_Hash(id);
            if (hash == -1) {
                encoded++; /* its ``tmp`` is released below */
                goto fail;
            }
            e->key = pair_key(hash, users[encoded]);
        }
        if (e->len > PY_SSIZE_T_MAX - text) {
            encoded++;
            PyErr_NoMemory();
            goto fail;
        }
        text += e->len;
    }
    if (add_encoded(self, batch, users, n, text, result) < 0) goto fail;
    goto done;
fail:
    Py_CLEAR(result);
done:
    for (Py_ssize_t i = 0; i < encoded; i++) Py_XDECREF(batch[i].tmp);
    PyMem_Free(batch);
    PyBuffer_Release(&users_view);
    if (keys_obj != NULL) PyBuffer_Release(&keys_view);
    return result;
}

static PyObject *PairSet_insert(PairSet *self, PyObject *args)
{
    PyObject *users, *ids;
    if (!PyArg_ParseTuple(args, "OO:insert", &users, &ids)) return NULL;
    return insert_batch(self, NULL, users, ids);
}

static PyObject *PairSet_insert_keyed(PairSet *self, PyObject *args)
{
    PyObject *keys, *users, *ids;
    if (!PyArg_ParseTuple(args, "OOO:insert_keyed", &keys, &users, &ids)) return NULL;
    return insert_batch(self, keys, users, ids);
}

#if PY_VERSION_HEX >= 0x030E0000
#define HASH_BYTES Py_HashBuffer
#else
#define HASH_BYTES _Py_HashBytes
#endif

static PyObject *PairSet_insert_spans(PairSet *self, PyObject *args)
{
    PyObject *users_obj, *starts_obj, *lengths_obj;
    Py_buffer block, users_view, starts_view, lengths_view;
    if (!PyArg_ParseTuple(args, "Oy*OO:insert_spans", &users_obj, &block, &starts_obj,
                          &lengths_obj))
        return NULL;
    PyObject *result = NULL;
    Id *batch = NULL;
    int held = 0; /* buffers held: users, starts, lengths */
    if (int_buffer(users_obj, &users_view, 4, "users") < 0) goto done;
    held++;
    if (int_buffer(starts_obj, &starts_view, 8, "starts") < 0) goto done;
    held++;
    if (int_buffer(lengths_obj, &lengths_view, 4, "lengths") < 0) goto done;
    held++;
    Py_ssize_t n = users_view.shape[0], text = 0;
    if (starts_view.shape[0] != n || lengths_view.shape[0] != n) {
        PyErr_SetString(PyExc_ValueError, "PairSet: one start and one length per user");
        goto done;
    }
    const int32_t *users = users_view.buf, *lengths = lengths_view.buf;
    const int64_t *starts = starts_view.buf;
    const unsigned char *data = block.buf;
    batch = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(Id));
    if (batch == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* first every span checked and keyed: in the block, ASCII */
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t a = starts[i];
        int32_t len = lengths[i];
        if (len < 0 || a < 0 || a > (int64_t)block.len - len) {
            PyErr_SetString(PyExc_ValueError, "PairSet: an event id span outside its block");
            goto done;
        }
        unsigned char high = 0;
        for (int32_t j = 0; j < len; j++) high |= data[a + j];
        if (high & 0x80) {
            PyErr_SetString(PyExc_ValueError, "PairSet: an event id span that is not ASCII");
            goto done;
        }
        batch[i].data = (const char *)data + a;
        batch[i].len = len;
        batch[i].key = pair_key(HASH_BYTES(data + a, len), users[i]);
        text += len; /* at most n * INT32_MAX: no overflow in 64 bits */
    }
    result = PyBytes_FromStringAndSize(NULL, n);
    if (result != NULL && add_encoded(self, batch, users, n, text, result) < 0) Py_CLEAR(result);
done:
    PyMem_Free(batch);
    PyBuffer_Release(&block);
    if (held > 0) PyBuffer_Release(&users_view);
    if (held > 1) PyBuffer_Release(&starts_view);
    if (held > 2) PyBuffer_Release(&lengths_view);
    return result;
}

/* One pair, keyed here (``keyed`` 0) or by the caller: held (1), absent (0) or -1 with an
 * exception; ``add`` inserts it if absent. */
static int one_pair(PairSet *self, int keyed, long long key, int user, PyObject *event_id,
                    int add)
{
    Id id;
    if (id_bytes(event_id, &id) < 0) return -1;
    if (keyed) {
        id.key = (int64_t)key;
    } else {
        Py_hash_t hash = PyObject_Hash(event_id);
        if (hash == -1) {
            Py_XDECREF(id.tmp);
            return -1;
        }
        id.key = pair_key(hash, (int32_t)user);
    }
    int held = 0;
    if (add && reserve(self, 1, id.len) < 0) {
        held = -1;
    } else if (self->index.slots != NULL) {
        size_t slot;
        held = find(self, &id, (int32_t)user, &slot) >= 0;
        if (!held && add) append(self, &id, (int32_t)user, slot);
    }
    Py_XDECREF(id.tmp);
    return held;
}

static PyObject *PairSet_contains(PairSet *self, PyObject *args)
{
    int user;
    PyObject *event_id;
    if (!PyArg_ParseTuple(args, "iO:contains", &user, &event_id)) return NULL;
    int held = one_pair(self, 0, 0, user, event_id, 0);
    return held < 0 ? NULL : PyBool_FromLong(held);
}

static PyObject *PairSet_contains_keyed(PairSet *self, PyObject *args)
{
    long long key;
    int user;
    PyObject *event_id;
    if (!PyArg_ParseTuple(args, "LiO:contains_keyed", &key, &user, &event_id)) return NULL;
    int held = one_pair(self, 1, key, user, event_id, 0);
    return held < 0 ? NULL : PyBool_FromLong(held);
}

static PyObject *PairSet_add(PairSet *self, PyObject *args)
{
    int user;
    PyObject *event_id;
    if (!PyArg_ParseTuple(args, "iO:add", &user, &event_id)) return NULL;
    int held = one_pair(self, 0, 0, user, event_id, 1);
    return held < 0 ? NULL : PyBool_FromLong(!held);
}

/* The tuple (keys, users, starts, lengths, text) of new references, which it takes over
 * (NULL with an exception if any is NULL). */
static PyObject *columns_tuple(PyObject *keys, PyObject *users, PyObject *starts,
                               PyObject *lengths, PyObject *text)
{
    PyObject *result = NULL;
    if (keys != NULL && users != NULL && starts != NULL && lengths != NULL && text != NULL)
        result = PyTuple_Pack(5, keys, users, starts, lengths, text);
    Py_XDECREF(keys);
    Py_XDECREF(users);
    Py_XDECREF(starts);
    Py_XDECREF(lengths);
    Py_XDECREF(text);
    return result;
}

static PyObject *PairSet_export(PairSet *self, PyObject *Py_UNUSED(ignored))
{
    Py_ssize_t n = self->count;
    return columns_tuple(PyBytes_FromStringAndSize((const char *)self->keys, n * 8),
                         PyBytes_FromStringAndSize((const char *)self->users, n * 4),
                         PyBytes_FromStringAndSize((const char *)self->starts, n * 8),
                         PyBytes_FromStringAndSize((const char *)self->lengths, n * 4),
                         PyBytes_FromStringAndSize(self->text, self->text_len));
}

/* A column's first ``size`` bytes as bytes, the column then freed (NULL on error: the column
 * is freed all the same). */
static PyObject *take_column(void **column, Py_ssize_t size)
{
    PyObject *out = PyBytes_FromStringAndSize(*column != NULL ? (const char *)*column : "", size);
    PyMem_Free(*column);
    *column = NULL;
    return out;
}

static PyObject *PairSet_take(PairSet *self, PyObject *Py_UNUSED(ignored))
{
    Py_ssize_t n = self->count, text_len = self->text_len;
    sf_index_free(&self->index); /* the slot table first: the columns' copies take its place */
    PyObject *keys = take_column((void **)&self->keys, n * 8);
    PyObject *users = take_column((void **)&self->users, n * 4);
    PyObject *starts = take_column((void **)&self->starts, n * 8);
    PyObject *lengths = take_column((void **)&self->lengths, n * 4);
    PyObject *text = take_column((void **)&self->text, text_len);
    release(self); /* the set is empty now, whatever happened */
    return columns_tuple(keys, users, starts, lengths, text);
}

static PyObject *PairSet_clear(PairSet *self, PyObject *Py_UNUSED(ignored))
{
    release(self);
    Py_RETURN_NONE;
}

static PyObject *PairSet_nbytes(PairSet *self, void *Py_UNUSED(closure))
{
    size_t columns = (size_t)self->capacity * (2 * sizeof(int64_t) + 2 * sizeof(int32_t));
    return PyLong_FromSize_t(columns + (size_t)self->text_capacity + sf_index_bytes(&self->index));
}

static Py_ssize_t PairSet_len(PairSet *self) { return self->count; }

static int PairSet_init(PairSet *self, PyObject *args, PyObject *kwargs)
{
    if (!PyArg_ParseTuple(args, ":PairSet") || (kwargs != NULL && PyDict_Size(kwargs) > 0)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "PairSet() takes no arguments");
        return -1;
    }
    release(self);
    return 0;
}

static void PairSet_dealloc(PairSet *self)
{
    release(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef PairSet_methods[] = {
    {"insert", (PyCFunction)PairSet_insert, METH_VARARGS,
     "insert(users, event_ids) -> bytes: 1 where the pair is new (then added), else 0"},
    {"insert_keyed", (PyCFunction)PairSet_insert_keyed, METH_VARARGS,
     "insert_keyed(keys, users, event_ids) -> bytes: insert, the pairs' int64 keys given"},
    {"insert_spans", (PyCFunction)PairSet_insert_spans, METH_VARARGS,
     "insert_spans(users, block, starts, lengths) -> bytes: insert, the ids spans of block"},
    {"contains", (PyCFunction)PairSet_contains, METH_VARARGS,
     "contains(user, event_id) -> the pair is held"},
    {"contains_keyed", (PyCFunction)PairSet_contains_keyed, METH_VARARGS,
     "contains_keyed(key, user, event_id) -> the pair, whose key is given, is held"},
    {"add", (PyCFunction)PairSet_add, METH_VARARGS,
     "add(user, event_id) -> True if the pair was new (it is held now)"},
    {"export", (PyCFunction)PairSet_export, METH_NOARGS,
     "export() -> (keys, users, starts, lengths, text): the pairs in insertion order"},
    {"take", (PyCFunction)PairSet_take, METH_NOARGS,
     "take() -> export()'s tuple, the set emptied as it is built (each column freed once copied: "
     "the memory of the pairs is held about once, not twice)"},
    {"clear", (PyCFunction)PairSet_clear, METH_NOARGS, "Drop every pair (frees the memory)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef PairSet_getset[] = {
    {"nbytes", (getter)PairSet_nbytes, NULL,
     "The bytes allocated for the pairs (columns, text and slot table).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods PairSet_as_sequence = {
    .sq_length = (lenfunc)PairSet_len,
};

static PyTypeObject PairSetType = {
    .ob_base = PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "streamfilter.engine._pair_set.PairSet",
    .tp_basicsize = sizeof(PairSet),
    .tp_dealloc = (destructor)PairSet_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The exact set of a day's (user code, event id) pairs (engine/records.py).",
    .tp_methods = PairSet_methods,
    .tp_getset = PairSet_getset,
    .tp_as_sequence = &PairSet_as_sequence,
    .tp_init = (initproc)PairSet_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_pair_set",
    .m_doc = "Native set of the open day's (user code, event id) pairs (engine/records.py).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__pair_set(void)
{
    if (PyType_Ready(&PairSetType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&PairSetType);
    if (PyModule_AddObject(m, "PairSet", (PyObject *)&PairSetType) < 0) {
        Py_DECREF(&PairSetType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
