/* The hot loops of the trend test and of a replay, in C: a replay of weeks of history judges tens
 * of thousands of windows, and these loops are most of its time in Python (the pairwise slopes and
 * Mann-Kendall, step removal, medians, cutting samples into buckets).
 *
 * Each function gives exactly what its Python twin in agent/detect/trend.py gives (the same IEEE
 * operations in the same order; the median picks the same elements), and returns None when an
 * input is not a list of floats, so the caller falls back to Python for anything unusual.
 *
 * Only the limited C API is used (setup.py defines Py_LIMITED_API): one abi3 build serves every
 * supported CPython, so the item reads are the functions, not the GET_ITEM/AS_DOUBLE macros.
 *
 * slow_screen, further down, serves agent/detect/slow/replay.py: it has no twin to equal, only
 * the rule that a tick it leaves unmarked is one where the Python rules do not fire; rising_screen
 * serves agent/detect/slow/relative.py, whose loop is its twin.
 * bucket_quantiles serves agent/series/buckets.py, matrix_values agent/series/prometheus.py (the
 * `values` arrays of a query_range export read as doubles, what the json module's path reads).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

/* The k-th smallest of v[0..n) (0-based), with v partly reordered: every element before k is at
 * most v[k]. Quickselect (Hoare's partition around the middle of three): linear on average, where
 * sorting all of them is n log n. No NaN may be in v. */
static double select_kth(double *v, Py_ssize_t n, Py_ssize_t k)
{
    Py_ssize_t lo = 0, hi = n - 1;
    while (hi > lo) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        double a = v[lo], b = v[mid], c = v[hi];
        double pivot = a < b ? (b < c ? b : (a < c ? c : a)) : (a < c ? a : (b < c ? c : b));
        Py_ssize_t i = lo, j = hi;
        while (i <= j) {
            while (v[i] < pivot)
                i++;
            while (v[j] > pivot)
                j--;
            if (i <= j) {
                double t = v[i];
                v[i] = v[j];
                v[j] = t;
                i++;
                j--;
            }
        }
        if (k <= j)
            hi = j;
        else if (k >= i)
            lo = i;
        else
            break; /* between j and i: every element there equals the pivot */
    }
    return v[k];
}

/* The median of v[0..n) (n >= 1), v reordered: the same value sorting would pick. */
static double select_median(double *v, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (isnan(v[i])) { /* no order to select by: sort as the Python twin does */
            qsort(v, (size_t)n, sizeof(double), compare_doubles);
            return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
        }
    }
    Py_ssize_t mid = n / 2;
    double upper = select_kth(v, n, mid);
    if (n % 2)
        return upper;
    double lower = v[0]; /* the largest of the elements before mid: the (mid-1)-th smallest */
    for (Py_ssize_t i = 1; i < mid; i++)
        if (v[i] > lower)
            lower = v[i];
    return 0.5 * (lower + upper);
}

/* The items of a list of floats (none NaN) into a new buffer; NULL with no error set when the
 * list is anything else (or empty), NULL with MemoryError when out of memory. */
static double *plain_floats(PyObject *list, Py_ssize_t *n)
{
    if (!PyList_CheckExact(list) || (*n = PyList_Size(list)) < 1)
        return NULL;
    double *v = PyMem_Malloc(sizeof(double) * (size_t)*n);
    if (v == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    int usable = read_floats(list, v, *n);
    for (Py_ssize_t i = 0; usable && i < *n; i++)
        usable = !isnan(v[i]);
    if (!usable) {
        PyMem_Free(v);
        return NULL;
    }
    return v;
}

/* median(values): trend.median of a non-empty list of floats without NaN; None for other input. */
static PyObject *median(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_ssize_t n = 0;
    double *v = plain_floats(arg, &n);
    if (v == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    double found = select_median(v, n);
    PyMem_Free(v);
    return PyFloat_FromDouble(found);
}

/* thirds_rise(ys): trend.thirds_rise (the median of the last third less that of the first) of a
 * list of at least two floats without NaN; None for other input. */
static PyObject *thirds_rise(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_ssize_t n = 0;
    double *v = plain_floats(arg, &n);
    if (v == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    if (n < 2) {
        PyMem_Free(v);
        Py_RETURN_NONE;
    }
    Py_ssize_t k = n / 3 > 2 ? n / 3 : 2;
    double *last = PyMem_Malloc(sizeof(double) * (size_t)k);
    if (last == NULL) {
        PyMem_Free(v);
        return PyErr_NoMemory();
    }
    memcpy(last, v + n - k, sizeof(double) * (size_t)k); /* the first k may overlap the last k */
    double rise = select_median(last, k) - select_median(v, k);
    PyMem_Free(last);
    PyMem_Free(v);
    return PyFloat_FromDouble(rise);
}

/* Python's float floor division `vx // wx` (floatobject.c's float_floor_div), for a bucket index
 * that equals the one Python computes. */
static double floor_division(double vx, double wx)
{
    double mod = fmod(vx, wx);
    double div = (vx - mod) / wx;
    if (mod && ((wx < 0) != (mod < 0)))
        div -= 1.0;
    if (!div)
        return copysign(0.0, vx / wx);
    double whole = floor(div);
    return div - whole > 0.5 ? whole + 1.0 : whole;
}

/* A new list of the n floats of `v`, or (`v` NULL) of the n ints of `k`; NULL on error. */
static PyObject *list_of(const double *v, const Py_ssize_t *k, Py_ssize_t n)
{
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *item = v != NULL ? PyFloat_FromDouble(v[i]) : PyLong_FromSsize_t(k[i]);
        if (item == NULL)
            Py_CLEAR(out);
        else
            PyList_SetItem(out, i, item);
    }
    return out;
}

/* bucket_floors(times, values, width): envelope._buckets and _floors_and_peaks in one pass, as
 * (bucket indices, index of each bucket's first sample, floors, peaks): a bucket is a run of
 * samples with the same `int(time // width)`, its floor and peak what Python's min and max pick.
 * None for input it does not model: not lists of floats of one length, a time that is not
 * finite or whose bucket index falls (times out of order), a width that is not positive. */
static PyObject *bucket_floors(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1]) || !PyFloat_CheckExact(args[2]))
        Py_RETURN_NONE;
    Py_ssize_t n = PyList_Size(args[0]);
    double width = PyFloat_AsDouble(args[2]);
    if (PyList_Size(args[1]) != n || !(width > 0) || !isfinite(width))
        Py_RETURN_NONE;
    double *ts = PyMem_Malloc(sizeof(double) * (size_t)(4 * n + 1));
    Py_ssize_t *marks = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(2 * n + 1));
    if (ts == NULL || marks == NULL) {
        PyMem_Free(ts);
        PyMem_Free(marks);
        return PyErr_NoMemory();
    }
    double *vs = ts + n, *lo = vs + n, *hi = lo + n;
    Py_ssize_t *idx = marks, *firsts = marks + n, m = 0;
    PyObject *result = NULL;
    int usable = read_floats(args[0], ts, n) && read_floats(args[1], vs, n);
    double last = 0.0;
    for (Py_ssize_t i = 0; usable && i < n; i++) {
        if (!isfinite(ts[i])) {
            usable = 0;
            break;
        }
        double b = floor_division(ts[i], width);
        if (!(fabs(b) < 9.0e15) || (m && b < last)) {
            usable = 0;
            break;
        }
        if (m && b == last) {
            if (vs[i] < lo[m - 1])
                lo[m - 1] = vs[i];
            if (vs[i] > hi[m - 1])
                hi[m - 1] = vs[i];
            continue;
        }
        idx[m] = (Py_ssize_t)b;
        firsts[m] = i;
        lo[m] = hi[m] = vs[i];
        last = b;
        m++;
    }
    if (!usable) {
        result = Py_NewRef(Py_None);
    } else {
        PyObject *a = list_of(NULL, idx, m), *b = list_of(NULL, firsts, m);
        PyObject *c = list_of(lo, NULL, m), *d = list_of(hi, NULL, m);
        if (a != NULL && b != NULL && c != NULL && d != NULL)
            result = PyTuple_Pack(4, a, b, c, d);
        Py_XDECREF(a);
        Py_XDECREF(b);
        Py_XDECREF(c);
        Py_XDECREF(d);
    }
    PyMem_Free(ts);
    PyMem_Free(marks);
    return result;
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
    result = PyFloat_FromDouble(select_median(slopes, pairs));
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

