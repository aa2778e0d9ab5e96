/* Native packing of user ids into words for the ledger's keys (engine/records.py, UserKeys in
 * engine/ledger.py; docs/design.md §8.4).
 *
 * pack_words(ids, canonical) -> (words, woff, lengths) | None
 *
 * ``ids``: a list of str; ``canonical``: an int64 buffer, a permutation of range(len(ids)) —
 * id ``i`` goes to position ``canonical[i]``. Each id's UTF-8 bytes, zero-padded to whole
 * little-endian uint64 words, are laid out one after the other in canonical order: ``words``
 * (uint64), ``woff`` (int64, each id's first word) and ``lengths`` (int64, bytes), all in
 * canonical order — exactly what ``ledger.encode_ids`` + ``ledger.pack_ids`` and then
 * ``UserKeys.compacted`` give, without a Python step or a numpy index array per word. The ids
 * are read in the order given (their order in memory), twice: lengths, then bytes.
 *
 * None — the caller then takes the numpy path, which gives the reason — for an id that is not a
 * str, has no UTF-8 form (a lone surrogate; the numpy path encodes it with surrogatepass) or
 * exceeds ``max_bytes``. A ``canonical`` that is not a permutation is a ValueError (it could
 * otherwise write out of bounds).
 *
 * concat_utf8(ids) -> (text, lengths) | None
 *
 * The event-id index's packing (engine/event_ids.py ``packed_ids``): the ids' UTF-8 bytes back
 * to back and each one's length in bytes (int32), or None for an id without UTF-8 form or
 * longer than 2**31 - 1 bytes (the Python path encodes it with surrogatepass).
 *
 * canonical_users(ids, present, in_order, max_bytes)
 *     -> (user_rank, hashes, words, woff, lengths) | None
 *
 * The day's users in the ledger's canonical order (engine/records.py ``_canonical_users`` with
 * ``ledger.python_hash``): the ids with ``present[i]`` set, sorted by ``hash(id)`` ascending.
 * ``user_rank`` (int64, one per id) is each id's position in that order, -1 when not present;
 * ``hashes`` (int64) the sorted hashes; ``words``, ``woff``, ``lengths`` what ``pack_words``
 * gives for that order; the present ids themselves are stored into ``in_order`` (a fresh object
 * array of their number, its slots None) in that order. The ids are visited twice in the order
 * given — hash and length, then bytes and reference — and only positions are sorted: a counting
 * pass on the hashes' top bits, then each bucket (keyed hashes fill the buckets evenly).
 * None, with ``in_order`` untouched, when the numpy path must decide: an id that is not an exact
 * str, has no UTF-8 form or exceeds ``max_bytes``, or two ids that share a hash (canonical order
 * then breaks the tie by id).
 *
 * locate_sorted(key, len, woff, words, hashes, lengths, qwoff, qwords) -> (found, pos)
 *
 * The ledger's lookup (engine/ledger.py ``BudgetLedger._locate_sorted``) as one merge walk:
 * ``key`` (int64, ascending), ``len`` (uint16), ``woff`` (int64) and ``words`` (uint64) are the
 * ledger's entries, ``hashes`` (int64, ascending), ``lengths``, ``qwoff`` (int64) and
 * ``qwords`` the users' keys (``UserKeys``). ``pos[i]`` is where hash i goes in ``key`` (numpy's
 * ``searchsorted``, left); ``found[i]`` the first entry of the run of equal keys from there
 * whose id is the user's (same length, same words), or -1. Hashes out of order, or an id's
 * words outside their array, are a ValueError.
 *
 * merge_entries(key, spent, retired, len, woff, words, nkey, nspent, nretired, nlen, nwoff,
 *               nwords) -> (key, spent, retired, len, woff, words)
 *
 * ``BudgetLedger._insert`` as one merge: the ledger's columns (as above; ``spent`` int64,
 * ``retired`` bytes 0/1) and new entries sorted by key (``nlen`` int64) into new columns sorted
 * by key, a new entry after the ledger's entries of its key and new entries of one key in their
 * order; each id's words copied to its place, ``woff`` the running count of words.
 *
 * hashes(ids) -> bytearray of int64
 *
 * ``hash(id)`` of each id of a list (ledger.python_hash: the ledger's canonical order), without
 * a Python call per id: a str caches its hash, so each is one read.
 *
 * key_partitions(ids, partitions) -> bytearray of int32 | None
 *
 * The partition Kafka's default partitioner gives each id of a list as a record key
 * (engine/partitions.py ``key_partition``: ``(murmur2(utf8(id)) & 0x7fffffff) % partitions``,
 * the Java client's murmur2 with seed 0x9747b28c), without a Python step per id. None — the
 * caller then takes the Python path, which gives the answer or the reason — for an id that is
 * not a str or has no UTF-8 form (a lone surrogate). ``partitions`` < 1 is a ValueError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* The UTF-8 bytes of ``id`` (a borrowed pointer, or one into ``*tmp`` which the caller frees);
 * 0 when it has none (error cleared). */
