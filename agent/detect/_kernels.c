/* The two O(n^2) kernels of the trend test, in C: a replay of weeks of history judges tens of
 * thousands of windows, and these loops are most of its time in Python.
 *
 * Each function gives exactly what its Python twin in agent/detect/trend.py gives (the same IEEE
 * operations in the same order; the median picks the same elements), and returns None when an
 * input is not a list of floats, so the caller falls back to Python for anything unusual.
 *
 * Only the limited C API is used (setup.py defines Py_LIMITED_API): one abi3 build serves every
 * supported CPython, so the item reads are the functions, not the GET_ITEM/AS_DOUBLE macros.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>

/* The items of `list` as doubles into `out`; 0 if any item is not an exact float. */
static int read_floats(PyObject *list, double *out, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GetItem(list, i);
        if (!PyFloat_CheckExact(item))
            return 0;
        out[i] = PyFloat_AsDouble(item);
    }
    return 1;
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* slope_median(xs, ys): the median of (ys[j] - ys[i]) / (xs[j] - xs[i]) over all i < j. */
static PyObject *slope_median(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1]))
        Py_RETURN_NONE;
    Py_ssize_t n = PyList_Size(args[0]);
    if (n < 2 || PyList_Size(args[1]) != n)
        Py_RETURN_NONE;
    Py_ssize_t pairs = n * (n - 1) / 2;
    double *xs = PyMem_Malloc(sizeof(double) * (size_t)(2 * n + pairs));
    if (xs == NULL)
        return PyErr_NoMemory();
    double *ys = xs + n, *slopes = ys + n;
    PyObject *result = NULL;
    if (!read_floats(args[0], xs, n) || !read_floats(args[1], ys, n)) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n - 1; i++) {
        for (Py_ssize_t j = i + 1; j < n; j++) {
            double dx = xs[j] - xs[i];
            if (dx == 0.0) {
                PyErr_SetString(PyExc_ZeroDivisionError, "float division by zero");
                goto done;
            }
            slopes[k++] = (ys[j] - ys[i]) / dx;
        }
    }
    qsort(slopes, (size_t)pairs, sizeof(double), compare_doubles);
    Py_ssize_t mid = pairs / 2;
    result = PyFloat_FromDouble(pairs % 2 ? slopes[mid] : 0.5 * (slopes[mid - 1] + slopes[mid]));
done:
    PyMem_Free(xs);
    return result;
}

/* mk_score(ys): Mann-Kendall S, the pairs i < j with ys[j] > ys[i] minus those with ys[j] < ys[i]. */
static PyObject *mk_score(PyObject *self, PyObject *arg)
{
    (void)self;
    if (!PyList_CheckExact(arg))
        Py_RETURN_NONE;
    Py_ssize_t n = PyList_Size(arg);
    double *ys = PyMem_Malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (ys == NULL)
        return PyErr_NoMemory();
    if (!read_floats(arg, ys, n)) {
        PyMem_Free(ys);
        Py_RETURN_NONE;
    }
    long long s = 0;
    for (Py_ssize_t j = 1; j < n; j++) {
        double y = ys[j];
        for (Py_ssize_t i = 0; i < j; i++)
            s += (y > ys[i]) - (y < ys[i]);
    }
    PyMem_Free(ys);
    return PyLong_FromLongLong(s);
}

static PyMethodDef methods[] = {
    {"slope_median", (PyCFunction)(void (*)(void))slope_median, METH_FASTCALL,
     "slope_median(xs, ys) -> the median pairwise slope, or None for inputs that are not lists of floats"},
    {"mk_score", mk_score, METH_O, "mk_score(ys) -> Mann-Kendall S, or None for input that is not a list of floats"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "agent.detect._kernels", "C kernels of agent.detect.trend", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
