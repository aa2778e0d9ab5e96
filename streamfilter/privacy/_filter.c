/* Native twin of one query's individual filter over a block of users (privacy/individual.py,
 * ``filter_totals``; docs/design.md §2 "Lattice" and §8.4).
 *
 * filter_totals(x, clip, granularity, cap, spent, retired, budget, policy) ->
 *     (total, cost, admitted, newly_retired, admitted_nonzero, refused_nonzero)
 *   x: a 2-D float64 buffer (n users × d coordinates, any strides), data units;
 *   clip, granularity: the query's clip C and the lattice's γ (a power of two);
 *   cap: floor(C²/γ²), the query's integer cost cap; budget: B (lattice units);
 *   spent: int64[n], each user's units spent before the query; retired: uint8/bool[n];
 *   policy: 0 skip, 1 retire, 2 clip (privacy.individual.Exhaustion).
 *   total: bytearray of int64[d], the exact sum of the admitted rows' lattice vectors; cost:
 *   int64[n] charged (0 where refused); admitted, newly_retired: uint8[n]; the two counts:
 *   admitted and refused rows with a non-zero x.
 *
 * Each row goes through the same IEEE operations, in the same order, as
 * ``lattice.round_to_lattice`` and ``individual._admission`` do on numpy arrays (one rounding per
 * product and per sum, rounding to the nearest integer with ties to even), and the integer
 * costs are the same exact int64 values: the result is identical to ``filter_contributions``
 * followed by the sum of its units (tests/privacy/test_native_filter.py compares them on random
 * and adversarial blocks). The rows are taken 256 at a time, each step a loop over one column,
 * which the compiler vectorizes (-O3); the build turns off floating-point contraction (no fused
 * multiply-add) and errno for math functions (sqrt is then one instruction), neither of which
 * changes a value. Nothing is mutated; a spent value above the budget is a ValueError before
 * anything is computed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    const char *base;
    Py_ssize_t row_stride, col_stride, n, d;
} Matrix;

static inline double at(const Matrix *m, Py_ssize_t i, Py_ssize_t j)
{
    double v;
    memcpy(&v, m->base + i * m->row_stride + j * m->col_stride, sizeof v);
    return v;
}

/* Σ_j y_j², left to right (lattice.norm2_rows) */
static double norm2(const double *y, Py_ssize_t d)
{
    if (d == 0) return 0.0;
    double out = y[0] * y[0];
    for (Py_ssize_t j = 1; j < d; j++) {
        double sq = y[j] * y[j];
        out = out + sq;
    }
    return out;
}

/* Σ_j r_j² in int64 with numpy's wrap-around (lattice.cost_units) */
static int64_t cost_of(const int64_t *r, Py_ssize_t d)
{
    uint64_t c = 0;
    for (Py_ssize_t j = 0; j < d; j++) c += (uint64_t)r[j] * (uint64_t)r[j];
    return (int64_t)c;
}

/* np.rint(v).astype(np.int64) for |v| < 2^51 (a clipped row's coordinates are at most its
 * radius, <= 2^31): v + 1.5·2^52 lies in [2^52, 2^53), where doubles are the integers, so the
 * addition rounds v to the nearest integer, ties to even (1.5·2^52 is even, so an even sum is
 * an even integer), and the sum's low bits hold 2^51 + that integer. Plain adds and integer
 * subtractions: a loop of them vectorizes on any x86-64 (no libm call, no cvtsd2si each). */
static inline int64_t round_unit(double v)
{
    const double shift = 6755399441055744.0; /* 1.5 · 2^52 */
    double t = v + shift;
    int64_t bits, base;
    memcpy(&bits, &t, sizeof bits);
    memcpy(&base, &shift, sizeof base);
    return bits - base;
}

/* Rows are taken ROWS at a time, each step a loop over the rows of one column (contiguous
 * reads of a column-major block, loops the compiler can vectorize): every row still gets the
 * operations round_to_lattice gives it, in the same order, so the values are the same. */
#define ROWS 256

typedef struct {
    Py_ssize_t m, d;    /* rows in this step, coordinates */
    double *u;          /* m·d, column by column: the rows in lattice units, x·(1/γ) */
    double *norm;       /* m: sqrt(Σ_j u_j²), left to right (lattice.norm2_rows) */
    double *factor;     /* m: the clip factor, radius/norm, or exactly 1.0 */
    double *radius;     /* m */
    int64_t *r;         /* m·d, column by column: the integer vectors */
    int64_t *cost;      /* m: ‖r‖², exact int64 (numpy's wrap-around) */
    int64_t *cap;       /* m: each row's integer cost cap */
    unsigned char *nonzero; /* m: x's row is not all zero */
    double *row;        /* 2·d + 1: one row's y and r for the rare over-cap step */
} Step;

