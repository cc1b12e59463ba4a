/* gpuremote._replay: the daemon's replay loop for plain calls, compiled.
 *
 * Session._run_replay (gpuremote/daemon/session.py) hands a Replay op's integers to replay(), which
 * runs, in order, the releases and the calls it can and returns where it stopped. It takes a call
 * only when the Python loop would run it the plain way: a template with a direct callable
 * (templates.set_direct), every handle bound, the first array of the backend's array class, the
 * slot shapes and dtypes the template's allocation bound was computed for, and room on the device
 * for that bound; then it takes the device for the call's flow and stream (Hold.take) as the Python
 * loop does. Anything else (an unknown template, a poisoned or unknown handle, new shapes, a
 * shutdown) makes it return *before* that item has any effect, and the Python loop runs the item
 * and calls back. So this file holds no policy of its own: every error message, every check it
 * does not repeat and every unusual result is Python's (_bind_one, _bind_replayed, _replay_failed).
 * What it saves is the interpreter's work between NumPy calls: a Python frame per call, per bind
 * and per release, the argument and meta lists, the template's attribute loads.
 *
 * The effects are those of the Python loop, in the same order: the call, then the result bound to
 * its handle with the memory ledger charged for a new buffer owner (views are free); a release
 * unbinds and credits the owner's bytes when its last handle goes. session.ops grows by the calls
 * run. A call that raises goes to Session._replay_failed, like the Python loop's.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* What Session passes as `state` (Session._compiled_state), in this order. */
enum {
    ST_HANDLES, ST_POISONED, ST_HANDLE_OWNER, ST_OWNERS, ST_MEMORY, ST_MEMORY_USED, ST_MEMORY_PEAK, ST_FLOWS,
    ST_TEMPLATES, ST_ARRAY_TYPE, ST_MAX_CALLS, ST_MAX_HANDLES, ST_MAX_RANK, ST_KINDS, ST_OWNER,
    ST_STRICT, ST_ASARRAY, ST_COUNT
};

#define REPLAY_API 5     /* bump with any change to what replay() takes or reads (session.py checks it) */
#define MAX_ARGS 16     /* arrays and constants of one direct call; longer calls take the Python path */

static PyObject *s_ending, *s_ops, *s_fixed, *s_metas, *s_need, *s_shape, *s_dtype,
    *s_flow, *s_stream, *s_sched, *s_waiting, *s_drop, *s_take, *s_charge, *s_credit, *s_kind,
    *s_ndim, *s_base, *s_nbytes, *s_bind_one, *s_bind_replayed, *s_replay_failed;

/* Template.fixed (gpuremote/daemon/templates.py): what a direct template's replay reads, in this order. */
enum { FX_DIRECT, FX_SLOTS, FX_RESULTS, FX_DEVICE, FX_STREAM, FX_TAIL, FX_KWARGS, FX_COUNT };

typedef struct {
    PyObject *session, *op, *calls, *hold;
    PyObject *handles, *poisoned, *handle_owner, *owners, *memory, *memory_used, *memory_peak, *flows, *templates;
    PyTypeObject *array_type;
    Py_ssize_t max_calls, max_handles, max_rank;
    PyObject *kinds, *owner, *strict, *asarray;
    PyObject *held_flow, *held_stream, *waiting;    /* the Hold's flow and stream, its scheduler's queue */
} Loop;

/* Outcome of one item: taken (effects done), left to Python (no effect), or a Python exception to raise. */
enum { LEFT = 0, TAKEN = 1, RAISED = -1 };

/* Ledger: the memory ledger's counters (gpuremote/daemon/ledger.py), bytes in use against a capacity,
 * with an optional parent that every charge also takes from (a lease's ledger charges its device's).
 * _take and _give change the whole chain in one C call: the GIL is held from the check to the last
 * update, so two threads cannot both take the last bytes, and no lock is needed (ledger.py uses the
 * Python version on a build without the GIL). The replay loop calls ledger_take/ledger_give directly;
 * the error messages are Python's (DeviceMemory.charge, LeaseMemory.charge). */
typedef struct Ledger {
    PyObject_HEAD
    long long capacity, used;
    struct Ledger *parent;
} Ledger;

static PyTypeObject LedgerType;

/* 0 when n more bytes fit in the ledger and each of its parents; else the depth (1: this ledger,
 * 2: its parent, ...) of the first one without room. */
static int ledger_short(Ledger *self, long long n) {
    int depth = 1;
    for (Ledger *l = self; l != NULL; l = l->parent, depth++) {
        long long total;
        if (__builtin_add_overflow(l->used, n, &total) || total > l->capacity)
            return depth;
    }
    return 0;
}

/* 0 when n bytes were taken from the ledger and each of its parents; else ledger_short's depth, and
 * nothing was taken. */
