/* Native column scanner for the daemon's hot path (engine/ingest.py, docs/design.md §8.4).
 *
 * scan_columns(lines, names, kinds, limits) -> (user_ids, days, event_ids, columns) | None
 *
 * Scans a batch of JSON lines that all carry exactly the schema's features (``names``: UTF-8
 * bytes of each feature name; ``kinds``: bytes, 1 for a category, 0 for a number) straight into
 * columns: a ``str`` per user id and event id, one shared ``str`` per distinct day and per
 * recent category value, and one float64 ``bytearray`` per numeric feature. No Python object is
 * made per number and none per event beyond its ids.
 *
 * The scanner only ever *accepts*. It takes a narrow, plain form of the contract — one JSON
 * object per line, its keys without escapes and never repeated, every string value ASCII with
 * no escape, every number within the contract's bound — and returns None for the whole batch on
 * anything else, so that ``parse_event``, the reference, decides (and gives the reason). A user
 * id holding DEL (0x7f, a control character: the other ASCII ones cannot appear raw in a JSON
 * string) is not accepted either. For the lines it accepts, each value is what ``parse_event``
 * gives:
 *   - strings: without an escape a JSON string is its bytes; ASCII makes the character count
 *     the byte count and the text valid UTF-8, so the length limits are checked on bytes;
 *   - numbers: the RFC 8259 grammar is checked here; an integer literal (``json.loads`` gives an
 *     ``int``, the contract ``float(int)``) of at most 15 digits is exact in a double, so it is
 *     converted exactly (``-0`` is +0.0, as ``float(0)``); a decimal without exponent of at
 *     most 15 digits in all, ``M / 10^k`` with M < 10^15 and k <= 15, is the division of two
 *     doubles that are both exact (M < 2^53, 10^k <= 10^22), which IEEE 754 rounds correctly:
 *     the correctly rounded value of the literal (Clinger's fast path; the sign applied after,
 *     so ``-0.0`` is -0.0 as ``float("-0.0")``); any other literal is converted by
 *     ``PyOS_string_to_double``, the correctly rounded conversion ``float(str)`` (and so
 *     ``json.loads``) uses; a result beyond ``max_abs`` or not finite is not accepted here;
 *   - the day is returned as is; the caller checks every distinct day (``ingest.day_ok``).
 * Every read is bounded by the line's end; nothing is written past a buffer sized up front.
 *
 * scan_spans(block, starts, ends, names, kinds, limits, id_spans=False) is scan_columns of the
 * lines block[starts[i]:ends[i]], read in place (engine/lines.py, BlockLines: the file source's
 * read block, no bytes object per line); every span is checked to lie within the block first.
 * With ``id_spans`` the event ids are not made into str: the third item is (starts, lengths),
 * bytearrays of int64 offsets into the block and int32 lengths (-1: no id), each id an ASCII
 * span without escapes, so its bytes are its text (engine/lines.py, EventIdSpans);
 * ids_of(block, starts, lengths) makes them str (None for -1) when a path needs a list.
 * scan_events(lines, event_type, feature_kinds, limits) and scan_event_spans(block, starts,
 * ends, event_type, feature_kinds, limits) take a batch of any schemas, line by line: per line
 * the event_type (a tuple subclass: contract.Event) of (user_id, day, values, event_id) of the
 * same plain form (``values`` a dict of at most 256 features, each name of 1 to
 * ``max_feature_chars`` ASCII characters without '='; a name in ``feature_kinds``, a dict name ->
 * True for a category / False for a number, must have a value of that kind), or None where the
 * line is not in it; and the set of the days read. ``engine.ingest.parse_events`` hands the
 * lines left, and those of a day it refuses, to ``parse_event``.
 * split_lines(block, need, final) finds those spans: the file source's line rule, in
 * engine/lines.py (split_lines, and its Python twin the tests compare it with). lines_of(block,
 * starts, ends) makes the lines as bytes when a per-line path needs them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

#define MAX_FEATURES 256
#define MAX_DAYS 8
#define CACHED_CATEGORIES 8
#define MAX_NUMBER_CHARS 64
#define MAX_INT_DIGITS 15

typedef struct {
    const char *p;
    const char *end;
} Cursor;

typedef struct {
    const char *text;
    Py_ssize_t len;
    PyObject *str; /* owned */
} Interned;

typedef struct {
    Py_ssize_t max_event_bytes;
    Py_ssize_t max_id_chars;
    Py_ssize_t max_category_chars;
    double max_abs;
} Limits;

static inline int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static inline int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static inline void skip_ws(Cursor *c)
{
    while (c->p < c->end && is_ws((unsigned char)*c->p)) c->p++;
}

static inline int expect(Cursor *c, char ch)
{
    skip_ws(c);
    if (c->p >= c->end || *c->p != ch) return 0;
    c->p++;
    return 1;
}

/* A string without escapes or control characters (and, if ascii_only, only ASCII bytes): its
 * content's span; the cursor moves past the closing quote. */
