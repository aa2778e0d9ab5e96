/* Native checksums of budget rows (runtime/store/schema.py, budget_crcs; docs/design.md §5.1).
 *
 * budget_crcs(users, spent, retired) -> bytearray of int64
 *
 * ``users``: a list of str; ``spent``: an int64 buffer; ``retired``: a buffer of bytes 0 or 1,
 * all of one length. Entry i is ``schema.row_crc(users[i], spent[i], retired[i])``: zlib's CRC-32
 * (IEEE 802.3, reflected, as ``zlib.crc32``) of the row's values, each tagged ``r`` and
 * length-prefixed (8 bytes, little-endian) before its ``repr`` — for an id, ``repr`` of a str.
 * It is computed here only for an id whose ``repr`` is simply the id in single quotes: every
 * character printable ASCII (0x20 to 0x7e) and neither a quote nor a backslash among them (then
 * Python's ``repr`` adds no escape and picks single quotes). Any other id gets -1, and the caller
 * computes its row with ``row_crc``. A retired byte other than 0 or 1 is a ValueError.
 *
 * budget_rows(ids, lengths, spent, retired) -> list of (user, spent, retired, crc) | None
 *
 * The rows the budget log's fold upserts (runtime/store/sqlite.py ``_fold_oldest``), from a
 * packed log row's columns (schema.py ``PackedBudgets``: the ids' UTF-8 back to back, <u4
 * lengths, <i8 spent units, retired bytes): one tuple per entry with its ``row_crc``, sorted by
 * id, entries of one id in their order (what ``sorted(..., key=itemgetter(0))`` gives). Only
 * when every id is plain (as above: then its bytes are its text, and byte order is str order)
 * and the columns agree; else None, and the caller takes the Python path (which names a
 * corrupt row).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static uint32_t crc_table[256];

static void make_table(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[n] = c;
    }
}

/* the running CRC (pre- and post-inverted by the caller) over ``len`` bytes */
static inline uint32_t crc_update(uint32_t c, const unsigned char *p, size_t len)
{
    while (len--) c = crc_table[(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c;
}

/* a value's head: the tag ``r`` and its length as 8 bytes, little-endian */
static inline uint32_t crc_head(uint32_t c, uint64_t length)
{
    unsigned char head[9];
    head[0] = 'r';
    for (int k = 0; k < 8; k++) head[1 + k] = (unsigned char)(length >> (8 * k));
    return crc_update(c, head, sizeof head);
}

/* 1 if ``repr(id)`` is ``'`` + id + ``'`` (see the header), else 0 */
static int plain_repr(PyObject *id)
{
    if (!PyUnicode_IS_ASCII(id)) return 0;
    const unsigned char *s = PyUnicode_1BYTE_DATA(id);
    Py_ssize_t n = PyUnicode_GET_LENGTH(id);
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char ch = s[i];
        if (ch < 0x20 || ch > 0x7e || ch == '\'' || ch == '\\') return 0;
    }
    return 1;
}

/* CRC-32 of a row whose id is plain (``len`` bytes at ``id``) */
static int64_t row_crc_plain(const unsigned char *id, Py_ssize_t len, int64_t spent, int retired)
{
    char digits[24];
    int nd = snprintf(digits, sizeof digits, "%lld", (long long)spent);
    uint32_t c = 0xFFFFFFFFu;
    c = crc_head(c, (uint64_t)len + 2);
    c = crc_update(c, (const unsigned char *)"'", 1);
    c = crc_update(c, id, (size_t)len);
    c = crc_update(c, (const unsigned char *)"'", 1);
    c = crc_head(c, (uint64_t)nd);
    c = crc_update(c, (const unsigned char *)digits, (size_t)nd);
    c = crc_head(c, 1);
    c = crc_update(c, (const unsigned char *)(retired ? "1" : "0"), 1);
    return (int64_t)(c ^ 0xFFFFFFFFu);
}

static PyObject *budget_crcs(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *users;
    Py_buffer spent = {0}, retired = {0};
    if (!PyArg_ParseTuple(args, "O!y*y*:budget_crcs", &PyList_Type, &users, &spent, &retired))
        return NULL;
    PyObject *out = NULL;
    Py_ssize_t n = PyList_GET_SIZE(users);
    if (spent.len != n * 8 || retired.len != n) {
        PyErr_SetString(PyExc_ValueError,
                        "budget_crcs: one int64 spent and one retired byte per user");
        goto done;
    }
    const int64_t *sp = spent.buf;
    const unsigned char *rt = retired.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (rt[i] > 1) {
            PyErr_SetString(PyExc_ValueError, "budget_crcs: a retired byte is 0 or 1");
            goto done;
        }
    }
    out = PyByteArray_FromStringAndSize(NULL, n * 8);
    if (out == NULL) goto done;
    int64_t *crc = (int64_t *)PyByteArray_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *id = PyList_GET_ITEM(users, i);
        if (!PyUnicode_CheckExact(id) || !plain_repr(id)) {
            crc[i] = -1;
            continue;
        }
        crc[i] = row_crc_plain(PyUnicode_1BYTE_DATA(id), PyUnicode_GET_LENGTH(id), sp[i], rt[i]);
    }