/* ------------------------------------------------------------------------------------------
 * slow_screen: which judgements of one instance's latency could fire the slow detector's SLO or
 * trend rule, and its peer level at each tick (agent/detect/slow/replay.py). The arithmetic is
 * that of agent/detect/slow/rules.py in the same order; a tick is marked whenever a rule
 * fires or a comparison on the way is within a hair of going the other way, so the replay judges
 * it in Python. A tick that is not marked certainly does not fire those rules. */

#define CLOSE(a, b) (fabs((a) - (b)) <= 1e-9 * (fabs(a) + fabs(b)) + 1e-300)

typedef struct {
    const double *ts, *vs;  /* the instance's finite latency points, in time order */
    Py_ssize_t lo, hi;      /* the view: points [lo, hi) */
} View;

/* Sorts `v` (insertion sort for the short rows of a judgement: the same order as qsort's) and
 * returns its median as trend.median computes it. */
static double median_of(double *v, Py_ssize_t n)
{
    if (n <= 32) {
        for (Py_ssize_t i = 1; i < n; i++) {
            double x = v[i];
            Py_ssize_t j = i;
            for (; j > 0 && v[j - 1] > x; j--)
                v[j] = v[j - 1];
            v[j] = x;
        }
    } else {
        qsort(v, (size_t)n, sizeof(double), compare_doubles);
    }
    Py_ssize_t mid = n / 2;
    return n % 2 ? v[mid] : 0.5 * (v[mid - 1] + v[mid]);
}

/* LatencyView.value_at: the last point at or before `when`, if at most `stale` old (else NaN). */
static double value_at(const View *w, double when, double stale)
{
    Py_ssize_t a = w->lo, b = w->hi; /* first index with ts > when */
    while (a < b) {
        Py_ssize_t m = a + (b - a) / 2;
        if (w->ts[m] > when)
            b = m;
        else
            a = m + 1;
    }
    Py_ssize_t index = a - 1;
    if (index < w->lo || when - w->ts[index] > stale)
        return NAN;
    return w->vs[index];
}

/* trend.remove_steps and _is_step; *close set when a decision was a near tie. */
static int is_step(const double *ys, const double *diffs, Py_ssize_t n, Py_ssize_t i,
                   const char *candidate, double limit, double *scratch, int *close)
{
    Py_ssize_t m = 0;
    for (Py_ssize_t j = (i - 3 > 0 ? i - 3 : 0); j < (n - 1 < i + 4 ? n - 1 : i + 4); j++)
        if (j != i && !candidate[j])
            scratch[m++] = diffs[j];
    if (m) {
        double off = fabs(diffs[i] - median_of(scratch, m));
        if (CLOSE(off, limit))
            *close = 1;
        if (off <= limit)
            return 0;
    }
    Py_ssize_t b0 = i + 1 - 8 > 0 ? i + 1 - 8 : 0, nb = i + 1 - b0;
    Py_ssize_t na = n - (i + 1) < 8 ? n - (i + 1) : 8;
    if ((nb < na ? nb : na) < 4)
        return 0;
    double middle = 0.5 * (ys[i] + ys[i + 1]);
    int up = diffs[i] > 0;
    Py_ssize_t held = 0;
    for (Py_ssize_t j = i + 1; j < i + 1 + na; j++) {
        if (CLOSE(ys[j], middle))
            *close = 1;
        held += (ys[j] > middle) == up;
    }
    for (Py_ssize_t j = b0; j < i + 1; j++) {
        if (CLOSE(ys[j], middle))
            *close = 1;
        held += (ys[j] < middle) == up;
    }
    return (double)held >= 0.8 * (double)(nb + na);
}

#define MAX_STEP_POINTS 512 /* the longest series remove_steps takes: a fit has far fewer buckets */

/* Writes `ys` (n <= MAX_STEP_POINTS) with its level shifts removed into `clean` and returns how many were
 * removed; `*spread` gets the robust sigma of the changes (before the sqrt(2) of Steps.noise). */