static int plain_string(Cursor *c, const char **text, Py_ssize_t *len, int ascii_only)
{
    skip_ws(c);
    if (c->p >= c->end || *c->p != '"') return 0;
    const char *start = ++c->p;
    const char *q = start;
    while (q < c->end) {
        unsigned char ch = (unsigned char)*q;
        if (ch == '"') break;
        if (ch == '\\' || ch < 0x20 || (ascii_only && ch >= 0x80)) return 0;
        q++;
    }
    if (q >= c->end) return 0;
    *text = start;
    *len = q - start;
    c->p = q + 1;
    return 1;
}

/* A JSON number as the contract's float (see the header); 0 if not accepted here. */
static int number(Cursor *c, double max_abs, double *out)
{
    skip_ws(c);
    const char *s = c->p, *q = s, *end = c->end;
    int negative = 0, integer = 1;
    if (q < end && *q == '-') {
        negative = 1;
        q++;
    }
    const char *digits = q;
    if (q >= end) return 0;
    if (*q == '0')
        q++;
    else if (*q >= '1' && *q <= '9')
        while (q < end && is_digit((unsigned char)*q)) q++;
    else
        return 0;
    Py_ssize_t n_digits = q - digits;
    const char *fraction = NULL; /* the first digit after the point */
    if (q < end && *q == '.') {
        integer = 0;
        q++;
        if (q >= end || !is_digit((unsigned char)*q)) return 0;
        fraction = q;
        while (q < end && is_digit((unsigned char)*q)) q++;
    }
    int exponent = 0;
    if (q < end && (*q == 'e' || *q == 'E')) {
        exponent = 1;
        integer = 0;
        q++;
        if (q < end && (*q == '+' || *q == '-')) q++;
        if (q >= end || !is_digit((unsigned char)*q)) return 0;
        while (q < end && is_digit((unsigned char)*q)) q++;
    }
    Py_ssize_t n = q - s;
    if (n > MAX_NUMBER_CHARS) return 0;
    double v;
    if (integer) {
        if (n_digits > MAX_INT_DIGITS) return 0;
        long long m = 0;
        for (const char *d = digits; d < q; d++) m = m * 10 + (*d - '0');
        v = (double)(negative ? -m : m); /* exact below 2**53; -0 → +0.0 like float(0) */
    }
    else if (!exponent && n_digits + (q - fraction) <= MAX_INT_DIGITS) {
        static const double powers_of_ten[MAX_INT_DIGITS + 1] = {
            1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15};
        long long m = 0;
        for (const char *d = digits; d < q; d++)
            if (*d != '.') m = m * 10 + (*d - '0');
        double magnitude = (double)m / powers_of_ten[q - fraction]; /* one correct rounding */
        v = negative ? -magnitude : magnitude;
    }
    else {
        char buf[MAX_NUMBER_CHARS + 1];
        memcpy(buf, s, (size_t)n);
        buf[n] = '\0';
        v = PyOS_string_to_double(buf, NULL, NULL);
        if (v == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
    }
    if (!isfinite(v) || fabs(v) > max_abs) return 0;
    *out = v;
    c->p = q;
    return 1;
}

static PyObject *ascii_str(const char *text, Py_ssize_t len)
{
    PyObject *s = PyUnicode_New(len, 127);
    if (s != NULL) memcpy(PyUnicode_1BYTE_DATA(s), text, (size_t)len);
    return s;
}

/* A new reference to the str of ``text`` from ``table`` (``*used`` entries), adding it while
 * the table has room; NULL with an exception on failure. */
static PyObject *interned(Interned *table, int *used, int size, const char *text, Py_ssize_t len)
{
    for (int i = 0; i < *used; i++)
        if (table[i].len == len && memcmp(table[i].text, text, (size_t)len) == 0) {
            Py_INCREF(table[i].str);
            return table[i].str;
        }
    PyObject *s = ascii_str(text, len);
    if (s != NULL && *used < size) {
        table[*used].text = text;
        table[*used].len = len;
        table[*used].str = s;
        Py_INCREF(s);
        (*used)++;
    }
    return s;
}

typedef struct {
    Py_ssize_t k;
    const char *name[MAX_FEATURES];
    Py_ssize_t name_len[MAX_FEATURES];
    char categorical[MAX_FEATURES];
    PyObject *users, *days, *event_ids, *columns;
    /* scan_spans with id_spans: each event id as (offset in ``base``, length; -1: none) in
     * ``id_start``/``id_len`` (the bytearrays ``id_starts``/``id_lengths``), no str */
    const char *base;
    int64_t *id_start;
    int32_t *id_len;
    PyObject *id_starts, *id_lengths;
    double *numbers[MAX_FEATURES];
    PyObject *categories[MAX_FEATURES];
    Interned day_table[MAX_DAYS];
    int days_used;
    Interned cat_table[MAX_FEATURES][CACHED_CATEGORIES];
    int cats_used[MAX_FEATURES];
    Limits limits;
} Scan;

enum { SCANNED = 1, NOT_PLAIN = 0, FAILED = -1 };

/* The index of the feature named ``text``, or -1; the expected position is tried first. */
static Py_ssize_t feature_index(const Scan *s, const char *text, Py_ssize_t len, Py_ssize_t guess)
{
    if (guess < s->k && s->name_len[guess] == len && memcmp(s->name[guess], text, (size_t)len) == 0)
        return guess;
    for (Py_ssize_t j = 0; j < s->k; j++)
        if (s->name_len[j] == len && memcmp(s->name[j], text, (size_t)len) == 0) return j;
    return -1;
}

static int scan_values(Scan *s, Cursor *c, Py_ssize_t row)
{
    char seen[MAX_FEATURES];
    memset(seen, 0, (size_t)s->k);
    Py_ssize_t count = 0;
    if (!expect(c, '{')) return NOT_PLAIN;
    skip_ws(c);
    if (c->p < c->end && *c->p == '}') return NOT_PLAIN; /* a schema has at least one feature */
    for (;;) {
        const char *key;
        Py_ssize_t key_len;
        if (!plain_string(c, &key, &key_len, 0) || !expect(c, ':')) return NOT_PLAIN;
        Py_ssize_t j = feature_index(s, key, key_len, count);
        if (j < 0 || seen[j]) return NOT_PLAIN;
        seen[j] = 1;
        count++;
        if (s->categorical[j]) {
            const char *text;
            Py_ssize_t len;
            if (!plain_string(c, &text, &len, 1) || len > s->limits.max_category_chars)
                return NOT_PLAIN;
            PyObject *v = interned(s->cat_table[j], &s->cats_used[j], CACHED_CATEGORIES, text, len);
            if (v == NULL) return FAILED;
            PyList_SET_ITEM(s->categories[j], row, v);
        }
        else if (!number(c, s->limits.max_abs, &s->numbers[j][row]))
            return NOT_PLAIN;
        skip_ws(c);
        if (c->p < c->end && *c->p == ',') {
            c->p++;
            continue;
        }
        if (!expect(c, '}')) return NOT_PLAIN;
        return count == s->k ? SCANNED : NOT_PLAIN;
    }
}

static int scan_line(Scan *s, const char *line, Py_ssize_t n, Py_ssize_t row)
{
    Cursor c = {line, line + n};
    int have_user = 0, have_day = 0, have_event_id = 0, have_values = 0;
    if (!expect(&c, '{')) return NOT_PLAIN;
    for (;;) {
        const char *key, *text;
        Py_ssize_t key_len, len;
        if (!plain_string(&c, &key, &key_len, 1) || !expect(&c, ':')) return NOT_PLAIN;
        if (key_len == 7 && memcmp(key, "user_id", 7) == 0) {
            if (have_user++ || !plain_string(&c, &text, &len, 1) || len < 1 ||
                len > s->limits.max_id_chars || memchr(text, 0x7f, (size_t)len) != NULL)
                return NOT_PLAIN;
            PyObject *v = ascii_str(text, len);
            if (v == NULL) return FAILED;
            PyList_SET_ITEM(s->users, row, v);
        }
        else if (key_len == 3 && memcmp(key, "day", 3) == 0) {
            if (have_day++ || !plain_string(&c, &text, &len, 1)) return NOT_PLAIN;
            PyObject *v = interned(s->day_table, &s->days_used, MAX_DAYS, text, len);
            if (v == NULL) return FAILED;
            PyList_SET_ITEM(s->days, row, v);
            int known = 0;
            for (int i = 0; i < s->days_used; i++) known |= (v == s->day_table[i].str);
            if (!known) return NOT_PLAIN; /* more distinct days than the table holds */
        }
        else if (key_len == 8 && memcmp(key, "event_id", 8) == 0) {
            if (have_event_id++) return NOT_PLAIN;
            skip_ws(&c);
            if (c.end - c.p >= 4 && memcmp(c.p, "null", 4) == 0) {
                c.p += 4;
                if (s->id_start != NULL) {
                    s->id_start[row] = 0;
                    s->id_len[row] = -1;
                } else {
                    PyList_SET_ITEM(s->event_ids, row, Py_NewRef(Py_None));
                }
            }
            else {
                if (!plain_string(&c, &text, &len, 1) || len < 1 || len > s->limits.max_id_chars)
                    return NOT_PLAIN;
                if (s->id_start != NULL) { /* ASCII (plain_string's check): its bytes are its text */
                    s->id_start[row] = (int64_t)(text - s->base);
                    s->id_len[row] = (int32_t)len;
                } else {
                    PyObject *v = ascii_str(text, len);
                    if (v == NULL) return FAILED;
                    PyList_SET_ITEM(s->event_ids, row, v);
                }
            }
        }
        else if (key_len == 6 && memcmp(key, "values", 6) == 0) {
            if (have_values++) return NOT_PLAIN;
            int r = scan_values(s, &c, row);
            if (r != SCANNED) return r;
        }
        else
            return NOT_PLAIN;
        skip_ws(&c);
        if (c.p < c.end && *c.p == ',') {
            c.p++;
            continue;
        }
        if (!expect(&c, '}')) return NOT_PLAIN;
        skip_ws(&c);
        if (c.p != c.end || !have_user || !have_day || !have_values) return NOT_PLAIN;
        if (!have_event_id) {
            if (s->id_start != NULL) {
                s->id_start[row] = 0;
                s->id_len[row] = -1;
            } else {
                PyList_SET_ITEM(s->event_ids, row, Py_NewRef(Py_None));
            }
        }
        return SCANNED;
    }
}

static void release_tables(Scan *s)
{
    for (int i = 0; i < s->days_used; i++) Py_DECREF(s->day_table[i].str);
    for (Py_ssize_t j = 0; j < s->k; j++)
        for (int i = 0; i < s->cats_used[j]; i++) Py_DECREF(s->cat_table[j][i].str);
}

/* The lines to scan: Python bytes objects (``items``), or spans [starts[i], ends[i]) of one
 * buffer (``block``, the source's read block: no object per line). */
typedef struct {
    PyObject **items;
    const char *block;
    const int64_t *starts;
    const int64_t *ends;
    int id_spans; /* block lines only: event ids as spans of the block */
} Lines;

/* scan_columns' and scan_spans' common body: the schema from ``names``/``kinds``, then every
 * line; the 4-tuple, None (a line not plain) or NULL with an exception. */
static PyObject *scan_lines(Scan *s, PyObject *names, const char *kinds, Py_ssize_t n_kinds,
                            const Lines *in, Py_ssize_t n)
{
    PyObject *result = NULL;
    Py_ssize_t k = PyTuple_GET_SIZE(names);
    if (k < 1 || k > MAX_FEATURES || n_kinds != k) {
        PyErr_SetString(PyExc_ValueError, "scan_columns: 1 to 256 features, one kind each");
        goto done;
    }
    s->k = k;
    for (Py_ssize_t j = 0; j < s->k; j++) {
        PyObject *name = PyTuple_GET_ITEM(names, j);
        if (!PyBytes_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "scan_columns: feature names must be bytes");
            goto done;
        }
        s->name[j] = PyBytes_AS_STRING(name);
        s->name_len[j] = PyBytes_GET_SIZE(name);
        s->categorical[j] = kinds[j] != 0;
    }
    s->users = PyList_New(n);
    s->days = PyList_New(n);
    if (in->id_spans) {
        s->id_starts = PyByteArray_FromStringAndSize(NULL, n * 8);
        s->id_lengths = PyByteArray_FromStringAndSize(NULL, n * 4);
        if (s->id_starts == NULL || s->id_lengths == NULL) goto done;
        s->base = in->block;
        s->id_start = (int64_t *)PyByteArray_AS_STRING(s->id_starts);
        s->id_len = (int32_t *)PyByteArray_AS_STRING(s->id_lengths);
        s->event_ids = PyTuple_Pack(2, s->id_starts, s->id_lengths);
    } else {
        s->event_ids = PyList_New(n);
    }
    s->columns = PyList_New(s->k);
    if (s->users == NULL || s->days == NULL || s->event_ids == NULL || s->columns == NULL)
        goto done;
    for (Py_ssize_t j = 0; j < s->k; j++) {
        PyObject *col = s->categorical[j] ? PyList_New(n) : PyByteArray_FromStringAndSize(NULL, n * 8);
        if (col == NULL) goto done;
        PyList_SET_ITEM(s->columns, j, col);
        if (s->categorical[j])
            s->categories[j] = col;
        else
            s->numbers[j] = (double *)PyByteArray_AS_STRING(col);
    }
    int status = SCANNED;
    for (Py_ssize_t row = 0; row < n; row++) {
        const char *text;
        Py_ssize_t len;
        if (in->items != NULL) {
            PyObject *line = in->items[row];
            if (!PyBytes_Check(line)) {
                status = NOT_PLAIN;
                break;
            }
            text = PyBytes_AS_STRING(line);
            len = PyBytes_GET_SIZE(line);
        } else {
            text = in->block + in->starts[row];
            len = (Py_ssize_t)(in->ends[row] - in->starts[row]);
        }
        if (len > s->limits.max_event_bytes)
            status = NOT_PLAIN;
        else
            status = scan_line(s, text, len, row);
        if (status != SCANNED) break;
    }
    if (status == FAILED) goto done;
    if (status == NOT_PLAIN) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    result = PyTuple_Pack(4, s->users, s->days, s->event_ids, s->columns);
done:
    release_tables(s);
    Py_XDECREF(s->users);
    Py_XDECREF(s->days);
    Py_XDECREF(s->event_ids);
    Py_XDECREF(s->id_starts);
    Py_XDECREF(s->id_lengths);
    Py_XDECREF(s->columns);
    return result;
}