/* Rows i0 .. i0 + m - 1 of x in lattice units, their norms and which are not all zero. γ is a
 * power of two, so x·(1/γ) is the same double as x/γ (one rounding of the same real,
 * subnormal and overflowing results included). A row whose norm is not finite is all zero
 * with norm 0: it contributes nothing. */
static void scale_rows(const Matrix *x, Py_ssize_t i0, double per_gamma, Step *s)
{
    const Py_ssize_t m = s->m, d = s->d;
    memset(s->nonzero, 0, (size_t)m);
    for (Py_ssize_t k = 0; k < m; k++) s->norm[k] = 0.0;
    for (Py_ssize_t j = 0; j < d; j++) {
        double *u = s->u + j * m;
        if (x->row_stride == (Py_ssize_t)sizeof(double)) { /* a column-major block's column */
            const double *col = (const double *)(x->base + j * x->col_stride) + i0;
            for (Py_ssize_t k = 0; k < m; k++) {
                s->nonzero[k] |= col[k] != 0.0;
                u[k] = col[k] * per_gamma;
            }
        } else {
            for (Py_ssize_t k = 0; k < m; k++) {
                double v = at(x, i0 + k, j);
                s->nonzero[k] |= v != 0.0;
                u[k] = v * per_gamma;
            }
        }
        if (j == 0) {
            for (Py_ssize_t k = 0; k < m; k++) s->norm[k] = u[k] * u[k];
        } else {
            for (Py_ssize_t k = 0; k < m; k++) {
                double sq = u[k] * u[k];
                s->norm[k] = s->norm[k] + sq;
            }
        }
    }
    for (Py_ssize_t k = 0; k < m; k++) s->norm[k] = sqrt(s->norm[k]);
    for (Py_ssize_t k = 0; k < m; k++) {
        if (!isfinite(s->norm[k])) {
            for (Py_ssize_t j = 0; j < d; j++) s->u[j * m + k] = 0.0;
            s->norm[k] = 0.0;
        }
    }
}

/* lattice._enforce_cost_cap's steps for one row (the rare rows whose nearest rounding exceeds
 * the cap): the radius shrunk by ½·sqrt(d), since rounding moves a vector by at most that,
 * then the first largest |r_j| stepped toward zero until the exact cost fits. ``y`` is the
 * row after clipping, ``r`` (d) in and out; returns the cost. */
static int64_t fit_row(const double *y, Py_ssize_t d, double radius, int64_t cap, int64_t *r)
{
    double shrunk = radius - 0.5 * sqrt((double)d);
    if (!(shrunk > 0.0)) shrunk = 0.0; /* np.maximum(…, 0.0) */
    double norm_o = sqrt(norm2(y, d));
    double factor = norm_o > shrunk ? shrunk / norm_o : 1.0;
    for (Py_ssize_t j = 0; j < d; j++) r[j] = round_unit(y[j] * factor);
    int64_t cost = cost_of(r, d);
    while (cost > cap) {
        Py_ssize_t big = 0;
        for (Py_ssize_t j = 1; j < d; j++)
            if (llabs(r[j]) > llabs(r[big])) big = j;
        r[big] -= r[big] > 0 ? 1 : (r[big] < 0 ? -1 : 0);
        cost = cost_of(r, d);
    }
    return cost;
}

/* A row's clip radius in lattice units: min(C/γ, sqrt(cap)) (np.minimum; no NaN here). */
static inline double radius_of(double clip_units, int64_t cap)
{
    double sqrt_cap = sqrt((double)cap);
    return clip_units < sqrt_cap ? clip_units : sqrt_cap;
}

/* The rest of round_to_lattice for the step's rows, each with its own cap and radius:
 * clipped, rounded, and its exact cost. A row within its radius is multiplied by exactly 1.0,
 * which changes no double. A re-clip to smaller caps starts again from the same u and norms,
 * the values round_to_lattice computes again from x. */