static Py_ssize_t remove_steps(const double *ys, Py_ssize_t n, double floor_, double *clean, double *work,
                               double *spread_out, int *close)
{
    double *diffs = work, *devs = work + n, *scratch = work + 2 * n;
    char candidate[MAX_STEP_POINTS];
    for (Py_ssize_t i = 0; i < n; i++)
        clean[i] = ys[i];
    for (Py_ssize_t i = 0; i + 1 < n; i++)
        diffs[i] = ys[i + 1] - ys[i];
    for (Py_ssize_t i = 0; i + 1 < n; i++)
        scratch[i] = diffs[i];
    double typical = median_of(scratch, n - 1), most = 0.0;
    for (Py_ssize_t i = 0; i + 1 < n; i++) {
        devs[i] = fabs(diffs[i] - typical);
        scratch[i] = devs[i];
        if (i == 0 || devs[i] > most)
            most = devs[i];
    }
    double spread = 1.4826 * median_of(scratch, n - 1);
    *spread_out = spread;
    double limit = 6.0 * spread >= floor_ ? 6.0 * spread : floor_;
    if (CLOSE(most, limit))
        *close = 1;
    if (!(most > limit))
        return 0;
    for (Py_ssize_t i = 0; i + 1 < n; i++) {
        if (CLOSE(devs[i], limit))
            *close = 1;
        candidate[i] = devs[i] > limit;
    }
    char jump[MAX_STEP_POINTS];
    Py_ssize_t jumps = 0;
    for (Py_ssize_t i = 0; i + 1 < n; i++) {
        jump[i] = candidate[i] && is_step(ys, diffs, n, i, candidate, limit, scratch, close);
        jumps += jump[i];
    }
    if (jumps == 0 || jumps > 2)
        return 0;
    double shift = 0.0;
    for (Py_ssize_t i = 0; i + 1 < n; i++) {
        if (jump[i])
            shift += diffs[i] - typical;
        clean[i + 1] = ys[i + 1] - shift;
    }
    return jumps;
}

/* steps_removed(ys, floor): trend.remove_steps of a list of 3 to MAX_STEP_POINTS finite floats, as
 * (steps removed, spread, the clean values or None when none were removed); None for other input. */
static PyObject *steps_removed(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyFloat_CheckExact(args[1]))
        Py_RETURN_NONE;
    Py_ssize_t n = PyList_Size(args[0]);
    double floor_ = PyFloat_AsDouble(args[1]);
    if (n < 3 || n > MAX_STEP_POINTS || !isfinite(floor_))
        Py_RETURN_NONE;
    double *ys = PyMem_Malloc(sizeof(double) * (size_t)(5 * n));
    if (ys == NULL)
        return PyErr_NoMemory();
    double *clean = ys + n, *work = clean + n, spread = 0.0;
    PyObject *cleaned = NULL;
    int usable = read_floats(args[0], ys, n);
    for (Py_ssize_t i = 0; usable && i < n; i++)
        usable = isfinite(ys[i]);
    if (!usable) {
        PyMem_Free(ys);
        Py_RETURN_NONE;
    }
    int close = 0;
    Py_ssize_t count = remove_steps(ys, n, floor_, clean, work, &spread, &close);
    cleaned = count ? list_of(clean, NULL, n) : Py_NewRef(Py_None);
    PyMem_Free(ys);
    if (cleaned == NULL)
        return NULL;
    PyObject *out = Py_BuildValue("(ndN)", count, spread, cleaned);
    return out;
}

/* The (time, value) float pairs of a list of points into `ts`, `vs` (only those with a finite
 * value when `finite`); the count, or -1 when an item is not a pair of floats. */
static Py_ssize_t read_points(PyObject *list, double *ts, double *vs, int finite)
{
    Py_ssize_t n = PyList_Size(list), m = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GetItem(list, i);
        if (!PyTuple_CheckExact(item) || PyTuple_Size(item) != 2)
            return -1;
        PyObject *a = PyTuple_GetItem(item, 0), *b = PyTuple_GetItem(item, 1);
        if (!PyFloat_CheckExact(a) || !PyFloat_CheckExact(b))
            return -1;
        double v = PyFloat_AsDouble(b);
        if (finite && !isfinite(v))
            continue;
        ts[m] = PyFloat_AsDouble(a);
        vs[m++] = v;
    }
    return m;
}

/* A copy of `obj`, bytes of native doubles (array('d').tobytes()), into a new buffer of *n
 * doubles; NULL with an exception set otherwise. Bytes, not the buffer protocol: Py_buffer is in the
 * limited API only from 3.11, and the copy also gives the doubles their alignment. */
static double *get_doubles(PyObject *obj, Py_ssize_t *n)
{
    char *raw;
    Py_ssize_t len;
    if (!PyBytes_Check(obj) || PyBytes_AsStringAndSize(obj, &raw, &len) < 0 || len % (Py_ssize_t)sizeof(double)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "_kernels: expected bytes of doubles (array('d').tobytes())");
        return NULL;
    }
    *n = len / (Py_ssize_t)sizeof(double);
    double *out = PyMem_Malloc((size_t)len + sizeof(double));
    if (!out) {
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(out, raw, (size_t)len);
    return out;
}

enum { SCREEN_SLO = 1, SCREEN_TREND = 2, SCREEN_ODD = 4 };

/* slow_screen(ticks, judged, points, starts, restarts, numbers) -> (levels, flags): bytes of
 * doubles, one per tick, or None when the points are not lists of float pairs. `ticks` are the
 * instants the samples are loaded at, `judged` the grid instants judged (slow.tick_for of each),
 * `points` the latency points (those with a value that is not finite are left out), `starts` the
 * process start time points, `restarts` sorted; bytes of doubles (array("d").tobytes()) but for the two lists.
 * `numbers` is a tuple of 16 floats (see slow/replay.py, _FleetReplay._screen). */