static PyObject *scan_columns(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *lines_arg, *names;
    const char *kinds;
    Py_ssize_t n_kinds;
    Scan *s = PyMem_Calloc(1, sizeof(Scan));
    if (s == NULL) return PyErr_NoMemory();
    PyObject *result = NULL, *lines = NULL;
    if (!PyArg_ParseTuple(args, "OO!y#(nnnd):scan_columns", &lines_arg, &PyTuple_Type, &names,
                          &kinds, &n_kinds, &s->limits.max_event_bytes, &s->limits.max_id_chars,
                          &s->limits.max_category_chars, &s->limits.max_abs))
        goto done;
    lines = PySequence_Fast(lines_arg, "scan_columns: lines must be a sequence");
    if (lines == NULL) goto done;
    Lines in = {.items = PySequence_Fast_ITEMS(lines)};
    result = scan_lines(s, names, kinds, n_kinds, &in, PySequence_Fast_GET_SIZE(lines));
done:
    Py_XDECREF(lines);
    PyMem_Free(s);
    return result;
}

/* The spans [starts[i], ends[i]) of ``block``, checked: int64 buffers of one length, each span
 * within the block; -1 with ValueError otherwise. */
static Py_ssize_t check_spans(const Py_buffer *block, const Py_buffer *starts,
                              const Py_buffer *ends)
{
    if (starts->len != ends->len || starts->len % 8 != 0) {
        PyErr_SetString(PyExc_ValueError, "spans: starts and ends are int64 buffers of one length");
        return -1;
    }
    Py_ssize_t n = starts->len / 8;
    const int64_t *a = starts->buf, *b = ends->buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (a[i] < 0 || a[i] > b[i] || b[i] > (int64_t)block->len) {
            PyErr_SetString(PyExc_ValueError, "spans: a span outside its block");
            return -1;
        }
    }
    return n;
}

