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
        const unsigned char *s = PyUnicode_1BYTE_DATA(id);
        Py_ssize_t len = PyUnicode_GET_LENGTH(id);
        char digits[24];
        int nd = snprintf(digits, sizeof digits, "%lld", (long long)sp[i]);
        uint32_t c = 0xFFFFFFFFu;
        c = crc_head(c, (uint64_t)len + 2);
        c = crc_update(c, (const unsigned char *)"'", 1);
        c = crc_update(c, s, (size_t)len);
        c = crc_update(c, (const unsigned char *)"'", 1);
        c = crc_head(c, (uint64_t)nd);
        c = crc_update(c, (const unsigned char *)digits, (size_t)nd);
        c = crc_head(c, 1);
        c = crc_update(c, (const unsigned char *)(rt[i] ? "1" : "0"), 1);
        crc[i] = (int64_t)(c ^ 0xFFFFFFFFu);
    }
done:
    PyBuffer_Release(&spent);
    PyBuffer_Release(&retired);
    return out;
}

static PyMethodDef methods[] = {
    {"budget_crcs", budget_crcs, METH_VARARGS,
     "budget_crcs(users, spent, retired) -> bytearray of int64: each row's row_crc, -1 where "
     "the caller must compute it (see runtime/store/schema.py)"},
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