static int utf8_of(PyObject *id, const char **data, Py_ssize_t *len, PyObject **tmp)
{
    *tmp = NULL;
    if (!PyUnicode_Check(id) || PyUnicode_READY(id) < 0) {
        PyErr_Clear();
        return 0;
    }
    if (PyUnicode_IS_ASCII(id)) {
        *data = (const char *)PyUnicode_1BYTE_DATA(id);
        *len = PyUnicode_GET_LENGTH(id);
        return 1;
    }
    *tmp = PyUnicode_AsUTF8String(id); /* a temporary: nothing cached on the id */
    if (*tmp == NULL) {
        PyErr_Clear();
        return 0;
    }
    *data = PyBytes_AS_STRING(*tmp);
    *len = PyBytes_GET_SIZE(*tmp);
    return 1;
}

static PyObject *pack_words(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *ids;
    Py_buffer canonical_buf;
    Py_ssize_t max_bytes;
    if (!PyArg_ParseTuple(args, "O!y*n:pack_words", &PyList_Type, &ids, &canonical_buf, &max_bytes))
        return NULL;
    PyObject *result = NULL, *words = NULL, *woff = NULL, *lengths = NULL;
    char *taken = NULL;
    Py_ssize_t n = PyList_GET_SIZE(ids);
    const int64_t *canonical = canonical_buf.buf;
    if (canonical_buf.len != n * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "pack_words: one int64 position per id");
        goto done;
    }
    taken = PyMem_Calloc((size_t)n + 1, 1);
    lengths = PyByteArray_FromStringAndSize(NULL, n * 8);
    woff = PyByteArray_FromStringAndSize(NULL, n * 8);
    if (taken == NULL || lengths == NULL || woff == NULL) {
        if (taken == NULL) PyErr_NoMemory();
        goto done;
    }
    int64_t *len_at = (int64_t *)PyByteArray_AS_STRING(lengths);
    int64_t *woff_at = (int64_t *)PyByteArray_AS_STRING(woff);
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t p = canonical[i];
        if (p < 0 || p >= n || taken[p]) {
            PyErr_SetString(PyExc_ValueError, "pack_words: canonical is not a permutation");
            goto done;
        }
        taken[p] = 1;
        const char *data;
        Py_ssize_t len;
        PyObject *tmp;
        if (!utf8_of(PyList_GET_ITEM(ids, i), &data, &len, &tmp) || len > max_bytes) {
            Py_XDECREF(tmp);
            result = Py_NewRef(Py_None);
            goto done;
        }
        Py_XDECREF(tmp);
        len_at[p] = len;
    }
    int64_t total = 0;
    for (Py_ssize_t p = 0; p < n; p++) {
        woff_at[p] = total;
        total += (len_at[p] + 7) / 8;
    }
    words = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)total * 8);
    if (words == NULL) goto done;
    char *out = PyByteArray_AS_STRING(words);
    memset(out, 0, (size_t)total * 8);
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *data;
        Py_ssize_t len;
        PyObject *tmp;
        int64_t p = canonical[i];
        if (!utf8_of(PyList_GET_ITEM(ids, i), &data, &len, &tmp) || len != len_at[p]) {
            Py_XDECREF(tmp); /* str is immutable and the GIL is held: not expected */
            PyErr_SetString(PyExc_RuntimeError, "pack_words: an id changed while packing");
            goto done;
        }
        memcpy(out + 8 * woff_at[p], data, (size_t)len);
        Py_XDECREF(tmp);
    }
    result = PyTuple_Pack(3, words, woff, lengths);