static PyObject *scan_spans(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer block = {0}, starts = {0}, ends = {0};
    PyObject *names;
    const char *kinds;
    Py_ssize_t n_kinds;
    int id_spans = 0;
    Scan *s = PyMem_Calloc(1, sizeof(Scan));
    if (s == NULL) return PyErr_NoMemory();
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*y*y*O!y#(nnnd)|p:scan_spans", &block, &starts, &ends,
                          &PyTuple_Type, &names, &kinds, &n_kinds, &s->limits.max_event_bytes,
                          &s->limits.max_id_chars, &s->limits.max_category_chars,
                          &s->limits.max_abs, &id_spans))
        goto done;
    Py_ssize_t n = check_spans(&block, &starts, &ends);
    if (n < 0) goto done;
    Lines in = {.block = block.buf, .starts = starts.buf, .ends = ends.buf, .id_spans = id_spans};
    result = scan_lines(s, names, kinds, n_kinds, &in, n);
done:
    PyBuffer_Release(&block);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&ends);
    PyMem_Free(s);
    return result;
}

/* ---------------------------------------------------------------- scan_events: any schema */

#define CACHED_NAMES 64
#define CACHED_VALUES 64

typedef struct {
    Limits limits;
    Py_ssize_t max_feature_chars;
    PyObject *kinds; /* dict feature -> bool (True: a category), may be empty */
    PyTypeObject *event_type; /* a tuple subclass of 4 fields */
    PyObject *days_seen;      /* set */
    Interned days[MAX_DAYS];
    int days_used;
    Interned names[CACHED_NAMES];
    int names_used;
    Interned values[CACHED_VALUES];
    int values_used;
} EventScan;