static PyObject *slow_screen(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 6 || !PyTuple_CheckExact(args[5]) || PyTuple_Size(args[5]) != 16 ||
        !PyList_CheckExact(args[2]) || !PyList_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "slow_screen: 2 bytes, 2 lists, bytes and 16 numbers");
        return NULL;
    }
    double num[16];
    for (int i = 0; i < 16; i++) {
        num[i] = PyFloat_AsDouble(PyTuple_GetItem(args[5], i));
        if (num[i] == -1.0 && PyErr_Occurred())
            return NULL;
    }
    double first = num[0], span = num[1], stale = num[2], peer_window = num[3], min_coverage = num[4];
    double slo_threshold = num[5], slo_window = num[6], fire_fraction = num[7];
    double trend_window = num[8], min_growth = num[10], z_min = num[11];
    Py_ssize_t buckets = (Py_ssize_t)num[9];
    if (buckets < 6 || buckets > 60) {
        PyErr_SetString(PyExc_ValueError, "slow_screen: trend_buckets out of range");
        return NULL;
    }
    PyObject *result = NULL;
    double *levels = NULL, *flags = NULL, *work = NULL, *points = NULL;
    double *copies[3] = {NULL, NULL, NULL};
    Py_ssize_t lengths[3] = {0, 0, 0};
    Py_ssize_t *counts = NULL;
    PyObject *arrays[3] = {args[0], args[1], args[4]};
    for (int i = 0; i < 3; i++)
        if (!(copies[i] = get_doubles(arrays[i], &lengths[i])))
            goto release;
    const double *loaded = copies[0], *ticks = copies[1], *rs = copies[2];
    Py_ssize_t nt = lengths[0], nr = lengths[2];
    if (lengths[1] != lengths[0]) {
        PyErr_SetString(PyExc_ValueError, "slow_screen: ticks and judged instants differ in length");
        goto release;
    }
    Py_ssize_t np = PyList_Size(args[2]), ns = PyList_Size(args[3]);
    points = PyMem_Malloc(sizeof(double) * (size_t)(2 * (np + ns) + 1));
    if (!points) {
        PyErr_NoMemory();
        goto release;
    }
    double *ts = points, *vs = points + np, *st = points + 2 * np, *sv = points + 2 * np + ns;
    np = read_points(args[2], ts, vs, 1);
    ns = read_points(args[3], st, sv, 0);
    if (np < 0 || ns < 0) {
        result = Py_NewRef(Py_None);
        goto release;
    }
    levels = PyMem_Malloc(sizeof(double) * (size_t)(nt ? nt : 1));
    flags = PyMem_Malloc(sizeof(double) * (size_t)(nt ? nt : 1));
    /* per tick: 24 level values, buckets × (values), ys, xs, clean, and remove_steps' work */
    Py_ssize_t cap = np + 8;
    work = PyMem_Malloc(sizeof(double) * (size_t)(64 + cap + 8 * buckets + 6 * buckets));
    if (!levels || !flags || !work) {
        PyErr_NoMemory();
        goto release;
    }
    double *sample = work, *bucket_values = work + 64;
    int repeats[24];
    double *ys = bucket_values + cap, *xs = ys + buckets, *clean = xs + buckets, *steps_work = clean + buckets;
    counts = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(2 * buckets));
    if (!counts) {
        PyErr_NoMemory();
        goto release;
    }
    Py_ssize_t *offsets = counts + buckets;
    Py_ssize_t lo_span = 0, hi = 0, s_lo = 0, r_load = 0, r_tick = 0; /* the instants only grow */
    for (Py_ssize_t t = 0; t < nt; t++) {
        /* the samples loaded at `load`, [load - span, load], judged at `tick` */
        double load = loaded[t], tick = ticks[t], flag = 0, upto = tick < load ? tick : load;
        while (lo_span < np && ts[lo_span] < load - span)
            lo_span++;
        if (hi < lo_span)
            hi = lo_span;
        while (hi < np && ts[hi] <= upto)
            hi++;
        /* lifetime_start: the last restart, else the last start time recorded, else the first sample */
        double life = first;
        while (r_load < nr && rs[r_load] <= load)
            r_load++;
        while (r_tick < nr && rs[r_tick] <= upto)
            r_tick++;
        if (r_load > 0) {
            if (r_tick > 0)
                life = rs[r_tick - 1];
            else
                flag = SCREEN_ODD;
        } else {
            while (s_lo < ns && st[s_lo] < load - span)
                s_lo++;
            Py_ssize_t s_load = s_lo, s_tick;
            while (s_load < ns && st[s_load] <= load)
                s_load++;
            for (s_tick = s_lo; s_tick < s_load && st[s_tick] <= upto; s_tick++)
                ;
            if (s_load > s_lo) {
                Py_ssize_t k = s_tick - 1;
                while (k >= s_lo && !isfinite(sv[k]))
                    k--;
                if (k >= s_lo)
                    life = sv[k];
                else
                    flag = SCREEN_ODD; /* no start time to read: judged in Python */
            }
        }
        View w = {ts, vs, lo_span, hi};
        while (w.lo < w.hi && ts[w.lo] < life)
            w.lo++;
        /* level: the median of 24 values in effect over the peer window */
        {
            /* the 24 values are a few points, each repeated: sort the points, count the repeats */
            double since = tick - peer_window, step = (tick - since) / 24;
            Py_ssize_t m = 0, runs = 0, next = w.lo, last = -1;
            for (int i = 0; i < 24; i++) {
                double when = since + step * (i + 1);
                while (next < w.hi && !(ts[next] > when))
                    next++;
                if (next > w.lo && !(when - ts[next - 1] > stale)) {
                    if (next - 1 != last) {
                        last = next - 1;
                        sample[runs] = vs[last];
                        repeats[runs++] = 0;
                    }
                    repeats[runs - 1]++;
                    m++;
                }
            }
            levels[t] = -INFINITY;
            if ((double)m >= min_coverage * 24) {
                for (Py_ssize_t i = 1; i < runs; i++) { /* insertion sort of (value, repeats) */
                    double x = sample[i];
                    int r = repeats[i];
                    Py_ssize_t j = i;
                    for (; j > 0 && sample[j - 1] > x; j--) {
                        sample[j] = sample[j - 1];
                        repeats[j] = repeats[j - 1];
                    }
                    sample[j] = x;
                    repeats[j] = r;
                }
                Py_ssize_t mid = m / 2, seen = 0;
                double below = 0.0, at = 0.0; /* the values ranked mid - 1 and mid */
                for (Py_ssize_t i = 0; i < runs; i++) {
                    if (seen <= mid - 1 && mid - 1 < seen + repeats[i])
                        below = sample[i];
                    if (seen <= mid && mid < seen + repeats[i]) {
                        at = sample[i];
                        break;
                    }
                    seen += repeats[i];
                }
                levels[t] = m % 2 ? at : 0.5 * (below + at);
            }
        }
        /* slo: time over the threshold */
        if (!isnan(slo_threshold) && w.hi > w.lo) {
            double since = tick - slo_window, covered = 0.0, over = 0.0;
            Py_ssize_t from = w.lo; /* points that end before the window add nothing */
            while (from < w.hi && !(ts[from] + stale > since))
                from++;
            for (Py_ssize_t i = from; i < w.hi; i++) {
                double end = i + 1 < w.hi ? ts[i + 1] : tick;
                if (ts[i] + stale < end)
                    end = ts[i] + stale;
                if (tick < end)
                    end = tick;
                double begin = ts[i] > since ? ts[i] : since;
                if (end > begin) {
                    covered += end - begin;
                    if (vs[i] > slo_threshold)
                        over += end - begin;
                }
            }
            if (covered >= min_coverage * slo_window * (1 - 1e-9) &&
                over >= fire_fraction * slo_window * (1 - 1e-9))
                flag = (double)((int)flag | SCREEN_SLO);
        }
        /* trend: bucket medians, steps removed, Mann-Kendall and the Theil-Sen growth */
        {
            double since = tick - trend_window > life ? tick - trend_window : life;
            double width = trend_window / (double)buckets;
            for (Py_ssize_t k = 0; k < buckets; k++)
                counts[k] = 0;
            Py_ssize_t first_after = w.lo;
            while (first_after < w.hi && !(ts[first_after] > since))
                first_after++;
            for (Py_ssize_t i = first_after; i < w.hi; i++) {
                Py_ssize_t k = (Py_ssize_t)((ts[i] - since) / width);
                counts[k < buckets - 1 ? k : buckets - 1]++;
            }
            Py_ssize_t at = 0;
            for (Py_ssize_t k = 0; k < buckets; k++) {
                offsets[k] = at;
                at += counts[k];
                counts[k] = 0;
            }
            for (Py_ssize_t i = first_after; i < w.hi; i++) {
                Py_ssize_t k = (Py_ssize_t)((ts[i] - since) / width);
                k = k < buckets - 1 ? k : buckets - 1;
                bucket_values[offsets[k] + counts[k]++] = vs[i];
            }
            Py_ssize_t n = 0;
            for (Py_ssize_t k = 0; k < buckets; k++) {
                double x = since + ((double)k + 0.5) * width, y;
                if (counts[k]) {
                    y = median_of(bucket_values + offsets[k], counts[k]);
                } else {
                    y = value_at(&w, x, stale);
                    if (isnan(y))
                        continue;
                }
                xs[n] = x;
                ys[n] = y;
                n++;
            }
            int judged = n >= buckets / 2 && (!(tick - since < min_coverage * trend_window) ||
                                              CLOSE(tick - since, min_coverage * trend_window));
            if (judged) {
                int close = 0;
                for (Py_ssize_t i = 0; i < n; i++)
                    steps_work[i] = ys[i];
                double floor_ = 0.1 * median_of(steps_work, n);
                double spread_unused;
                remove_steps(ys, n, floor_, clean, steps_work, &spread_unused, &close);
                long long s = 0;
                for (Py_ssize_t j = 1; j < n; j++)
                    for (Py_ssize_t i = 0; i < j; i++)
                        s += (clean[j] > clean[i]) - (clean[j] < clean[i]);
                double var = (double)(n * (n - 1) * (2 * n + 5)) / 18.0;
                double z = s ? ((double)s - (s > 0 ? 1.0 : -1.0)) / sqrt(var) : 0.0;
                int maybe = close || !(z_min > 0 && z < z_min);
                if (maybe && !close) {
                    Py_ssize_t pairs = n * (n - 1) / 2, q = 0;
                    double *slopes = bucket_values; /* the bucket values are no longer needed */
                    if (pairs > cap) {
                        maybe = 1;
                    } else {
                        for (Py_ssize_t i = 0; i + 1 < n; i++)
                            for (Py_ssize_t j = i + 1; j < n; j++)
                                slopes[q++] = (clean[j] - clean[i]) / (xs[j] - xs[i]);
                        double slope = median_of(slopes, pairs);
                        Py_ssize_t third = n / 3 > 2 ? n / 3 : 2;
                        for (Py_ssize_t i = 0; i < third; i++)
                            steps_work[i] = ys[i];
                        double start = median_of(steps_work, third);
                        start = start >= 1e-4 ? start : 1e-4;
                        double growth = slope * trend_window / start;
                        maybe = growth >= min_growth * (1 - 1e-9);
                    }
                }
                if (maybe)
                    flag = (double)((int)flag | SCREEN_TREND);
            }
        }
        flags[t] = flag;
    }
    PyObject *lv = PyBytes_FromStringAndSize((const char *)levels, (Py_ssize_t)sizeof(double) * nt);
    PyObject *fl = PyBytes_FromStringAndSize((const char *)flags, (Py_ssize_t)sizeof(double) * nt);
    if (lv && fl)
        result = PyTuple_Pack(2, lv, fl);
    Py_XDECREF(lv);
    Py_XDECREF(fl);