done:
    PyBuffer_Release(&canonical_buf);
    PyMem_Free(taken);
    Py_XDECREF(words);
    Py_XDECREF(woff);
    Py_XDECREF(lengths);
    return result;
}

static PyObject *concat_utf8(PyObject *Py_UNUSED(module), PyObject *ids)
{
    if (!PyList_Check(ids)) {
        PyErr_SetString(PyExc_TypeError, "concat_utf8: ids must be a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(ids), total = 0;
    PyObject *lengths = PyByteArray_FromStringAndSize(NULL, n * 4);
    if (lengths == NULL) return NULL;
    int32_t *len_at = (int32_t *)PyByteArray_AS_STRING(lengths);
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *data;
        Py_ssize_t len;
        PyObject *tmp;
        if (!utf8_of(PyList_GET_ITEM(ids, i), &data, &len, &tmp) || len > INT32_MAX ||
            total > PY_SSIZE_T_MAX - len) {
            Py_XDECREF(tmp);
            Py_DECREF(lengths);
            Py_RETURN_NONE;
        }
        Py_XDECREF(tmp);
        len_at[i] = (int32_t)len;
        total += len;
    }
    PyObject *text = PyBytes_FromStringAndSize(NULL, total);
    if (text == NULL) {
        Py_DECREF(lengths);
        return NULL;
    }
    char *out = PyBytes_AS_STRING(text);
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *data;
        Py_ssize_t len;
        PyObject *tmp;
        if (!utf8_of(PyList_GET_ITEM(ids, i), &data, &len, &tmp) || len != len_at[i]) {
            Py_XDECREF(tmp); /* str is immutable and the GIL is held: not expected */
            Py_DECREF(text);
            Py_DECREF(lengths);
            PyErr_SetString(PyExc_RuntimeError, "concat_utf8: an id changed while packing");
            return NULL;
        }
        memcpy(out, data, (size_t)len);
        out += len;
        Py_XDECREF(tmp);
    }
    PyObject *result = PyTuple_Pack(2, text, lengths);
    Py_DECREF(text);
    Py_DECREF(lengths);
    return result;
}