static void round_rows(Step *s)
{
    const Py_ssize_t m = s->m, d = s->d;
    for (Py_ssize_t k = 0; k < m; k++) {
        double q = s->radius[k] / s->norm[k]; /* used only where norm > radius >= 0 */
        s->factor[k] = s->norm[k] > s->radius[k] ? q : 1.0;
        s->cost[k] = 0;
    }
    for (Py_ssize_t j = 0; j < d; j++) {
        const double *u = s->u + j * m;
        int64_t *r = s->r + j * m;
        for (Py_ssize_t k = 0; k < m; k++) {
            r[k] = round_unit(u[k] * s->factor[k]);
            s->cost[k] = (int64_t)((uint64_t)s->cost[k] + (uint64_t)r[k] * (uint64_t)r[k]);
        }
    }
    for (Py_ssize_t k = 0; k < m; k++) {
        if (s->cost[k] <= s->cap[k]) continue;
        int64_t *rk = (int64_t *)(s->row + d);
        for (Py_ssize_t j = 0; j < d; j++) {
            s->row[j] = s->u[j * m + k] * s->factor[k];
            rk[j] = s->r[j * m + k];
        }
        s->cost[k] = fit_row(s->row, d, s->radius[k], s->cap[k], rk);
        for (Py_ssize_t j = 0; j < d; j++) s->r[j * m + k] = rk[j];
    }
}

static int matrix_of(PyObject *obj, Py_buffer *view, Matrix *m)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_STRIDES | PyBUF_FORMAT) < 0) return -1;
    const char *f = view->format != NULL ? view->format : "B";
    if (*f == '@' || *f == '=' || *f == '<') f++;
    if (view->ndim != 2 || view->itemsize != 8 || f[0] != 'd' || f[1] != '\0') {
        PyErr_SetString(PyExc_TypeError, "filter_totals: x must be a 2-D float64 buffer");
        PyBuffer_Release(view);
        return -1;
    }
    m->base = view->buf;
    m->n = view->shape[0];
    m->d = view->shape[1];
    m->row_stride = view->strides[0];
    m->col_stride = view->strides[1];
    return 0;
}