static int ledger_take(Ledger *self, long long n) {
    int depth = ledger_short(self, n);
    for (Ledger *l = self; depth == 0 && l != NULL; l = l->parent)
        l->used += n;
    return depth;
}

/* Give n bytes back to the ledger and its parents; 0, or -1 with AssertionError when one went negative. */
static int ledger_give(Ledger *self, long long n) {
    int negative = 0;
    for (Ledger *l = self; l != NULL; l = l->parent) {
        l->used -= n;
        negative |= l->used < 0;
    }
    if (negative) {
        PyErr_SetString(PyExc_AssertionError, "memory ledger went negative");
        return -1;
    }
    return 0;
}

/* A byte count as a C integer; one too large for it is more than any capacity (take refuses it). */
static int ledger_bytes(PyObject *n, long long *out, int *too_large) {
    if (!PyLong_Check(n)) {
        PyErr_Format(PyExc_TypeError, "byte count must be an int, not %.100s", Py_TYPE(n)->tp_name);
        return -1;
    }
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(n, &overflow);
    if (*out == -1 && PyErr_Occurred())
        return -1;
    *too_large = overflow != 0;
    return 0;
}

static PyObject *Ledger_take(Ledger *self, PyObject *n) {
    long long v;
    int too_large;
    if (ledger_bytes(n, &v, &too_large) < 0)
        return NULL;
    return PyLong_FromLong(too_large ? 1 : ledger_take(self, v));
}

static PyObject *Ledger_give(Ledger *self, PyObject *n) {
    long long v;
    int too_large;
    if (ledger_bytes(n, &v, &too_large) < 0)
        return NULL;
    if (too_large) {
        PyErr_SetString(PyExc_OverflowError, "credit of more bytes than a ledger can hold");
        return NULL;
    }
    if (ledger_give(self, v) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int Ledger_init(Ledger *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"capacity", "parent", NULL};
    long long capacity;
    PyObject *parent = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "L|O:Ledger", kwlist, &capacity, &parent))
        return -1;
    if (parent != Py_None && !PyObject_TypeCheck(parent, &LedgerType)) {
        PyErr_SetString(PyExc_TypeError, "a ledger's parent must be a ledger or None");
        return -1;
    }
    self->capacity = capacity;
    self->used = 0;
    Py_XINCREF(parent == Py_None ? NULL : parent);
    Py_XSETREF(self->parent, parent == Py_None ? NULL : (Ledger *)parent);
    return 0;
}

static int Ledger_traverse(Ledger *self, visitproc visit, void *arg) {
    Py_VISIT(self->parent);
    return 0;
}

static int Ledger_clear(Ledger *self) {
    Py_CLEAR(self->parent);
    return 0;
}

static void Ledger_dealloc(Ledger *self) {
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    Ledger_clear(self);
    type->tp_free((PyObject *)self);
}

static PyObject *Ledger_parent(Ledger *self, void *Py_UNUSED(closure)) {
    PyObject *p = self->parent ? (PyObject *)self->parent : Py_None;
    Py_INCREF(p);
    return p;
}

static PyMemberDef Ledger_members[] = {
    {"capacity", T_LONGLONG, offsetof(Ledger, capacity), READONLY, "bytes this ledger may hold"},
    {"used", T_LONGLONG, offsetof(Ledger, used), READONLY, "bytes charged and not yet credited"},
    {NULL},
};

static PyGetSetDef Ledger_getset[] = {
    {"parent", (getter)Ledger_parent, NULL, "the ledger every charge also takes from, or None", NULL},
    {NULL},
};

static PyMethodDef Ledger_methods[] = {
    {"_take", (PyCFunction)Ledger_take, METH_O,
     "_take(nbytes) -> 0 when taken from this ledger and its parents, else the depth (1, 2, ...) of the\n"
     "first without room; then nothing was taken."},
    {"_give", (PyCFunction)Ledger_give, METH_O, "_give(nbytes): give the bytes back to this ledger and its parents."},
    {NULL},
};

static PyTypeObject LedgerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gpuremote._replay.Ledger",
    .tp_doc = "Bytes in use against a capacity, with a parent ledger every charge also takes from.",
    .tp_basicsize = sizeof(Ledger),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Ledger_init,
    .tp_traverse = (traverseproc)Ledger_traverse,
    .tp_clear = (inquiry)Ledger_clear,
    .tp_dealloc = (destructor)Ledger_dealloc,
    .tp_members = Ledger_members,
    .tp_getset = Ledger_getset,
    .tp_methods = Ledger_methods,
};


static Py_ssize_t attr_ssize(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    Py_ssize_t out = PyLong_Check(v) ? PyLong_AsSsize_t(v) : -1;
    Py_DECREF(v);
    if (out == -1 && PyErr_Occurred())
        PyErr_Clear();
    return out;
}