static PyObject *hashes(PyObject *Py_UNUSED(module), PyObject *arg)
{
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "hashes: ids must be a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(arg);
    PyObject *out = PyByteArray_FromStringAndSize(NULL, n * 8);
    if (out == NULL) return NULL;
    int64_t *h = (int64_t *)PyByteArray_AS_STRING(out);
    /* exact str ids: their hash runs no Python code, so the list cannot change under the loop */
    Py_ssize_t i = 0;
    for (; i < n; i++) {
        PyObject *id = PyList_GET_ITEM(arg, i);
        if (!PyUnicode_CheckExact(id)) break;
        Py_hash_t v = PyObject_Hash(id);
        if (v == -1) {
            Py_DECREF(out);
            return NULL;
        }
        h[i] = (int64_t)v;
    }
    if (i == n) return out;
    /* anything else: from a copy of the list, since its __hash__ may be Python code */
    PyObject *ids = PyList_GetSlice(arg, 0, n);
    if (ids == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    for (; i < n; i++) {
        Py_hash_t v = PyObject_Hash(PyList_GET_ITEM(ids, i));
        if (v == -1 && PyErr_Occurred()) {
            Py_CLEAR(out);
            break;
        }
        h[i] = (int64_t)v;
    }
    Py_DECREF(ids);
    return out;
}

/* A present id's sort key — its hash with the sign bit flipped, so unsigned order is the
 * signed order of the hashes — and its position in the list. */
typedef struct {
    uint64_t key;
    int64_t at;
} keyed_t;

#define SIGN_BIT ((uint64_t)1 << 63)
#define SMALL_BUCKET 32

static int keyed_cmp(const void *pa, const void *pb)
{
    const keyed_t *a = pa, *b = pb;
    if (a->key != b->key) return a->key < b->key ? -1 : 1;
    return (a->at > b->at) - (a->at < b->at);
}

/* ``src`` sorted by (key, at) into ``dst``: a counting pass on the keys' top bits (about one
 * bucket per key), then each bucket by insertion, or qsort if it is large. -1: no memory. */
static int sort_keyed(const keyed_t *src, Py_ssize_t m, keyed_t *dst)
{
    int bits = 1;
    while (bits < 20 && ((Py_ssize_t)1 << bits) < m) bits++;
    size_t buckets = (size_t)1 << bits;
    int shift = 64 - bits;
    Py_ssize_t *end = PyMem_Calloc(buckets + 1, sizeof(Py_ssize_t));
    if (end == NULL) return -1;
    for (Py_ssize_t k = 0; k < m; k++) end[(src[k].key >> shift) + 1]++;
    for (size_t b = 0; b < buckets; b++) end[b + 1] += end[b];
    /* end[b] is bucket b's start; each scatter moves it on, to its end */
    for (Py_ssize_t k = 0; k < m; k++) dst[end[src[k].key >> shift]++] = src[k];
    Py_ssize_t lo = 0;
    for (size_t b = 0; b < buckets; b++) {
        Py_ssize_t hi = end[b];
        if (hi - lo > SMALL_BUCKET) {
            qsort(dst + lo, (size_t)(hi - lo), sizeof(keyed_t), keyed_cmp);
        } else {
            for (Py_ssize_t j = lo + 1; j < hi; j++) { /* stable: equal keys keep their order */
                keyed_t v = dst[j];
                Py_ssize_t t = j;
                while (t > lo && dst[t - 1].key > v.key) {
                    dst[t] = dst[t - 1];
                    t--;
                }
                dst[t] = v;
            }
        }
        lo = hi;
    }
    PyMem_Free(end);
    return 0;
}

static PyObject *canonical_users(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *ids;
    Py_buffer present_buf, slots_buf;
    Py_ssize_t max_bytes;
    if (!PyArg_ParseTuple(args, "O!y*w*n:canonical_users", &PyList_Type, &ids, &present_buf,
                          &slots_buf, &max_bytes))
        return NULL;
    PyObject *result = NULL, *rank = NULL, *hashes_out = NULL, *words = NULL, *woff = NULL,
             *lengths = NULL;
    keyed_t *by_list = NULL, *sorted = NULL;
    int64_t *len_of = NULL;
    Py_ssize_t n = PyList_GET_SIZE(ids), m = 0;
    const char *present = present_buf.buf;
    PyObject **slots = slots_buf.buf;
    if (present_buf.len != n) {
        PyErr_SetString(PyExc_ValueError, "canonical_users: one presence byte per id");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) m += present[i] != 0;
    if (slots_buf.len != m * (Py_ssize_t)sizeof(PyObject *)) {
        PyErr_SetString(PyExc_ValueError, "canonical_users: in_order holds one slot per id");
        goto done;
    }
    for (Py_ssize_t k = 0; k < m; k++) { /* a fresh object array: nothing to release */
        if (slots[k] != NULL && slots[k] != Py_None) {
            PyErr_SetString(PyExc_ValueError, "canonical_users: in_order is not empty");
            goto done;
        }
    }
    by_list = PyMem_Malloc((size_t)(m ? m : 1) * sizeof(keyed_t));
    sorted = PyMem_Malloc((size_t)(m ? m : 1) * sizeof(keyed_t));
    len_of = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    if (by_list == NULL || sorted == NULL || len_of == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* 1. each present id's hash and length, in list order (exact str: no Python code runs) */
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!present[i]) continue;
        PyObject *id = PyList_GET_ITEM(ids, i);
        const char *data;
        Py_ssize_t len;
        PyObject *tmp = NULL;
        if (!PyUnicode_CheckExact(id) || !utf8_of(id, &data, &len, &tmp) || len > max_bytes) {
            Py_XDECREF(tmp);
            result = Py_NewRef(Py_None);
            goto done;
        }
        Py_XDECREF(tmp);
        Py_hash_t h = PyObject_Hash(id);
        if (h == -1) goto done;
        len_of[i] = len;
        by_list[k].key = (uint64_t)(int64_t)h ^ SIGN_BIT;
        by_list[k].at = i;
        k++;
    }
    /* 2. sort the positions by hash; a shared hash is the numpy path's to order */
    if (sort_keyed(by_list, m, sorted) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    for (k = 1; k < m; k++) {
        if (sorted[k].key == sorted[k - 1].key) {
            result = Py_NewRef(Py_None);
            goto done;
        }
    }
    rank = PyByteArray_FromStringAndSize(NULL, n * 8);
    hashes_out = PyByteArray_FromStringAndSize(NULL, m * 8);
    woff = PyByteArray_FromStringAndSize(NULL, m * 8);
    lengths = PyByteArray_FromStringAndSize(NULL, m * 8);
    if (rank == NULL || hashes_out == NULL || woff == NULL || lengths == NULL) goto done;
    int64_t *rank_at = (int64_t *)PyByteArray_AS_STRING(rank);
    int64_t *hash_at = (int64_t *)PyByteArray_AS_STRING(hashes_out);
    int64_t *woff_at = (int64_t *)PyByteArray_AS_STRING(woff);
    int64_t *len_at = (int64_t *)PyByteArray_AS_STRING(lengths);
    for (Py_ssize_t i = 0; i < n; i++) rank_at[i] = -1;
    int64_t total = 0;
    for (k = 0; k < m; k++) {
        int64_t i = sorted[k].at;
        rank_at[i] = k;
        hash_at[k] = (int64_t)(sorted[k].key ^ SIGN_BIT);
        len_at[k] = len_of[i];
        woff_at[k] = total;
        total += (len_of[i] + 7) / 8;
    }
    words = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)total * 8);
    if (words == NULL) goto done;
    char *out = PyByteArray_AS_STRING(words);
    memset(out, 0, (size_t)total * 8);
    /* 3. each id's bytes and a reference to it, at its rank, in list order again */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!present[i]) continue;
        PyObject *id = PyList_GET_ITEM(ids, i);
        const char *data;
        Py_ssize_t len;
        PyObject *tmp;
        int64_t r = rank_at[i];
        if (!utf8_of(id, &data, &len, &tmp) || len != len_of[i]) {
            Py_XDECREF(tmp); /* str is immutable and the GIL is held: not expected */
            PyErr_SetString(PyExc_RuntimeError, "canonical_users: an id changed while packing");
            goto done;
        }
        memcpy(out + 8 * woff_at[r], data, (size_t)len);
        Py_XDECREF(tmp);
        PyObject *old = slots[r];
        slots[r] = Py_NewRef(id);
        Py_XDECREF(old); /* None (checked above): releasing it runs nothing */
    }
    result = PyTuple_Pack(5, rank, hashes_out, words, woff, lengths);