release:
    for (int i = 0; i < 3; i++)
        PyMem_Free(copies[i]);
    PyMem_Free(counts);
    PyMem_Free(levels);
    PyMem_Free(flags);
    PyMem_Free(work);
    PyMem_Free(points);
    return result;
}

/* bucket_quantiles(bounds, counts, q) -> bytes of doubles: agent.series.buckets' interval quantile,
 * PromQL's histogram_quantile of the bucket deltas between consecutive scrapes
 * (agent.core.quantiles.bucket_quantile, the same operations in the same order). `bounds` are the
 * k distinct upper bounds in ascending order, `counts` the k cumulative count columns one after
 * another (bound-major, n scrapes each): bytes of doubles (array("d").tobytes()). One result per
 * interval (n - 1), NaN where histogram_quantile gives no number. A count that is not finite at
 * either end leaves its bound out of that interval; a counter that went down counts from zero. */
static PyObject *bucket_quantiles(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "bucket_quantiles: bounds, counts (bytes of doubles) and q");
        return NULL;
    }
    double q = PyFloat_AsDouble(args[2]);
    if (q == -1.0 && PyErr_Occurred())
        return NULL;
    Py_ssize_t k, total;
    double *bounds = get_doubles(args[0], &k);
    if (!bounds)
        return NULL;
    double *counts = get_doubles(args[1], &total);
    if (!counts) {
        PyMem_Free(bounds);
        return NULL;
    }
    PyObject *result = NULL;
    double *out = NULL, *b = NULL, *c = NULL;
    if (k < 1 || total % k) {
        PyErr_SetString(PyExc_ValueError, "bucket_quantiles: counts are not k columns of one length");
        goto release;
    }
    Py_ssize_t n = total / k, intervals = n > 1 ? n - 1 : 0;
    out = PyMem_Malloc(sizeof(double) * (size_t)(intervals + 1));
    b = PyMem_Malloc(sizeof(double) * (size_t)k);
    c = PyMem_Malloc(sizeof(double) * (size_t)k);
    if (!out || !b || !c) {
        PyErr_NoMemory();
        goto release;
    }
    for (Py_ssize_t i = 0; i < intervals; i++) {
        Py_ssize_t m = 0;
        for (Py_ssize_t j = 0; j < k; j++) {
            double start = counts[j * n + i], end = counts[j * n + i + 1];
            if (!(isfinite(start) && isfinite(end)))
                continue;
            b[m] = bounds[j];
            c[m++] = end >= start ? end - start : end;
        }
        double value = NAN;
        if (isnan(q)) {
            value = NAN;
        } else if (q < 0) {
            value = -INFINITY;
        } else if (q > 1) {
            value = INFINITY;
        } else if (m >= 2 && b[m - 1] == INFINITY) {
            double previous = c[0];
            for (Py_ssize_t j = 1; j < m; j++) { /* float noise smoothed out */
                double current = c[j];
                if (current != previous && current != 0 && fabs(current - previous) / fabs(current) <= 1e-12)
                    c[j] = previous;
                else
                    previous = current;
            }
            double highest = c[0];
            for (Py_ssize_t j = 1; j < m; j++) { /* then made monotonic */
                if (c[j] < highest)
                    c[j] = highest;
                else
                    highest = c[j];
            }
            double all = c[m - 1];
            if (all > 0) {
                double rank = q * all;
                Py_ssize_t index = m - 1;
                for (Py_ssize_t j = 0; j < m - 1; j++) {
                    if (c[j] >= rank) {
                        index = j;
                        break;
                    }
                }
                if (index == m - 1) {
                    value = b[m - 2];
                } else if (index == 0 && b[0] <= 0) {
                    value = b[0];
                } else {
                    double start = index > 0 ? b[index - 1] : 0.0, below = index > 0 ? c[index - 1] : 0.0;
                    double in_bucket = c[index] - below;
                    if (in_bucket != 0) {
                        volatile double share = (rank - below) / in_bucket; /* no fused multiply-add */
                        volatile double width = (b[index] - start) * share;
                        value = start + width;
                    }
                }
            }
        }
        out[i] = isfinite(value) ? value : NAN;
    }
    result = PyBytes_FromStringAndSize((const char *)out, (Py_ssize_t)(sizeof(double) * (size_t)intervals));