done:
    PyBuffer_Release(&spent);
    PyBuffer_Release(&retired);
    return out;
}

/* little-endian integers of a packed log row, on any build */
static inline uint32_t le_u32(const unsigned char *b)
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static inline int64_t le_i64(const unsigned char *b)
{
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--) v = v << 8 | b[k];
    int64_t out;
    memcpy(&out, &v, sizeof out);
    return out;
}

typedef struct {
    const unsigned char *id;
    uint32_t len;
    Py_ssize_t at; /* the entry's position: equal ids keep their order */
} Entry;

static int entry_cmp(const void *pa, const void *pb)
{
    const Entry *a = pa, *b = pb;
    uint32_t n = a->len < b->len ? a->len : b->len;
    int c = n ? memcmp(a->id, b->id, n) : 0;
    if (c != 0) return c;
    if (a->len != b->len) return a->len < b->len ? -1 : 1;
    return (a->at > b->at) - (a->at < b->at);
}

static PyObject *budget_rows(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer ids = {0}, lengths = {0}, spent = {0}, retired = {0};
    if (!PyArg_ParseTuple(args, "y*y*y*y*:budget_rows", &ids, &lengths, &spent, &retired))
        return NULL;
    PyObject *out = NULL;
    Entry *entries = NULL;
    Py_ssize_t n = retired.len;
    const unsigned char *text = ids.buf, *rt = retired.buf, *sp = spent.buf;
    if (lengths.len != 4 * n || spent.len != 8 * n) goto not_here;
    entries = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(Entry));
    if (entries == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t len = le_u32((const unsigned char *)lengths.buf + 4 * i);
        if (rt[i] > 1 || (Py_ssize_t)len > ids.len - at) goto not_here;
        for (uint32_t j = 0; j < len; j++) {
            unsigned char ch = text[at + j];
            if (ch < 0x20 || ch > 0x7e || ch == '\'' || ch == '\\') goto not_here;
        }
        entries[i] = (Entry){text + at, len, i};
        at += len;
    }
    if (at != ids.len) goto not_here;
    qsort(entries, (size_t)n, sizeof(Entry), entry_cmp);
    out = PyList_New(n);
    if (out == NULL) goto done;
    for (Py_ssize_t k = 0; k < n; k++) {
        const Entry *e = &entries[k];
        int64_t spent_i = le_i64(sp + 8 * e->at);
        int retired_i = rt[e->at];
        PyObject *row = PyTuple_New(4);
        if (row == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, k, row);
        PyObject *user = PyUnicode_New((Py_ssize_t)e->len, 127); /* plain: ASCII */
        if (user != NULL) memcpy(PyUnicode_1BYTE_DATA(user), e->id, e->len);
        PyTuple_SET_ITEM(row, 0, user);
        PyTuple_SET_ITEM(row, 1, PyLong_FromLongLong(spent_i));
        PyTuple_SET_ITEM(row, 2, PyLong_FromLong(retired_i));
        PyTuple_SET_ITEM(row, 3,
                         PyLong_FromLongLong(row_crc_plain(e->id, e->len, spent_i, retired_i)));
        for (int f = 0; f < 4; f++) {
            if (PyTuple_GET_ITEM(row, f) == NULL) { /* no memory: the list is dropped whole */
                Py_CLEAR(out);
                goto done;
            }
        }
    }
    goto done;
not_here:
    out = Py_NewRef(Py_None);
done:
    PyMem_Free(entries);
    PyBuffer_Release(&ids);
    PyBuffer_Release(&lengths);
    PyBuffer_Release(&spent);
    PyBuffer_Release(&retired);
    return out;
}

static PyMethodDef methods[] = {
    {"budget_crcs", budget_crcs, METH_VARARGS,
     "budget_crcs(users, spent, retired) -> bytearray of int64: each row's row_crc, -1 where "
     "the caller must compute it (see runtime/store/schema.py)"},
    {"budget_rows", budget_rows, METH_VARARGS,
     "budget_rows(ids, lengths, spent, retired) -> the fold's rows sorted by id, or None: see "
     "runtime/store/sqlite.py"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_row_crc",
    .m_doc = "Native checksums of budget rows (runtime/store/schema.py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__row_crc(void)
{
    make_table();
    return PyModule_Create(&module);
}