static void release_event_tables(EventScan *s)
{
    Py_XDECREF(s->days_seen);
    for (int i = 0; i < s->days_used; i++) Py_DECREF(s->days[i].str);
    for (int i = 0; i < s->names_used; i++) Py_DECREF(s->names[i].str);
    for (int i = 0; i < s->values_used; i++) Py_DECREF(s->values[i].str);
}

/* The values object into ``values`` (a new dict); SCANNED, NOT_PLAIN or FAILED. */
static int event_values(EventScan *s, Cursor *c, PyObject *values)
{
    if (!expect(c, '{')) return NOT_PLAIN;
    skip_ws(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        return SCANNED;
    }
    for (;;) {
        const char *key, *text;
        Py_ssize_t key_len, len;
        if (!plain_string(c, &key, &key_len, 1) || key_len < 1 ||
            key_len > s->max_feature_chars || memchr(key, '=', (size_t)key_len) != NULL ||
            !expect(c, ':') || PyDict_GET_SIZE(values) >= MAX_FEATURES)
            return NOT_PLAIN;
        PyObject *name = interned(s->names, &s->names_used, CACHED_NAMES, key, key_len);
        if (name == NULL) return FAILED;
        int status = SCANNED;
        PyObject *value = NULL;
        skip_ws(c);
        int category = c->p < c->end && *c->p == '"';
        PyObject *kind = PyDict_GetItemWithError(s->kinds, name); /* borrowed */
        if (kind == NULL && PyErr_Occurred())
            status = FAILED;
        else if (PyDict_Contains(values, name) != 0 || (kind != NULL && (kind == Py_True) != category))
            status = NOT_PLAIN; /* a repeated feature (or an error), or a value of the other kind */
        else if (category) {
            if (!plain_string(c, &text, &len, 1) || len > s->limits.max_category_chars)
                status = NOT_PLAIN;
            else if ((value = interned(s->values, &s->values_used, CACHED_VALUES, text, len)) == NULL)
                status = FAILED;
        } else {
            double x;
            if (!number(c, s->limits.max_abs, &x))
                status = NOT_PLAIN;
            else if ((value = PyFloat_FromDouble(x)) == NULL)
                status = FAILED;
        }
        if (status == SCANNED && PyDict_SetItem(values, name, value) < 0) status = FAILED;
        Py_DECREF(name);
        Py_XDECREF(value);
        if (PyErr_Occurred()) return FAILED;
        if (status != SCANNED) return status;
        skip_ws(c);
        if (c->p < c->end && *c->p == ',') {
            c->p++;
            continue;
        }
        return expect(c, '}') ? SCANNED : NOT_PLAIN;
    }
}