release:
    PyMem_Free(bounds);
    PyMem_Free(counts);
    PyMem_Free(out);
    PyMem_Free(b);
    PyMem_Free(c);
    return result;
}

/* The `values` array of one series of a Prometheus query_range export, scanned in place:
 * matrix_values(text, start) -> (times, values, end) or None. `text` is the export (an ASCII str),
 * `start` the index of the array's `[`; `times` and `values` are bytes of doubles of the points
 * whose value is finite (NaN and +-Inf, as Prometheus writes them, are gaps), `end` the index after
 * the closing `]`. Only the shape Prometheus writes is taken: `[[<JSON number>, "<number>"], ...]`
 * with JSON whitespace, a value string of an optional sign and digits with an optional fraction and
 * exponent, or NaN/Inf/Infinity in any case. Anything else (another layout, an escape, a time that
 * is not finite, broken JSON) gives None, and agent.series.prometheus decodes that series with the
 * json module instead, which reports what is wrong: what is returned is what that path reads. The
 * numbers are converted by PyOS_string_to_double, the conversion of float() and of json. */
static int is_json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static const char *skip_space(const char *p, const char *end)
{
    while (p < end && is_json_space(*p))
        p++;
    return p;
}

static const char *skip_digits(const char *p, const char *end)
{
    while (p < end && is_digit(*p))
        p++;
    return p;
}

/* Past an exponent ([eE][+-]?[0-9]+) at p; p itself when there is none, NULL when it has no digits. */
static const char *skip_exponent(const char *p, const char *end)
{
    if (p >= end || (*p != 'e' && *p != 'E'))
        return p;
    p++;
    if (p < end && (*p == '+' || *p == '-'))
        p++;
    const char *digits = p;
    p = skip_digits(p, end);
    return p == digits ? NULL : p;
}

/* The end of a JSON number at p (-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?), NULL if there is
 * none; *integral says it has neither fraction nor exponent (json decodes it as an int). */
static const char *json_number_end(const char *p, const char *end, int *integral)
{
    *integral = 1;
    if (p < end && *p == '-')
        p++;
    if (p >= end || !is_digit(*p))
        return NULL;
    p = *p == '0' ? p + 1 : skip_digits(p, end);
    if (p < end && *p == '.') {
        const char *digits = ++p;
        p = skip_digits(p, end);
        if (p == digits)
            return NULL;
        *integral = 0;
    }
    const char *after = skip_exponent(p, end);
    if (after != p)
        *integral = 0;
    return after;
}

/* Whether [p, end) is `word` (lower case) in any case. */
static int same_word(const char *p, const char *end, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(end - p) != n)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((p[i] | 0x20) != word[i])
            return 0;
    return 1;
}

/* Whether [p, end) is a value string float() reads without stripping or underscores: a sign, then
 * digits with an optional fraction ("1.", ".5") and exponent, or nan, inf or infinity. */
static int plain_float_text(const char *p, const char *end)
{
    if (p < end && (*p == '+' || *p == '-'))
        p++;
    if (p < end && !is_digit(*p) && *p != '.')
        return same_word(p, end, "nan") || same_word(p, end, "inf") || same_word(p, end, "infinity");
    const char *digits = p;
    p = skip_digits(p, end);
    size_t count = (size_t)(p - digits);
    if (p < end && *p == '.') {
        const char *fraction = ++p;
        p = skip_digits(p, end);
        count += (size_t)(p - fraction);
    }
    if (count == 0)
        return 0;
    return skip_exponent(p, end) == end;
}

static const double exact_powers_of_ten[] = {
    1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
};

/* A decimal text of at most 15 significant digits whose power of ten is at most 22 either way,
 * as the one correctly rounded IEEE multiplication or division of two exact doubles (Clinger's
 * fast path): the double PyOS_string_to_double gives, since a correctly rounded result is unique.
 * 0 for any other text (inf, nan, more digits, a larger exponent). */