static int vector_of(PyObject *obj, Py_buffer *view, Py_ssize_t n, Py_ssize_t itemsize,
                     const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    const char *f = view->format != NULL ? view->format : "B";
    if (*f == '@' || *f == '=' || *f == '<') f++;
    int ok = itemsize == 8 ? (*f == 'l' || *f == 'q') : (*f == '?' || *f == 'B' || *f == 'b');
    if (!ok || f[1] != '\0' || view->itemsize != itemsize || view->ndim != 1 ||
        view->shape[0] != n) {
        PyErr_Format(PyExc_TypeError, "filter_totals: %s must be a 1-D %s buffer of %zd items",
                     what, itemsize == 8 ? "int64" : "bool", n);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *filter_totals(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *x_obj, *spent_obj, *retired_obj;
    double clip, gamma;
    long long cap_ll, budget_ll;
    int policy;
    if (!PyArg_ParseTuple(args, "OddLOOLi:filter_totals", &x_obj, &clip, &gamma, &cap_ll,
                          &spent_obj, &retired_obj, &budget_ll, &policy))
        return NULL;
    if (policy < 0 || policy > 2) {
        PyErr_SetString(PyExc_ValueError, "filter_totals: policy must be 0, 1 or 2");
        return NULL;
    }
    const int64_t cap = cap_ll, budget = budget_ll;
    Py_buffer xv, sv, rv;
    Matrix x;
    if (matrix_of(x_obj, &xv, &x) < 0) return NULL;
    if (vector_of(spent_obj, &sv, x.n, 8, "spent") < 0) {
        PyBuffer_Release(&xv);
        return NULL;
    }
    if (vector_of(retired_obj, &rv, x.n, 1, "retired") < 0) {
        PyBuffer_Release(&xv);
        PyBuffer_Release(&sv);
        return NULL;
    }
    const int64_t *spent = sv.buf;
    const unsigned char *retired = rv.buf;
    PyObject *total = NULL, *cost = NULL, *admitted = NULL, *newly = NULL, *out = NULL;
    /* the step's scratch: u, r (ROWS·d each), six per-row columns, one row of 2·d */
    const Py_ssize_t d = x.d;
    char *scratch = PyMem_Malloc((size_t)ROWS * (size_t)(2 * d + 5) * 8 +
                                 (size_t)(2 * d + 1) * 8 + (size_t)ROWS);
    if (scratch == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < x.n; i++) {
        if (spent[i] > budget) {
            PyErr_SetString(PyExc_ValueError,
                            "spent_units exceeds the budget: the ledger is corrupt");
            goto done;
        }
    }
    int exponent;
    if (!(gamma > 0.0) || frexp(gamma, &exponent) != 0.5) {
        PyErr_SetString(PyExc_ValueError, "filter_totals: granularity must be a power of two");
        goto done;
    }
    total = PyByteArray_FromStringAndSize(NULL, d * (Py_ssize_t)sizeof(int64_t));
    cost = PyByteArray_FromStringAndSize(NULL, x.n * (Py_ssize_t)sizeof(int64_t));
    admitted = PyByteArray_FromStringAndSize(NULL, x.n);
    newly = PyByteArray_FromStringAndSize(NULL, x.n);
    if (total == NULL || cost == NULL || admitted == NULL || newly == NULL) goto done;
    uint64_t *sum = (uint64_t *)PyByteArray_AS_STRING(total);
    int64_t *charged = (int64_t *)PyByteArray_AS_STRING(cost);
    unsigned char *in = (unsigned char *)PyByteArray_AS_STRING(admitted);
    unsigned char *gone = (unsigned char *)PyByteArray_AS_STRING(newly);
    memset(sum, 0, (size_t)d * sizeof(int64_t));
    long long n_admitted = 0, n_refused = 0;
    const double clip_units = clip / gamma, per_gamma = 1.0 / gamma;
    const double radius0 = radius_of(clip_units, cap);
    Step st = {.d = d};
    {
        double *f = (double *)scratch;
        st.u = f;
        st.r = (int64_t *)(f + ROWS * d);
        st.norm = f + 2 * ROWS * d;
        st.factor = st.norm + ROWS;
        st.radius = st.factor + ROWS;
        st.cost = (int64_t *)(st.radius + ROWS);
        st.cap = st.cost + ROWS;
        st.row = (double *)(st.cap + ROWS);
        st.nonzero = (unsigned char *)(st.row + 2 * d + 1);
    }
    for (Py_ssize_t i0 = 0; i0 < x.n; i0 += ROWS) {
        st.m = x.n - i0 < ROWS ? x.n - i0 : ROWS;
        scale_rows(&x, i0, per_gamma, &st);
        for (Py_ssize_t k = 0; k < st.m; k++) {
            st.cap[k] = cap;
            st.radius[k] = radius0;
        }
        round_rows(&st);
        /* the admission (individual._admission), on exact int64 costs */
        int reclip = 0;
        for (Py_ssize_t k = 0; k < st.m; k++) {
            Py_ssize_t i = i0 + k;
            int64_t remaining = budget - spent[i];
            int fits = st.cost[k] <= remaining, live = !retired[i];
            if (policy == 2) { /* clip: every live row, re-clipped to what is left */
                in[i] = (unsigned char)live;
                gone[i] = 0;
                if (live && !fits) {
                    st.cap[k] = remaining;
                    st.radius[k] = radius_of(clip_units, remaining);
                    reclip = 1;
                }
            } else {
                in[i] = (unsigned char)(live && fits);
                gone[i] = (unsigned char)(policy == 1 && live && !fits);
            }
        }
        if (reclip) round_rows(&st); /* rows kept at the query's cap: unchanged */
        for (Py_ssize_t k = 0; k < st.m; k++) {
            Py_ssize_t i = i0 + k;
            charged[i] = in[i] ? st.cost[k] : 0;
            n_admitted += in[i] && st.nonzero[k];
            n_refused += !in[i] && st.nonzero[k];
        }
        for (Py_ssize_t j = 0; j < d; j++) {
            const int64_t *r = st.r + j * st.m;
            uint64_t add = 0;
            for (Py_ssize_t k = 0; k < st.m; k++) add += (uint64_t)r[k] & -(uint64_t)in[i0 + k];
            sum[j] += add;
        }
    }
    out = Py_BuildValue("OOOOLL", total, cost, admitted, newly, n_admitted, n_refused);
done:
    PyMem_Free(scratch);
    Py_XDECREF(total);
    Py_XDECREF(cost);
    Py_XDECREF(admitted);
    Py_XDECREF(newly);
    PyBuffer_Release(&xv);
    PyBuffer_Release(&sv);
    PyBuffer_Release(&rv);
    return out;
}

static PyMethodDef methods[] = {
    {"filter_totals", filter_totals, METH_VARARGS,
     "filter_totals(x, clip, granularity, cap, spent, retired, budget, policy) -> (total, cost, "
     "admitted, newly_retired, admitted_nonzero, refused_nonzero)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_filter",
    .m_doc = "Native twin of one query's individual filter over a block (privacy/individual.py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__filter(void)
{
    return PyModule_Create(&module);
}