/* One line as (user_id, day, values, event_id) in ``*out``; SCANNED, NOT_PLAIN or FAILED. */
static int event_line(EventScan *s, const char *line, Py_ssize_t n, PyObject **out)
{
    PyObject *field[4] = {NULL, NULL, NULL, NULL}; /* user_id, day, values, event_id */
    int status = NOT_PLAIN;
    Cursor c = {line, line + n};
    if (n > s->limits.max_event_bytes || !expect(&c, '{')) goto done;
    for (;;) {
        const char *key, *text;
        Py_ssize_t key_len, len;
        if (!plain_string(&c, &key, &key_len, 1) || !expect(&c, ':')) goto done;
        int f = key_len == 7 && memcmp(key, "user_id", 7) == 0    ? 0
                : key_len == 3 && memcmp(key, "day", 3) == 0      ? 1
                : key_len == 6 && memcmp(key, "values", 6) == 0   ? 2
                : key_len == 8 && memcmp(key, "event_id", 8) == 0 ? 3
                                                                  : -1;
        if (f < 0 || field[f] != NULL) goto done; /* unknown or repeated */
        skip_ws(&c);
        if (f == 2) {
            if ((field[2] = PyDict_New()) == NULL) {
                status = FAILED;
                goto done;
            }
            int r = event_values(s, &c, field[2]);
            if (r != SCANNED) {
                status = r;
                goto done;
            }
        } else if (f == 3 && c.end - c.p >= 4 && memcmp(c.p, "null", 4) == 0) {
            c.p += 4;
            field[3] = Py_NewRef(Py_None);
        } else {
            if (!plain_string(&c, &text, &len, 1)) goto done;
            if (f != 1 && (len < 1 || len > s->limits.max_id_chars)) goto done;
            if (f == 0 && memchr(text, 0x7f, (size_t)len) != NULL) goto done;
            field[f] = f == 1 ? interned(s->days, &s->days_used, MAX_DAYS, text, len)
                              : ascii_str(text, len);
            if (field[f] == NULL) {
                status = FAILED;
                goto done;
            }
        }
        skip_ws(&c);
        if (c.p < c.end && *c.p == ',') {
            c.p++;
            continue;
        }
        if (!expect(&c, '}')) goto done;
        skip_ws(&c);
        if (c.p != c.end || field[0] == NULL || field[1] == NULL || field[2] == NULL) goto done;
        if (field[3] == NULL) field[3] = Py_NewRef(Py_None);
        /* a tuple subclass instance as tuple.__new__ makes one: tp_alloc, then the items */
        if (PySet_Add(s->days_seen, field[1]) < 0 ||
            (*out = s->event_type->tp_alloc(s->event_type, 4)) == NULL) {
            status = FAILED;
            goto done;
        }
        for (int i = 0; i < 4; i++) {
            PyTuple_SET_ITEM(*out, i, field[i]);
            field[i] = NULL;
        }
        status = SCANNED;
        goto done;
    }
done:
    for (int i = 0; i < 4; i++) Py_XDECREF(field[i]);
    return status;
}