/* lst[index] += delta for a list (or sequence) of ints: Session.memory_used[device]; with `peak`
 * (Session.memory_peak), also peak[index] = max(peak[index], the new value). */
static int add_to_item(PyObject *seq, PyObject *index, PyObject *delta, int subtract, PyObject *peak) {
    PyObject *cur = PyObject_GetItem(seq, index);
    if (cur == NULL)
        return -1;
    PyObject *next = subtract ? PyNumber_Subtract(cur, delta) : PyNumber_Add(cur, delta);
    Py_DECREF(cur);
    if (next == NULL)
        return -1;
    int rc = PyObject_SetItem(seq, index, next);
    if (rc == 0 && peak != NULL) {
        PyObject *top = PyObject_GetItem(peak, index);
        int higher = top ? PyObject_RichCompareBool(next, top, Py_GT) : -1;
        Py_XDECREF(top);
        rc = higher > 0 ? PyObject_SetItem(peak, index, next) : higher;
    }
    Py_DECREF(next);
    return rc;
}

/* Whether the replay loop may use `mem`'s counters itself for `nbytes`: a Ledger, and a byte count
 * that is an int of 64 bits (then in *n); else the ledger's own Python methods decide. */
static int ledger_count(PyObject *mem, PyObject *nbytes, long long *n) {
    if (!PyObject_TypeCheck(mem, &LedgerType) || !PyLong_CheckExact(nbytes))
        return 0;
    int overflow = 0;
    *n = PyLong_AsLongLongAndOverflow(nbytes, &overflow);
    return !overflow;       /* an exact int raises nothing here: past 64 bits it sets overflow */
}

/* session.memory[device].charge(nbytes): straight on a Ledger's counters when it has room, else (no
 * room: the error message is Python's; or another ledger class) through the method. 0 or -1. */