static int exact_decimal(const char *p, const char *end, double *out)
{
    int negative = 0;
    if (p < end && (*p == '+' || *p == '-'))
        negative = *p++ == '-';
    unsigned long long mantissa = 0;
    int significant = 0, exponent = 0, digits = 0;
    for (; p < end && is_digit(*p); p++, digits++) {
        if (mantissa == 0 && *p == '0')
            continue;
        if (++significant > 15)
            return 0;
        mantissa = mantissa * 10 + (unsigned long long)(*p - '0');
    }
    if (p < end && *p == '.') {
        for (p++; p < end && is_digit(*p); p++, digits++) {
            exponent--;
            if (mantissa == 0 && *p == '0')
                continue;
            if (++significant > 15)
                return 0;
            mantissa = mantissa * 10 + (unsigned long long)(*p - '0');
        }
    }
    if (digits == 0)
        return 0;
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        int sign = 1, written = 0, count = 0;
        if (p < end && (*p == '+' || *p == '-'))
            sign = *p++ == '-' ? -1 : 1;
        for (; p < end && is_digit(*p); p++) {
            if (++count > 4)
                return 0;
            written = written * 10 + (*p - '0');
        }
        if (count == 0)
            return 0;
        exponent += sign * written;
    }
    if (p != end)
        return 0;
    double value = (double)mantissa; /* exact: under 10^15 < 2^53 */
    if (mantissa == 0)
        value = 0.0;
    else if (exponent >= 0 && exponent <= 22)
        value = value * exact_powers_of_ten[exponent];
    else if (exponent < 0 && exponent >= -22)
        value = value / exact_powers_of_ten[-exponent];
    else
        return 0;
    *out = negative ? -value : value;
    return 1;
}

/* The double of [p, end), a text plain_float_text or json_number_end accepted (what follows it
 * cannot continue a number); 0 when the conversion does not take all of it (it always should). */
static int to_double(const char *p, const char *end, double *out)
{
    if (exact_decimal(p, end, out))
        return 1;
    char *stop = NULL;
    *out = PyOS_string_to_double(p, &stop, NULL);
    int whole = !PyErr_Occurred() && stop == end;
    PyErr_Clear();
    return whole;
}

typedef struct {
    double *data;
    Py_ssize_t size, capacity;
} growing_doubles;

static int push(growing_doubles *d, double v)
{
    if (d->size == d->capacity) {
        Py_ssize_t capacity = d->capacity ? d->capacity * 2 : 1024;
        double *grown = PyMem_Realloc(d->data, sizeof(double) * (size_t)capacity);
        if (!grown)
            return 0;
        d->data = grown;
        d->capacity = capacity;
    }
    d->data[d->size++] = v;
    return 1;
}

/* 1 with the points added and *at after the array, 0 when the text is not of the taken shape,
 * -1 when memory ran out. */
static int scan_values(const char *end, const char **at, growing_doubles *times, growing_doubles *values)
{
    const char *p = *at;
    if (p >= end || *p != '[')
        return 0;
    p = skip_space(p + 1, end);
    if (p < end && *p == ']') {
        *at = p + 1;
        return 1;
    }
    for (;;) {
        if (p >= end || *p != '[')
            return 0;
        p = skip_space(p + 1, end);
        int integral;
        const char *number_end = json_number_end(p, end, &integral);
        double ts, value;
        if (!number_end || !to_double(p, number_end, &ts) || !isfinite(ts))
            return 0;
        if (integral && ts == 0)
            ts = 0.0; /* json's int of "-0" is 0, +0.0 as a double */
        p = skip_space(number_end, end);
        if (p >= end || *p != ',')
            return 0;
        p = skip_space(p + 1, end);
        if (p >= end || *p != '"')
            return 0;
        const char *open = ++p;
        while (p < end && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20)
            p++;
        if (p >= end || *p != '"' || !plain_float_text(open, p) || !to_double(open, p, &value))
            return 0;
        if (isfinite(value) && !(push(times, ts) && push(values, value)))
            return -1;
        p = skip_space(p + 1, end);
        if (p >= end || *p != ']')
            return 0;
        p = skip_space(p + 1, end);
        if (p < end && *p == ',') {
            p = skip_space(p + 1, end);
            continue;
        }
        if (p < end && *p == ']') {
            *at = p + 1;
            return 1;
        }
        return 0;
    }
}

static PyObject *matrix_values(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 2 || !PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "matrix_values: the export's text (str) and the index of a values array");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t size;
    const char *text = PyUnicode_AsUTF8AndSize(args[0], &size);
    if (!text)
        return NULL;
    if (size != PyUnicode_GetLength(args[0]) || start < 0 || start > size)
        Py_RETURN_NONE; /* not ASCII (indices of characters are not those of bytes), or out of it */
    growing_doubles times = {NULL, 0, 0}, values = {NULL, 0, 0};
    const char *at = text + start;
    PyObject *result = NULL;
    int scanned = scan_values(text + size, &at, &times, &values);
    if (scanned < 0) {
        PyErr_NoMemory();
    } else if (scanned == 0) {
        result = Py_NewRef(Py_None);
    } else {
        Py_ssize_t bytes = (Py_ssize_t)(sizeof(double) * (size_t)times.size);
        const char *t = times.data ? (const char *)times.data : "", *v = values.data ? (const char *)values.data : "";
        result = Py_BuildValue("(y#y#n)", t, bytes, v, bytes, (Py_ssize_t)(at - text)); /* y# of NULL is None */
    }
    PyMem_Free(times.data);
    PyMem_Free(values.data);
    return result;
}

/* Whether the slope of y on x over `n` pairs certainly stands fewer than `t` standard errors from 0
 * (or x barely varies): elasticity() in agent/detect/slow/relative.py then finds none. The same
 * sums in the same order; `1 - 1e-9` leaves the borderline to Python. */
static int inelastic(const double *x, const double *y, Py_ssize_t n, double t)
{
    double k = 0, sx = 0, sy = 0, sxx = 0, sxy = 0, syy = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        k = k + 1, sx = sx + x[i], sy = sy + y[i];
        sxx = sxx + x[i] * x[i], sxy = sxy + x[i] * y[i], syy = syy + y[i] * y[i];
    }
    double mean_x = sx / k, mean_y = sy / k;
    double spread_x = sxx - sx * mean_x, spread_y = syy - sy * mean_y, joint = sxy - sx * mean_y;
    if (spread_x <= 1e-12 * (sxx > 1.0 ? sxx : 1.0))
        return 1;
    double slope = joint / spread_x, left = spread_y - slope * joint;
    double residual = (left > 0.0 ? left : 0.0) / (k - 2 > 1.0 ? k - 2 : 1.0);
    return slope * slope < (1 - 1e-9) * (t * t * residual / spread_x);
}