/* scan_events' and scan_event_spans' common body: (one event or None per line, days read). */
static PyObject *event_lines(EventScan *s, const Lines *in, Py_ssize_t n)
{
    if (!PyType_IsSubtype(s->event_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "scan_events: event_type must be a tuple subclass");
        return NULL;
    }
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t row = 0; row < n; row++) {
        const char *text = NULL;
        Py_ssize_t len = 0;
        if (in->items != NULL) {
            PyObject *line = in->items[row];
            if (PyBytes_Check(line)) {
                text = PyBytes_AS_STRING(line);
                len = PyBytes_GET_SIZE(line);
            }
        } else {
            text = in->block + in->starts[row];
            len = (Py_ssize_t)(in->ends[row] - in->starts[row]);
        }
        PyObject *item = NULL;
        int status = text == NULL ? NOT_PLAIN : event_line(s, text, len, &item);
        if (status == FAILED) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, row, status == SCANNED ? item : Py_NewRef(Py_None));
    }
    PyObject *result = PyTuple_Pack(2, out, s->days_seen);
    Py_DECREF(out);
    return result;
}

#define EVENT_LIMITS "(nnndn)"

static PyObject *scan_events(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *lines_arg, *lines = NULL, *result = NULL;
    EventScan *s = PyMem_Calloc(1, sizeof(EventScan));
    if (s == NULL) return PyErr_NoMemory();
    if (!PyArg_ParseTuple(args, "OO!O!" EVENT_LIMITS ":scan_events", &lines_arg, &PyType_Type,
                          &s->event_type, &PyDict_Type, &s->kinds, &s->limits.max_event_bytes,
                          &s->limits.max_id_chars, &s->limits.max_category_chars,
                          &s->limits.max_abs, &s->max_feature_chars))
        goto done;
    if ((s->days_seen = PySet_New(NULL)) == NULL) goto done;
    lines = PySequence_Fast(lines_arg, "scan_events: lines must be a sequence");
    if (lines == NULL) goto done;
    Lines in = {.items = PySequence_Fast_ITEMS(lines)};
    result = event_lines(s, &in, PySequence_Fast_GET_SIZE(lines));
done:
    release_event_tables(s);
    Py_XDECREF(lines);
    PyMem_Free(s);
    return result;
}

static PyObject *scan_event_spans(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer block = {0}, starts = {0}, ends = {0};
    PyObject *result = NULL;
    EventScan *s = PyMem_Calloc(1, sizeof(EventScan));
    if (s == NULL) return PyErr_NoMemory();
    if (!PyArg_ParseTuple(args, "y*y*y*O!O!" EVENT_LIMITS ":scan_event_spans", &block, &starts,
                          &ends, &PyType_Type, &s->event_type, &PyDict_Type, &s->kinds,
                          &s->limits.max_event_bytes, &s->limits.max_id_chars,
                          &s->limits.max_category_chars, &s->limits.max_abs,
                          &s->max_feature_chars))
        goto done;
    if ((s->days_seen = PySet_New(NULL)) == NULL) goto done;
    Py_ssize_t n = check_spans(&block, &starts, &ends);
    if (n < 0) goto done;
    Lines in = {.block = block.buf, .starts = starts.buf, .ends = ends.buf};
    result = event_lines(s, &in, n);
done:
    release_event_tables(s);
    PyBuffer_Release(&block);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&ends);
    PyMem_Free(s);
    return result;
}

/* bytes.strip's whitespace: a line of only these is blank */
static inline int is_strip_ws(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\x0b' || c == '\x0c';
}

/* split_lines(block, need, final) -> (starts, ends, taken, consumed, last_end): see
 * engine/ingest.py, BlockLines.split. */
static PyObject *split_lines(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer block = {0};
    Py_ssize_t need;
    int final;
    if (!PyArg_ParseTuple(args, "y*np:split_lines", &block, &need, &final)) return NULL;
    PyObject *result = NULL, *starts_out = NULL, *ends_out = NULL;
    const char *text = block.buf;
    Py_ssize_t len = block.len;
    if (need < 0) {
        PyErr_SetString(PyExc_ValueError, "split_lines: need must be >= 0");
        goto done;
    }
    /* at most one span per newline, plus the final unterminated line */
    Py_ssize_t most = 1;
    for (const char *p = text, *end = text + len; (p = memchr(p, '\n', (size_t)(end - p))) != NULL;
         p++) {
        if (++most > need) break;
    }
    if (most > need) most = need;
    starts_out = PyByteArray_FromStringAndSize(NULL, most * 8);
    ends_out = PyByteArray_FromStringAndSize(NULL, most * 8);
    if (starts_out == NULL || ends_out == NULL) goto done;
    int64_t *starts = (int64_t *)PyByteArray_AS_STRING(starts_out);
    int64_t *ends = (int64_t *)PyByteArray_AS_STRING(ends_out);
    Py_ssize_t pos = 0, taken = 0, kept = 0, last_end = -1;
    while (taken < need && pos < len) {
        const char *nl = memchr(text + pos, '\n', (size_t)(len - pos));
        Py_ssize_t stop, next;
        if (nl != NULL) {
            stop = nl - text;
            next = stop + 1;
        } else if (final) { /* the input's last line, without a newline */
            stop = len;
            next = len;
        } else {
            break; /* part of a line: left for the next read */
        }
        taken++;
        Py_ssize_t e = stop;
        while (e > pos && text[e - 1] == '\r') e--;
        Py_ssize_t q = pos;
        while (q < e && is_strip_ws((unsigned char)text[q])) q++;
        if (q < e) { /* not blank */
            starts[kept] = pos;
            ends[kept] = e;
            kept++;
            last_end = next;
        }
        pos = next;
    }
    if (PyByteArray_Resize(starts_out, kept * 8) < 0 || PyByteArray_Resize(ends_out, kept * 8) < 0)
        goto done;
    result = Py_BuildValue("OOnnn", starts_out, ends_out, taken, pos, last_end);
done:
    Py_XDECREF(starts_out);
    Py_XDECREF(ends_out);
    PyBuffer_Release(&block);
    return result;
}