static int ledger_charge(PyObject *mem, PyObject *nbytes) {
    long long n;
    if (ledger_count(mem, nbytes, &n) && ledger_take((Ledger *)mem, n) == 0)
        return 0;
    PyObject *r = PyObject_CallMethodOneArg(mem, s_charge, nbytes);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* session.memory[device].credit(nbytes), likewise. 0 or -1. */
static int ledger_credit(PyObject *mem, PyObject *nbytes) {
    long long n;
    if (ledger_count(mem, nbytes, &n))
        return ledger_give((Ledger *)mem, n);
    PyObject *r = PyObject_CallMethodOneArg(mem, s_credit, nbytes);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* Session._release(h) for a handle that is bound and not poisoned; LEFT for any other. */
static int release(Loop *L, PyObject *h) {
    if (PyDict_GET_SIZE(L->poisoned)) {
        int in = PyDict_Contains(L->poisoned, h);
        if (in != 0)
            return in < 0 ? RAISED : LEFT;
    }
    PyObject *arr = PyDict_GetItemWithError(L->handles, h);
    if (arr == NULL)
        return PyErr_Occurred() ? RAISED : LEFT;     /* unknown: Python reports it */
    PyObject *key = PyDict_GetItemWithError(L->handle_owner, h);
    if (key == NULL)
        return PyErr_Occurred() ? RAISED : LEFT;
    Py_INCREF(key);
    PyObject *rec = PyDict_GetItemWithError(L->owners, key);
    if (rec == NULL || !PyList_CheckExact(rec) || PyList_GET_SIZE(rec) != 4) {
        Py_DECREF(key);
        return PyErr_Occurred() ? RAISED : LEFT;
    }
    Py_INCREF(rec);
    int rc = RAISED;
    if (PyDict_DelItem(L->handles, h) < 0 || PyDict_DelItem(L->handle_owner, h) < 0)
        goto done;
    Py_ssize_t refs = PyLong_AsSsize_t(PyList_GET_ITEM(rec, 1));
    if (refs == -1 && PyErr_Occurred())
        goto done;
    if (refs > 1) {
        PyObject *left = PyLong_FromSsize_t(refs - 1);
        if (left == NULL)
            goto done;
        PyList_SetItem(rec, 1, left);       /* steals `left` */
        rc = TAKEN;
        goto done;
    }
    if (PyDict_DelItem(L->owners, key) < 0)
        goto done;
    PyObject *nbytes = PyList_GET_ITEM(rec, 2), *device = PyList_GET_ITEM(rec, 3);
    PyObject *mem = PyObject_GetItem(L->memory, device);
    if (mem == NULL)
        goto done;
    int credited = ledger_credit(mem, nbytes);
    Py_DECREF(mem);
    if (credited < 0 || add_to_item(L->memory_used, device, nbytes, 1, NULL) < 0)
        goto done;
    rc = TAKEN;
done:
    Py_DECREF(rec);
    Py_DECREF(key);
    return rc;
}

/* backend.owner(arr); with owner None (Backend.owner_by_base), the last array down arr's .base chain. */
static PyObject *owner_of(Loop *L, PyObject *arr) {
    PyObject *owned;
    if (L->owner != Py_None) {
        owned = PyObject_CallOneArg(L->owner, arr);
        if (owned != NULL && (!PyTuple_CheckExact(owned) || PyTuple_GET_SIZE(owned) != 2)) {
            Py_DECREF(owned);
            PyErr_SetString(PyExc_TypeError, "backend.owner must return (owner, nbytes)");
            return NULL;
        }
        return owned;
    }
    PyObject *base = arr;
    Py_INCREF(base);
    for (;;) {
        PyObject *next = PyObject_GetAttr(base, s_base);
        if (next == NULL) {
            Py_DECREF(base);
            return NULL;
        }
        if (!PyObject_TypeCheck(next, L->array_type) && next != Py_None) {
            /* NumPy's as_strided views (sliding_window_view) hold their array through a DummyArray */
            PyObject *inner = PyObject_GetAttr(next, s_base);
            Py_DECREF(next);
            if (inner == NULL)
                PyErr_Clear();
            next = inner;
        }
        if (next == NULL || !PyObject_TypeCheck(next, L->array_type)) {
            Py_XDECREF(next);
            break;
        }
        Py_DECREF(base);
        base = next;
    }
    PyObject *nbytes = PyObject_GetAttr(base, s_nbytes);
    owned = nbytes ? PyTuple_Pack(2, base, nbytes) : NULL;
    Py_DECREF(base);
    Py_XDECREF(nbytes);
    return owned;
}

/* Session._bind_one(h, result, device); the checks that refuse a bind are Python's (it raises). */
static int bind(Loop *L, PyObject *h, PyObject *result, PyObject *device) {
    int plain = PyLong_CheckExact(h) && PyObject_IsTrue(h) == 1
        && PyDict_GET_SIZE(L->handles) < L->max_handles
        && !PyDict_Contains(L->handles, h)
        && !(PyDict_GET_SIZE(L->poisoned) && PyDict_Contains(L->poisoned, h));
    if (plain) {
        PyObject *dtype = PyObject_GetAttr(result, s_dtype);
        PyObject *kind = dtype ? PyObject_GetAttr(dtype, s_kind) : NULL;
        Py_XDECREF(dtype);
        plain = kind != NULL && PySequence_Contains(L->kinds, kind) == 1;
        Py_XDECREF(kind);
        Py_ssize_t ndim = plain ? attr_ssize(result, s_ndim) : -1;
        plain = plain && ndim >= 0 && ndim <= L->max_rank;
    }
    if (PyErr_Occurred())
        return RAISED;
    if (!plain) {           /* Python's checks raise the error this bind earns */
        PyObject *r = PyObject_CallMethodObjArgs(L->session, s_bind_one, h, result, device, NULL);
        Py_XDECREF(r);
        return r == NULL ? RAISED : TAKEN;
    }
    PyObject *owned = owner_of(L, result);     /* (buffer owner, its bytes) */
    if (owned == NULL)
        return RAISED;
    PyObject *owner = PyTuple_GET_ITEM(owned, 0), *nbytes = PyTuple_GET_ITEM(owned, 1);
    int rc = RAISED;
    PyObject *key = PyLong_FromVoidPtr(owner);      /* id(owner) */
    if (key == NULL)
        goto done;
    PyObject *rec = PyDict_GetItemWithError(L->owners, key);
    if (rec == NULL) {
        if (PyErr_Occurred())
            goto done;
        PyObject *mem = PyObject_GetItem(L->memory, device);
        if (mem == NULL)
            goto done;
        int charged = ledger_charge(mem, nbytes);     /* raises OutOfMemoryError */
        Py_DECREF(mem);
        if (charged < 0)
            goto done;
        PyObject *one = PyLong_FromLong(1);
        PyObject *fresh = one ? PyList_New(4) : NULL;
        if (fresh == NULL) {
            Py_XDECREF(one);
            goto done;
        }
        Py_INCREF(owner), Py_INCREF(nbytes), Py_INCREF(device);
        PyList_SET_ITEM(fresh, 0, owner);
        PyList_SET_ITEM(fresh, 1, one);
        PyList_SET_ITEM(fresh, 2, nbytes);
        PyList_SET_ITEM(fresh, 3, device);
        int set = PyDict_SetItem(L->owners, key, fresh);
        Py_DECREF(fresh);
        if (set < 0 || add_to_item(L->memory_used, device, nbytes, 0, L->memory_peak) < 0)
            goto done;
    } else {
        if (!PyList_CheckExact(rec) || PyList_GET_SIZE(rec) != 4) {
            PyErr_SetString(PyExc_TypeError, "malformed owner record");
            goto done;
        }
        Py_ssize_t refs = PyLong_AsSsize_t(PyList_GET_ITEM(rec, 1));
        PyObject *more = refs == -1 && PyErr_Occurred() ? NULL : PyLong_FromSsize_t(refs + 1);
        if (more == NULL)
            goto done;
        PyList_SetItem(rec, 1, more);
    }
    if (PyDict_SetItem(L->handles, h, result) < 0 || PyDict_SetItem(L->handle_owner, h, key) < 0)
        goto done;
    rc = TAKEN;
done:
    Py_XDECREF(key);
    Py_DECREF(owned);
    return rc;
}

/* The Hold's state, read when replay() starts and after each Hold.take: which flow and stream it
 * holds (Hold.take would do nothing for a call on them), and the queue of flows waiting for that
 * device. */
static int read_hold(Loop *L) {
    L->held_flow = L->held_stream = L->waiting = NULL;
    PyObject *flow = PyObject_GetAttr(L->hold, s_flow);
    if (flow == NULL)
        return -1;
    if (flow == Py_None) {
        Py_DECREF(flow);
        return 0;
    }
    PyObject *stream = PyObject_GetAttr(L->hold, s_stream);
    PyObject *sched = stream ? PyObject_GetAttr(flow, s_sched) : NULL;
    PyObject *waiting = sched ? PyObject_GetAttr(sched, s_waiting) : NULL;
    Py_XDECREF(sched);
    if (waiting == NULL || !PyList_CheckExact(waiting)) {
        int broken = waiting == NULL;
        Py_DECREF(flow);
        Py_XDECREF(stream);
        Py_XDECREF(waiting);
        return broken ? -1 : 0;
    }
    L->held_flow = flow;
    L->held_stream = stream;
    L->waiting = waiting;
    return 0;
}

static void forget_hold(Loop *L) {
    Py_CLEAR(L->held_flow);
    Py_CLEAR(L->held_stream);
    Py_CLEAR(L->waiting);
}

/* Hold.call_done(): give the device back if another flow waits for it (the next call takes it
 * again, in its turn). */
static int call_done(Loop *L) {
    if (L->waiting == NULL || PyList_GET_SIZE(L->waiting) == 0)
        return 0;
    forget_hold(L);
    PyObject *r = PyObject_CallMethodNoArgs(L->hold, s_drop);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* Whether the arrays' (shape, dtype) are those in the template's `metas` list. */
static int same_metas(PyObject *metas, PyObject **arrays, Py_ssize_t n) {
    if (!PyList_CheckExact(metas) || PyList_GET_SIZE(metas) != n)
        return 0;
    for (Py_ssize_t s = 0; s < n; s++) {
        PyObject *m = PyList_GET_ITEM(metas, s);
        if (!PyTuple_CheckExact(m) || PyTuple_GET_SIZE(m) != 2)
            return 0;
        PyObject *shape = PyObject_GetAttr(arrays[s], s_shape);
        if (shape == NULL)
            return -1;
        int eq = PyObject_RichCompareBool(shape, PyTuple_GET_ITEM(m, 0), Py_EQ);
        Py_DECREF(shape);
        if (eq != 1)
            return eq;
        PyObject *dtype = PyObject_GetAttr(arrays[s], s_dtype);
        if (dtype == NULL)
            return -1;
        eq = PyObject_RichCompareBool(dtype, PyTuple_GET_ITEM(m, 1), Py_EQ);
        Py_DECREF(dtype);
        if (eq != 1)
            return eq;
    }
    return 1;
}

/* Whether `need` more bytes fit in the ledger (its check() would not raise), in it and each of its
 * parents; 0 for a ledger that is not a Ledger: the Python loop checks the call. */
static int fits(PyObject *mem, PyObject *need) {
    long long n;
    return ledger_count(mem, need, &n) && ledger_short((Ledger *)mem, n) == 0;
}

/* The failure (the exception now set) of the call whose result handles are calls[j:k], handed to
 * Session._replay_failed as the Python loop does; an exception that is not an Exception
 * (KeyboardInterrupt) is left to propagate. */
static int failed(Loop *L, PyObject *t, Py_ssize_t j, Py_ssize_t k, Py_ssize_t count) {
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return RAISED;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
    PyObject *n = PyLong_FromSsize_t(count);
    PyObject *results = n ? PyList_GetSlice(L->calls, j, k) : NULL;
    PyObject *r = results ? PyObject_CallMethodObjArgs(L->session, s_replay_failed, L->op, t, results, n,
                                                       value ? value : Py_None, NULL) : NULL;
    Py_XDECREF(n), Py_XDECREF(results), Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(tb);
    Py_XDECREF(r);
    return r == NULL ? RAISED : TAKEN;
}

/* A new list holding `n` of `items`. */
static PyObject *list_of(PyObject **items, Py_ssize_t n) {
    PyObject *out = PyList_New(n);
    for (Py_ssize_t s = 0; out != NULL && s < n; s++) {
        Py_INCREF(items[s]);
        PyList_SET_ITEM(out, s, items[s]);
    }
    return out;
}

/* One replayed call at calls[*i]; on TAKEN *i is past it. */
static int call_one(Loop *L, PyObject *tid, Py_ssize_t *i, Py_ssize_t count) {
    PyObject *t = PyDict_GetItemWithError(L->templates, tid);
    if (t == NULL)
        return PyErr_Occurred() ? RAISED : LEFT;
    Py_INCREF(t);
    PyObject *fixed = NULL, *metas = NULL, *need = NULL, *result = NULL, *arrays_list = NULL;
    PyObject *flow = NULL;
    PyObject *stack[MAX_ARGS];
    Py_ssize_t n_arrays = 0;
    int rc = RAISED;
    Py_ssize_t n = PyList_GET_SIZE(L->calls);

    if ((fixed = PyObject_GetAttr(t, s_fixed)) == NULL)
        goto out;
    rc = LEFT;
    if (!PyTuple_CheckExact(fixed) || PyTuple_GET_SIZE(fixed) != FX_COUNT)
        goto out;                                       /* None: not a direct template */
    PyObject *direct = PyTuple_GET_ITEM(fixed, FX_DIRECT), *device = PyTuple_GET_ITEM(fixed, FX_DEVICE);
    PyObject *tail = PyTuple_GET_ITEM(fixed, FX_TAIL), *kwargs = PyTuple_GET_ITEM(fixed, FX_KWARGS);
    Py_ssize_t slots = PyLong_AsSsize_t(PyTuple_GET_ITEM(fixed, FX_SLOTS));
    Py_ssize_t n_results = PyLong_AsSsize_t(PyTuple_GET_ITEM(fixed, FX_RESULTS));
    if (PyErr_Occurred()) {
        rc = RAISED;
        goto out;
    }
    if (slots < 0 || n_results < 0 || n_results > 1 || !PyTuple_CheckExact(tail) || !PyDict_CheckExact(kwargs)
            || slots + PyTuple_GET_SIZE(tail) > MAX_ARGS)
        goto out;
    Py_ssize_t j = *i + 1 + slots, k = j + n_results;
    if (k > n || count >= L->max_calls)
        goto out;
    PyObject *stream = PyTuple_GET_ITEM(fixed, FX_STREAM);
    if ((flow = PyObject_GetItem(L->flows, device)) == NULL || flow == Py_None) {
        PyErr_Clear();                                  /* Python raises what a bad or ungranted device earns */
        goto out;
    }
    for (Py_ssize_t s = 0; s < slots; s++) {
        PyObject *a = PyDict_GetItemWithError(L->handles, PyList_GET_ITEM(L->calls, *i + 1 + s));
        if (a == NULL) {
            rc = PyErr_Occurred() ? RAISED : LEFT;      /* poisoned or unknown: Python says which */
            goto out;
        }
        Py_INCREF(a);
        stack[n_arrays++] = a;
    }
    if (n_arrays && Py_TYPE(stack[0]) != L->array_type)   /* none: a function of constants (`arange(n)`) */
        goto out;
    rc = RAISED;
    if ((metas = PyObject_GetAttr(t, s_metas)) == NULL)
        goto out;
    int same = same_metas(metas, stack, n_arrays);
    if (same != 1) {
        rc = same < 0 ? RAISED : LEFT;                  /* new shapes: Python bounds the call again */
        goto out;
    }
    if ((need = PyObject_GetAttr(t, s_need)) == NULL)
        goto out;
    int nonzero = PyObject_IsTrue(need);
    if (nonzero < 0)
        goto out;
    if (nonzero) {
        PyObject *mem = PyObject_GetItem(L->memory, device);
        int ok = mem ? fits(mem, need) : -1;
        Py_XDECREF(mem);
        if (ok != 1) {
            rc = ok < 0 ? RAISED : LEFT;                /* no room: Python raises OutOfMemoryError */
            goto out;
        }
    }
    Py_ssize_t nargs = n_arrays;
    for (Py_ssize_t s = 0; s < PyTuple_GET_SIZE(tail); s++)
        stack[nargs++] = PyTuple_GET_ITEM(tail, s);     /* borrowed: only the arrays are released below */
    int on = flow == L->held_flow
        && (stream == L->held_stream || PyObject_RichCompareBool(stream, L->held_stream, Py_EQ) == 1);
    if (!on) {      /* Hold.take: the device for this flow and stream, in its turn (the run's first call) */
        PyObject *r = PyObject_CallMethodObjArgs(L->hold, s_take, flow, stream, NULL);
        forget_hold(L);
        Py_XDECREF(r);
        if (r == NULL || read_hold(L) < 0) {
            rc = failed(L, t, j, k, count);
            goto ran;
        }
    }

    result = PyDict_GET_SIZE(kwargs) ? PyObject_VectorcallDict(direct, stack, nargs, kwargs)
                                     : PyObject_Vectorcall(direct, stack, nargs, NULL);
    if (result == Py_NotImplemented) {      /* nothing ran: Python raises the TypeError */
        rc = LEFT;
        goto out;
    }
    if (result == NULL) {
        rc = failed(L, t, j, k, count);
    } else if (n_results == 0) {            /* in place (`w -= lr * g`): nothing to bind */
        rc = TAKEN;
    } else {
        int ok = 1;
        if (L->strict == Py_None && !PyObject_TypeCheck(result, L->array_type) && !PyTuple_Check(result)
                && !PyList_Check(result)) {     /* a NumPy scalar (`x.mean()`): a 0-d array, as _bind_result */
            PyObject *converted = PyObject_CallOneArg(L->asarray, result);
            Py_SETREF(result, converted);
            if (result == NULL) {
                rc = failed(L, t, j, k, count);
                goto ran;
            }
        }
        if (Py_TYPE(result) != L->array_type || L->strict != Py_None) {
            if ((arrays_list = list_of(stack, n_arrays)) == NULL)
                goto out;
        }
        if (Py_TYPE(result) == L->array_type) {
            if (L->strict != Py_None) {     /* GPUREMOTE_STRICT_META: Session._check_replay */
                PyObject *r = PyObject_CallFunctionObjArgs(L->strict, t, arrays_list, result, NULL);
                ok = r != NULL;
                Py_XDECREF(r);
            }
            ok = ok && bind(L, PyList_GET_ITEM(L->calls, j), result, device) == TAKEN;
        } else {
            PyObject *results = PyList_GetSlice(L->calls, j, k);
            PyObject *r = results ? PyObject_CallMethodObjArgs(L->session, s_bind_replayed, t, arrays_list, result,
                                                               results, NULL) : NULL;
            ok = r != NULL;
            Py_XDECREF(results);
            Py_XDECREF(r);
        }
        rc = ok ? TAKEN : failed(L, t, j, k, count);
    }
ran:
    if (rc == TAKEN) {
        if (call_done(L) < 0)
            rc = RAISED;
        *i = k;
    }
out:
    for (Py_ssize_t s = 0; s < n_arrays; s++)
        Py_DECREF(stack[s]);
    Py_XDECREF(fixed), Py_XDECREF(metas), Py_XDECREF(need), Py_XDECREF(result);
    Py_XDECREF(arrays_list), Py_XDECREF(flow);
    Py_DECREF(t);
    return rc;
}

static PyObject *replay(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "replay(session, state, op, calls, i, count, hold)");
        return NULL;
    }
    Loop L;
    PyObject *state = args[1];
    L.session = args[0], L.op = args[2], L.calls = args[3], L.hold = args[6];
    if (!PyTuple_CheckExact(state) || PyTuple_GET_SIZE(state) != ST_COUNT || !PyList_CheckExact(L.calls)
            || !PyType_Check(PyTuple_GET_ITEM(state, ST_ARRAY_TYPE))) {
        PyErr_SetString(PyExc_TypeError, "replay: malformed session state or calls");
        return NULL;
    }
    L.handles = PyTuple_GET_ITEM(state, ST_HANDLES);
    L.poisoned = PyTuple_GET_ITEM(state, ST_POISONED);
    L.handle_owner = PyTuple_GET_ITEM(state, ST_HANDLE_OWNER);
    L.owners = PyTuple_GET_ITEM(state, ST_OWNERS);
    L.memory = PyTuple_GET_ITEM(state, ST_MEMORY);
    L.memory_used = PyTuple_GET_ITEM(state, ST_MEMORY_USED);
    L.memory_peak = PyTuple_GET_ITEM(state, ST_MEMORY_PEAK);
    L.flows = PyTuple_GET_ITEM(state, ST_FLOWS);
    L.templates = PyTuple_GET_ITEM(state, ST_TEMPLATES);
    L.array_type = (PyTypeObject *)PyTuple_GET_ITEM(state, ST_ARRAY_TYPE);
    L.kinds = PyTuple_GET_ITEM(state, ST_KINDS);
    L.owner = PyTuple_GET_ITEM(state, ST_OWNER);
    L.strict = PyTuple_GET_ITEM(state, ST_STRICT);
    L.asarray = PyTuple_GET_ITEM(state, ST_ASARRAY);
    if (!PyDict_CheckExact(L.handles) || !PyDict_CheckExact(L.poisoned) || !PyDict_CheckExact(L.handle_owner)
            || !PyDict_CheckExact(L.owners) || !PyDict_CheckExact(L.templates)) {
        PyErr_SetString(PyExc_TypeError, "replay: the session's tables must be dicts");
        return NULL;
    }
    L.max_calls = PyLong_AsSsize_t(PyTuple_GET_ITEM(state, ST_MAX_CALLS));
    L.max_handles = PyLong_AsSsize_t(PyTuple_GET_ITEM(state, ST_MAX_HANDLES));
    L.max_rank = PyLong_AsSsize_t(PyTuple_GET_ITEM(state, ST_MAX_RANK));
    Py_ssize_t i = PyLong_AsSsize_t(args[4]), count = PyLong_AsSsize_t(args[5]);
    if (PyErr_Occurred())
        return NULL;
    if (read_hold(&L) < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(L.calls), ran = 0;
    int rc = TAKEN;
    while (i >= 0 && i < n) {
        PyObject *ending = PyObject_GetAttr(L.session, s_ending);
        if (ending == NULL) {
            rc = RAISED;
            break;
        }
        int stop = ending != Py_None;
        Py_DECREF(ending);
        if (stop)
            break;                              /* Python ends the session */
        PyObject *tid = PyList_GET_ITEM(L.calls, i);
        if (!PyLong_CheckExact(tid))
            break;
        int zero = PyObject_Not(tid);
        if (zero < 0) {
            rc = RAISED;
            break;
        }
        if (zero) {                             /* a release: id 0, then the handle */
            if (i + 1 >= n)
                break;
            rc = release(&L, PyList_GET_ITEM(L.calls, i + 1));
            if (rc != TAKEN)
                break;
            i += 2;
            continue;
        }
        rc = call_one(&L, tid, &i, count);
        if (rc == LEFT)
            break;
        ran++;                                  /* run, whether it succeeded or failed */
        count++;
        if (rc == RAISED)
            break;
    }
    forget_hold(&L);
    if (ran) {                                  /* session.ops += ran, also when raising */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *ops = PyObject_GetAttr(L.session, s_ops);
        PyObject *d = ops ? PyLong_FromSsize_t(ran) : NULL;
        PyObject *sum = d ? PyNumber_Add(ops, d) : NULL;
        int set = sum ? PyObject_SetAttr(L.session, s_ops, sum) : -1;
        Py_XDECREF(ops), Py_XDECREF(d), Py_XDECREF(sum);
        if (type != NULL || set < 0) {
            if (type != NULL)
                PyErr_Restore(type, value, tb);
            return NULL;
        }
    }
    if (rc == RAISED)
        return NULL;
    return Py_BuildValue("(nn)", i, count);
}

static PyMethodDef methods[] = {
    {"replay", (PyCFunction)(void (*)(void))replay, METH_FASTCALL,
     "replay(session, state, op, calls, i, count, hold) -> (i, count): run the plain releases and calls\n"
     "of a Replay op's integers from calls[i]; stop before the first the Python loop must run."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "gpuremote._replay", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__replay(void) {
    struct { PyObject **slot; const char *name; } names[] = {
        {&s_ending, "ending"}, {&s_ops, "ops"}, {&s_fixed, "fixed"}, {&s_metas, "metas"},
        {&s_need, "need"}, {&s_shape, "shape"}, {&s_dtype, "dtype"},
        {&s_flow, "flow"}, {&s_stream, "stream"}, {&s_sched, "sched"},
        {&s_waiting, "_waiting"}, {&s_drop, "drop"}, {&s_take, "take"}, {&s_charge, "charge"}, {&s_credit, "credit"},
        {&s_kind, "kind"}, {&s_ndim, "ndim"}, {&s_base, "base"}, {&s_nbytes, "nbytes"},
        {&s_bind_one, "_bind_one"}, {&s_bind_replayed, "_bind_replayed"}, {&s_replay_failed, "_replay_failed"},
    };
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        if ((*names[k].slot = PyUnicode_InternFromString(names[k].name)) == NULL)
            return NULL;
    }
    if (PyType_Ready(&LedgerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddObjectRef(m, "Ledger", (PyObject *)&LedgerType) < 0)
        Py_CLEAR(m);
    /* session.py uses the module only if API is the contract it was written for: a stale build of an
     * older replay.c (an editable install not rebuilt) is ignored rather than misread. */
    if (m != NULL && PyModule_AddIntConstant(m, "API", REPLAY_API) < 0)
        Py_CLEAR(m);
    return m;
}