done:
    PyBuffer_Release(&present_buf);
    PyBuffer_Release(&slots_buf);
    PyMem_Free(by_list);
    PyMem_Free(sorted);
    PyMem_Free(len_of);
    Py_XDECREF(rank);
    Py_XDECREF(hashes_out);
    Py_XDECREF(words);
    Py_XDECREF(woff);
    Py_XDECREF(lengths);
    return result;
}

/* ``view``'s items as ``itemsize``-byte values: their count, or -1 with ValueError */
static Py_ssize_t items(const Py_buffer *view, Py_ssize_t itemsize, const char *what)
{
    if (view->len % itemsize != 0) {
        PyErr_Format(PyExc_ValueError, "ledger: %s is not a whole number of items", what);
        return -1;
    }
    return view->len / itemsize;
}

/* 1 if the ``nw`` words at ``off`` lie within ``n_words`` */
static inline int words_within(int64_t off, int64_t nw, Py_ssize_t n_words)
{
    return off >= 0 && nw >= 0 && off <= (int64_t)n_words - nw;
}

static PyObject *locate_sorted(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer b[8];
    memset(b, 0, sizeof b);
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*y*:locate_sorted", &b[0], &b[1], &b[2], &b[3],
                          &b[4], &b[5], &b[6], &b[7]))
        return NULL;
    PyObject *result = NULL, *found = NULL, *pos = NULL;
    Py_ssize_t big_n = items(&b[0], 8, "key"), n = items(&b[4], 8, "hashes");
    Py_ssize_t n_words = items(&b[3], 8, "words"), n_qwords = items(&b[7], 8, "qwords");
    if (big_n < 0 || n < 0 || n_words < 0 || n_qwords < 0) goto done;
    if (b[1].len != 2 * big_n || b[2].len != 8 * big_n || b[5].len != 8 * n ||
        b[6].len != 8 * n) {
        PyErr_SetString(PyExc_ValueError, "locate_sorted: columns of different lengths");
        goto done;
    }
    const int64_t *key = b[0].buf, *woff = b[2].buf, *h = b[4].buf, *lengths = b[5].buf,
                  *qwoff = b[6].buf;
    const uint16_t *len = b[1].buf;
    const uint64_t *words = b[3].buf, *qwords = b[7].buf;
    found = PyByteArray_FromStringAndSize(NULL, n * 8);
    pos = PyByteArray_FromStringAndSize(NULL, n * 8);
    if (found == NULL || pos == NULL) goto done;
    int64_t *found_at = (int64_t *)PyByteArray_AS_STRING(found);
    int64_t *pos_at = (int64_t *)PyByteArray_AS_STRING(pos);
    Py_ssize_t j = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i > 0 && h[i] < h[i - 1]) {
            PyErr_SetString(PyExc_ValueError, "locate_sorted: the hashes are not sorted");
            goto done;
        }
        while (j < big_n && key[j] < h[i]) j++;
        pos_at[i] = j;
        found_at[i] = -1;
        for (Py_ssize_t k = j; k < big_n && key[k] == h[i]; k++) {
            if ((int64_t)len[k] != lengths[i]) continue;
            int64_t nw = (lengths[i] + 7) / 8;
            if (!words_within(woff[k], nw, n_words) || !words_within(qwoff[i], nw, n_qwords)) {
                PyErr_SetString(PyExc_ValueError, "locate_sorted: an id outside its words");
                goto done;
            }
            if (nw == 0 || memcmp(words + woff[k], qwords + qwoff[i], (size_t)nw * 8) == 0) {
                found_at[i] = k;
                break;
            }
        }
    }
    result = PyTuple_Pack(2, found, pos);
