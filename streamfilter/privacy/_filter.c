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
 * product and per sum, ``rint`` to nearest even; the build turns off floating-point contraction,
 * so no fused multiply-add, and errno for math functions, which changes no result), and the
 * integer costs are the same exact int64 values: the result
 * is identical to ``filter_contributions`` followed by the sum of its units
 * (tests/privacy/test_native_filter.py compares them on random and adversarial blocks). Nothing
 * is mutated; a spent value above the budget is a ValueError before anything is computed.
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

/* np.rint(v).astype(np.int64) for |v| <= 2^31 + 1: llrint rounds in the current mode, to
 * nearest even (built with -fno-math-errno, one cvtsd2si instruction, no libm call) */
static inline int64_t round_unit(double v)
{
    return (int64_t)llrint(v);
}

/* x's row i in lattice units, u = x·(1/γ), and its norm sqrt(Σ u_j²) (lattice.norm2_rows);
 * an overflowed row is all zero, with norm 0 (it contributes nothing). γ is a power of two, so
 * x·(1/γ) is the same double as x/γ: one rounding of the same real, subnormal and overflowing
 * results included. */
static double scaled_row(const Matrix *x, Py_ssize_t i, double per_gamma, double *u)
{
    const Py_ssize_t d = x->d;
    for (Py_ssize_t j = 0; j < d; j++) u[j] = at(x, i, j) * per_gamma;
    double norm = sqrt(norm2(u, d));
    if (!isfinite(norm)) {
        for (Py_ssize_t j = 0; j < d; j++) u[j] = 0.0;
        norm = 0.0;
    }
    return norm;
}

/* The rest of lattice.round_to_lattice for one row whose scaled_row is (u, norm): clipped to
 * radius min(C/γ, sqrt(cap)) and rounded into r (scratch y), returning its exact cost
 * ‖r‖² <= cap; ``sqrt_cap`` is sqrt((double)cap). A re-clip to a smaller cap starts again
 * from the same (u, norm), the values round_to_lattice computes again from x. */
static int64_t round_row(const double *u, double norm, Py_ssize_t d, double clip_units,
                         int64_t cap, double sqrt_cap, double *y, int64_t *r)
{
    double radius = clip_units < sqrt_cap ? clip_units : sqrt_cap; /* np.minimum, no NaN */
    if (norm > radius) {
        double factor = radius / norm;
        for (Py_ssize_t j = 0; j < d; j++) y[j] = u[j] * factor;
    } else {
        memcpy(y, u, (size_t)d * sizeof *y);
    }
    for (Py_ssize_t j = 0; j < d; j++) r[j] = round_unit(y[j]);
    int64_t cost = cost_of(r, d);
    if (cost > cap) { /* rounding moved it by at most ½·sqrt(d): shrink the radius by that */
        double shrunk = radius - 0.5 * sqrt((double)d);
        if (!(shrunk > 0.0)) shrunk = 0.0; /* np.maximum(…, 0.0) */
        double norm_o = sqrt(norm2(y, d));
        double factor = norm_o > shrunk ? shrunk / norm_o : 1.0;
        for (Py_ssize_t j = 0; j < d; j++) r[j] = round_unit(y[j] * factor);
        cost = cost_of(r, d);
        while (cost > cap) { /* lattice._enforce_cost_cap: the first largest |r_j| steps in */
            Py_ssize_t big = 0;
            for (Py_ssize_t j = 1; j < d; j++)
                if (llabs(r[j]) > llabs(r[big])) big = j;
            r[big] -= r[big] > 0 ? 1 : (r[big] < 0 ? -1 : 0);
            cost = cost_of(r, d);
        }
    }
    return cost;
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
    /* one row's scratch: its scaled vector, the clipped one and the integer one */
    double *u = PyMem_Malloc(2 * (size_t)(x.d + 1) * sizeof(double));
    int64_t *r = PyMem_Malloc((size_t)(x.d + 1) * sizeof(int64_t));
    double *y = u != NULL ? u + x.d + 1 : NULL;
    if (u == NULL || r == NULL) {
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
    total = PyByteArray_FromStringAndSize(NULL, x.d * (Py_ssize_t)sizeof(int64_t));
    cost = PyByteArray_FromStringAndSize(NULL, x.n * (Py_ssize_t)sizeof(int64_t));
    admitted = PyByteArray_FromStringAndSize(NULL, x.n);
    newly = PyByteArray_FromStringAndSize(NULL, x.n);
    if (total == NULL || cost == NULL || admitted == NULL || newly == NULL) goto done;
    uint64_t *sum = (uint64_t *)PyByteArray_AS_STRING(total);
    int64_t *charged = (int64_t *)PyByteArray_AS_STRING(cost);
    unsigned char *in = (unsigned char *)PyByteArray_AS_STRING(admitted);
    unsigned char *gone = (unsigned char *)PyByteArray_AS_STRING(newly);
    memset(sum, 0, (size_t)x.d * sizeof(int64_t));
    long long n_admitted = 0, n_refused = 0;
    const double clip_units = clip / gamma, per_gamma = 1.0 / gamma;
    const double sqrt_cap = sqrt((double)cap);
    int exponent;
    if (!(gamma > 0.0) || frexp(gamma, &exponent) != 0.5) {
        PyErr_SetString(PyExc_ValueError, "filter_totals: granularity must be a power of two");
        goto done;
    }
    for (Py_ssize_t i = 0; i < x.n; i++) {
        int nonzero = 0;
        for (Py_ssize_t j = 0; j < x.d && !nonzero; j++) nonzero = at(&x, i, j) != 0.0;
        int live = !retired[i];
        int64_t c = 0, remaining = budget - spent[i];
        int in_i = 0, gone_i = 0;
        if (live) {
            double norm = scaled_row(&x, i, per_gamma, u);
            c = round_row(u, norm, x.d, clip_units, cap, sqrt_cap, y, r);
            int fits = c <= remaining;
            if (policy == 2) { /* clip: every live row, re-clipped to what is left */
                in_i = 1;
                if (!fits)
                    c = round_row(u, norm, x.d, clip_units, remaining,
                                  sqrt((double)remaining), y, r);
            } else {
                in_i = fits;
                gone_i = policy == 1 && !fits;
            }
        }
        if (in_i) {
            for (Py_ssize_t j = 0; j < x.d; j++) sum[j] += (uint64_t)r[j];
        } else {
            c = 0;
        }
        charged[i] = c;
        in[i] = (unsigned char)in_i;
        gone[i] = (unsigned char)gone_i;
        n_admitted += in_i && nonzero;
        n_refused += !in_i && nonzero;
    }
    out = Py_BuildValue("OOOOLL", total, cost, admitted, newly, n_admitted, n_refused);
done:
    PyMem_Free(u);
    PyMem_Free(r);
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