/* rising_screen(ratios, peers, count, instants, base, window, numbers) -> bytes, one flag per
 * (instance, judged tick), instance by instance: the relative rule's screen
 * (agent/detect/slow/relative.py: rising_flags is its twin). `ratios` and `peers` are bytes of
 * doubles, `count` per instance (its ratio to its peers' median at each tick and that median, nan:
 * none); `instants` bytes of doubles, `base` + `window` per judged tick (oldest first; the tick's
 * position, -1: none), the first `base` before the window; `numbers` (grow, steady, t). A flag is 1
 * where `may_rise` holds (one of the newest five ratios of the window `grow` times the lower of 1
 * and the lowest before it, and `grow` times the lowest of the window); where it does not but one
 * of the newest five reaches `steady` times the lowest of the window and at least half of the
 * instants before have a ratio (`steadied` may set them), 3 when their slope on the peers' level
 * certainly has no elasticity (`t`), else 2; 0 otherwise. */
static PyObject *rising_screen(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 7 || !PyTuple_CheckExact(args[6]) || PyTuple_Size(args[6]) != 3) {
        PyErr_SetString(PyExc_TypeError, "rising_screen: ratios, peers, count, instants, base, window, 3 numbers");
        return NULL;
    }
    Py_ssize_t count = PyLong_AsSsize_t(args[2]), base = PyLong_AsSsize_t(args[4]);
    Py_ssize_t window = PyLong_AsSsize_t(args[5]);
    double grow = PyFloat_AsDouble(PyTuple_GetItem(args[6], 0));
    double steady = PyFloat_AsDouble(PyTuple_GetItem(args[6], 1)), t_min = PyFloat_AsDouble(PyTuple_GetItem(args[6], 2));
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t n_ratios = 0, n_peers = 0, n_instants = 0;
    double *ratios = get_doubles(args[0], &n_ratios), *peers = NULL, *instants = NULL, *logs = NULL;
    PyObject *result = NULL;
    if (!ratios || !(peers = get_doubles(args[1], &n_peers)) || !(instants = get_doubles(args[3], &n_instants)))
        goto done;
    Py_ssize_t width = base + window;
    if (count <= 0 || base < 0 || window <= 0 || n_ratios % count || n_peers != n_ratios || n_instants % width) {
        PyErr_SetString(PyExc_ValueError, "rising_screen: sizes that do not divide");
        goto done;
    }
    Py_ssize_t instances = n_ratios / count, judged = n_instants / width;
    for (Py_ssize_t k = 0; k < n_instants; k++) {
        double at = instants[k];
        if (!(at == -1.0 || (at >= 0 && at < (double)count && at == floor(at)))) {
            PyErr_SetString(PyExc_ValueError, "rising_screen: an instant that is no tick");
            goto done;
        }
    }
    logs = PyMem_Malloc(sizeof(double) * (size_t)(2 * base + 2));
    if (!logs) {
        PyErr_NoMemory();
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, instances * judged);
    char *flags = result ? PyBytes_AsString(result) : NULL;
    if (!flags) {
        Py_CLEAR(result);
        goto done;
    }
    for (Py_ssize_t i = 0; i < instances; i++) {
        const double *own = ratios + i * count, *centre = peers + i * count;
        for (Py_ssize_t t = 0; t < judged; t++) {
            const double *at = instants + t * width;
            double lowest = INFINITY, recent = -INFINITY, before = 1.0;
            Py_ssize_t seen = 0, earlier = 0;
            for (Py_ssize_t k = width - 1; k >= base; k--) { /* the window, newest first */
                if (at[k] < 0)
                    continue;
                double v = own[(Py_ssize_t)at[k]];
                if (isnan(v))
                    continue;
                if (seen < 5 && v > recent)
                    recent = v;
                if (v < lowest)
                    lowest = v;
                seen++;
            }
            char flag = 0;
            if (seen) {
                for (Py_ssize_t k = 0; k < base; k++) {
                    if (at[k] < 0)
                        continue;
                    double v = own[(Py_ssize_t)at[k]];
                    if (isnan(v))
                        continue;
                    if (v < before)
                        before = v;
                    logs[earlier] = log(centre[(Py_ssize_t)at[k]]);
                    logs[base + 1 + earlier] = log(v);
                    earlier++;
                }
                if (recent >= grow * before && recent >= grow * lowest)
                    flag = 1;
                else if (earlier * 2 >= base && recent >= steady * lowest)
                    flag = inelastic(logs, logs + base + 1, earlier, t_min) ? 3 : 2;
            }
            flags[i * judged + t] = flag;
        }
    }
done:
    PyMem_Free(ratios);
    PyMem_Free(peers);
    PyMem_Free(instants);
    PyMem_Free(logs);
    return result;
}

static PyMethodDef methods[] = {
    {"slope_median", (PyCFunction)(void (*)(void))slope_median, METH_FASTCALL,
     "slope_median(xs, ys) -> the median pairwise slope, or None for inputs that are not lists of floats"},
    {"slow_screen", (PyCFunction)(void (*)(void))slow_screen, METH_FASTCALL,
     "slow_screen(ticks, judged, points, starts, restarts, numbers) -> (levels, flags) as bytes of doubles"},
    {"rising_screen", (PyCFunction)(void (*)(void))rising_screen, METH_FASTCALL,
     "rising_screen(ratios, peers, count, instants, base, window, numbers) -> bytes of flags: the relative rule's screen"},
    {"bucket_quantiles", (PyCFunction)(void (*)(void))bucket_quantiles, METH_FASTCALL,
     "bucket_quantiles(bounds, counts, q) -> bytes of doubles: each interval's histogram_quantile"},
    {"matrix_values", (PyCFunction)(void (*)(void))matrix_values, METH_FASTCALL,
     "matrix_values(text, start) -> (times, values, end) of a query_range values array, or None"},
    {"steps_removed", (PyCFunction)(void (*)(void))steps_removed, METH_FASTCALL,
     "steps_removed(ys, floor) -> (count, spread, clean values or None), or None for input it does not model"},
    {"median", median, METH_O, "median(values) -> the median of a list of floats, or None for other input"},
    {"thirds_rise", thirds_rise, METH_O,
     "thirds_rise(ys) -> median of the last third less that of the first, or None for other input"},
    {"bucket_floors", (PyCFunction)(void (*)(void))bucket_floors, METH_FASTCALL,
     "bucket_floors(times, values, width) -> (indices, firsts, floors, peaks), or None for input it does not model"},
    {"mk_score", mk_score, METH_O, "mk_score(ys) -> Mann-Kendall S, or None for input that is not a list of floats"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "agent.detect._kernels", "C kernels of agent.detect.trend", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