done:
    for (int i = 0; i < 8; i++) PyBuffer_Release(&b[i]);
    Py_XDECREF(found);
    Py_XDECREF(pos);
    return result;
}

static PyObject *merge_entries(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer b[12];
    memset(b, 0, sizeof b);
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*y*y*y*y*y*:merge_entries", &b[0], &b[1], &b[2],
                          &b[3], &b[4], &b[5], &b[6], &b[7], &b[8], &b[9], &b[10], &b[11]))
        return NULL;
    PyObject *result = NULL, *out[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    Py_ssize_t big_n = items(&b[0], 8, "key"), n = items(&b[6], 8, "nkey");
    Py_ssize_t n_words = items(&b[5], 8, "words"), n_nwords = items(&b[11], 8, "nwords");
    if (big_n < 0 || n < 0 || n_words < 0 || n_nwords < 0) goto done;
    if (b[1].len != 8 * big_n || b[2].len != big_n || b[3].len != 2 * big_n ||
        b[4].len != 8 * big_n || b[7].len != 8 * n || b[8].len != n || b[9].len != 8 * n ||
        b[10].len != 8 * n) {
        PyErr_SetString(PyExc_ValueError, "merge_entries: columns of different lengths");
        goto done;
    }
    const int64_t *key = b[0].buf, *spent = b[1].buf, *woff = b[4].buf;
    const unsigned char *retired = b[2].buf, *nretired = b[8].buf;
    const uint16_t *len = b[3].buf;
    const uint64_t *words = b[5].buf, *nwords = b[11].buf;
    const int64_t *nkey = b[6].buf, *nspent = b[7].buf, *nlen = b[9].buf, *nwoff = b[10].buf;
    int64_t total_words = 0;
    for (Py_ssize_t k = 0; k < big_n; k++) {
        int64_t nw = ((int64_t)len[k] + 7) / 8;
        if (!words_within(woff[k], nw, n_words)) goto outside;
        total_words += nw;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        if (k > 0 && nkey[k] < nkey[k - 1]) {
            PyErr_SetString(PyExc_ValueError, "merge_entries: the new keys are not sorted");
            goto done;
        }
        if (nlen[k] < 0 || nlen[k] > UINT16_MAX) {
            PyErr_SetString(PyExc_ValueError, "merge_entries: an id longer than 65535 bytes");
            goto done;
        }
        int64_t nw = (nlen[k] + 7) / 8;
        if (!words_within(nwoff[k], nw, n_nwords)) goto outside;
        total_words += nw;
    }
    Py_ssize_t m = big_n + n;
    const Py_ssize_t sizes[6] = {8 * m, 8 * m, m, 2 * m, 8 * m, (Py_ssize_t)(8 * total_words)};
    for (int c = 0; c < 6; c++) {
        out[c] = PyByteArray_FromStringAndSize(NULL, sizes[c]);
        if (out[c] == NULL) goto done;
    }
    int64_t *okey = (int64_t *)PyByteArray_AS_STRING(out[0]);
    int64_t *ospent = (int64_t *)PyByteArray_AS_STRING(out[1]);
    unsigned char *oretired = (unsigned char *)PyByteArray_AS_STRING(out[2]);
    uint16_t *olen = (uint16_t *)PyByteArray_AS_STRING(out[3]);
    int64_t *owoff = (int64_t *)PyByteArray_AS_STRING(out[4]);
    uint64_t *owords = (uint64_t *)PyByteArray_AS_STRING(out[5]);
    Py_ssize_t i = 0, j = 0;
    int64_t w = 0;
    for (Py_ssize_t k = 0; k < m; k++) {
        int64_t nw;
        if (j >= n || (i < big_n && key[i] <= nkey[j])) { /* the ledger's first on a tie */
            okey[k] = key[i];
            ospent[k] = spent[i];
            oretired[k] = retired[i];
            olen[k] = len[i];
            nw = ((int64_t)len[i] + 7) / 8;
            if (nw) memcpy(owords + w, words + woff[i], (size_t)nw * 8);
            i++;
        } else {
            okey[k] = nkey[j];
            ospent[k] = nspent[j];
            oretired[k] = nretired[j];
            olen[k] = (uint16_t)nlen[j];
            nw = (nlen[j] + 7) / 8;
            if (nw) memcpy(owords + w, nwords + nwoff[j], (size_t)nw * 8);
            j++;
        }
        owoff[k] = w;
        w += nw;
    }
    result = PyTuple_Pack(6, out[0], out[1], out[2], out[3], out[4], out[5]);
    goto done;
outside:
    PyErr_SetString(PyExc_ValueError, "merge_entries: an id outside its words");
done:
    for (int c = 0; c < 12; c++) PyBuffer_Release(&b[c]);
    for (int c = 0; c < 6; c++) Py_XDECREF(out[c]);
    return result;
}

/* Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2) of ``len`` bytes. */
static uint32_t murmur2(const unsigned char *data, Py_ssize_t len)
{
    const uint32_t m = 0x5bd1e995u;
    uint32_t h = 0x9747b28cu ^ (uint32_t)len;
    Py_ssize_t whole = len & ~(Py_ssize_t)3;
    for (Py_ssize_t i = 0; i < whole; i += 4) {
        uint32_t k = (uint32_t)data[i] | ((uint32_t)data[i + 1] << 8) |
                     ((uint32_t)data[i + 2] << 16) | ((uint32_t)data[i + 3] << 24);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    switch (len & 3) {
    case 3:
        h ^= (uint32_t)data[whole + 2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)data[whole + 1] << 8;
        /* fall through */
    case 1:
        h ^= (uint32_t)data[whole];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return h;
}

static PyObject *key_partitions(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *ids;
    long partitions;
    if (!PyArg_ParseTuple(args, "O!l:key_partitions", &PyList_Type, &ids, &partitions))
        return NULL;
    if (partitions < 1 || partitions > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "key_partitions: partitions must be in 1..2**31-1");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(ids);
    PyObject *out = PyByteArray_FromStringAndSize(NULL, n * 4);
    if (out == NULL) return NULL;
    int32_t *at = (int32_t *)PyByteArray_AS_STRING(out);
    /* utf8_of runs no Python code (str ids only), so the list cannot change under the loop */
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *data;
        Py_ssize_t len;
        PyObject *tmp;
        if (!utf8_of(PyList_GET_ITEM(ids, i), &data, &len, &tmp)) {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        uint32_t h = murmur2((const unsigned char *)data, len);
        Py_XDECREF(tmp);
        at[i] = (int32_t)((h & 0x7fffffffu) % (uint32_t)partitions);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"hashes", hashes, METH_O, "hashes(ids) -> bytearray of int64: hash(id) of each id"},
    {"key_partitions", key_partitions, METH_VARARGS,
     "key_partitions(ids, partitions) -> bytearray of int32 or None: see engine/partitions.py"},
    {"pack_words", pack_words, METH_VARARGS,
     "pack_words(ids, canonical, max_bytes) -> (words, woff, lengths) or None: see "
     "engine/records.py"},
    {"locate_sorted", locate_sorted, METH_VARARGS,
     "locate_sorted(key, len, woff, words, hashes, lengths, qwoff, qwords) -> (found, pos): see "
     "engine/ledger.py"},
    {"merge_entries", merge_entries, METH_VARARGS,
     "merge_entries(ledger columns, new columns) -> merged columns: see engine/ledger.py"},
    {"canonical_users", canonical_users, METH_VARARGS,
     "canonical_users(ids, present, in_order, max_bytes) -> (user_rank, hashes, words, woff, "
     "lengths) or None: see engine/records.py"},
    {"concat_utf8", concat_utf8, METH_O,
     "concat_utf8(ids) -> (text, int32 lengths) or None: see engine/event_ids.py"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_packed_ids",
    .m_doc = "Native packing of ids (engine/records.py, engine/event_ids.py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__packed_ids(void) { return PyModule_Create(&module); }