/* lines_of(block, starts, ends) -> list of bytes: each span's bytes. */
static PyObject *lines_of(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer block = {0}, starts = {0}, ends = {0};
    if (!PyArg_ParseTuple(args, "y*y*y*:lines_of", &block, &starts, &ends)) return NULL;
    PyObject *out = NULL;
    Py_ssize_t n = check_spans(&block, &starts, &ends);
    if (n < 0) goto done;
    out = PyList_New(n);
    if (out == NULL) goto done;
    const int64_t *a = starts.buf, *b = ends.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *line = PyBytes_FromStringAndSize((const char *)block.buf + a[i], b[i] - a[i]);
        if (line == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, line);
    }
done:
    PyBuffer_Release(&block);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&ends);
    return out;
}

/* ids_of(block, starts, lengths) -> [str | None]: EventIdSpans.tolist (engine/lines.py) */
static PyObject *ids_of(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer block = {0}, starts = {0}, lengths = {0};
    if (!PyArg_ParseTuple(args, "y*y*y*:ids_of", &block, &starts, &lengths)) return NULL;
    PyObject *out = NULL;
    Py_ssize_t n = starts.len / 8;
    if (starts.len % 8 != 0 || lengths.len != 4 * n) {
        PyErr_SetString(PyExc_ValueError, "ids_of: int64 starts and int32 lengths, one each");
        goto done;
    }
    const int64_t *a = starts.buf;
    const int32_t *len = lengths.buf;
    const unsigned char *data = block.buf;
    out = PyList_New(n);
    if (out == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *id;
        if (len[i] == -1) {
            id = Py_NewRef(Py_None);
        } else {
            if (len[i] < 0 || a[i] < 0 || a[i] > (int64_t)block.len - len[i]) {
                PyErr_SetString(PyExc_ValueError, "ids_of: a span outside its block");
                Py_CLEAR(out);
                goto done;
            }
            unsigned char high = 0;
            for (int32_t j = 0; j < len[i]; j++) high |= data[a[i] + j];
            if (high & 0x80) {
                PyErr_SetString(PyExc_ValueError, "ids_of: an id that is not ASCII");
                Py_CLEAR(out);
                goto done;
            }
            id = ascii_str((const char *)data + a[i], len[i]);
            if (id == NULL) {
                Py_CLEAR(out);
                goto done;
            }
        }
        PyList_SET_ITEM(out, i, id);
    }
done:
    PyBuffer_Release(&block);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&lengths);
    return out;
}

static PyMethodDef methods[] = {
    {"scan_columns", scan_columns, METH_VARARGS,
     "scan_columns(lines, names, kinds, (max_event_bytes, max_id_chars, max_category_chars, "
     "max_abs)) -> (user_ids, days, event_ids, columns) or None: see engine/ingest.py"},
    {"scan_spans", scan_spans, METH_VARARGS,
     "scan_spans(block, starts, ends, names, kinds, limits, id_spans=False): scan_columns of "
     "the lines block[starts[i]:ends[i]]"},
    {"scan_events", scan_events, METH_VARARGS,
     "scan_events(lines, event_type, feature_kinds, (max_event_bytes, max_id_chars, "
     "max_category_chars, max_abs, max_feature_chars)) -> ([event_type(user_id, day, values, "
     "event_id) or None per line], {days read})"},
    {"scan_event_spans", scan_event_spans, METH_VARARGS,
     "scan_event_spans(block, starts, ends, event_type, feature_kinds, limits): scan_events of "
     "the lines block[starts[i]:ends[i]]"},
    {"split_lines", split_lines, METH_VARARGS,
     "split_lines(block, need, final) -> (starts, ends, taken, consumed, last_end): see "
     "engine/ingest.py"},
    {"lines_of", lines_of, METH_VARARGS,
     "lines_of(block, starts, ends) -> [block[starts[i]:ends[i]] for each i]"},
    {"ids_of", ids_of, METH_VARARGS,
     "ids_of(block, starts, lengths) -> [block[starts[i]:starts[i] + lengths[i]] as str, or None "
     "where lengths[i] is -1]"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_jsonl",
    .m_doc = "Native column scanner (engine/ingest.py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__jsonl(void) { return PyModule_Create(&module); }
