/* gpuremote._forward: the client's path for a call it already replays, compiled.
 *
 * A training step makes the same calls at the same lines on arrays of the same shapes, and after
 * two steps each is a call template of the session (client/session.py): the third and later times
 * the client only has to find the template and append a few integers to the open Replay run. In
 * Python that finding costs most of the client's time per op (the signature, the source line, three
 * dict lookups). call() does the same steps in C, for the common case only, and returns None,
 * having changed nothing, whenever the Python path must run instead: an argument that is not an
 * array of this session, a Python int, bool, None, a nonzero float, a NumPy scalar, or a tuple,
 * list or slice of those (an `out=` keyword, a 0.0 or NaN constant, a host array: Python's path);
 * metadata not derived yet; a call not yet a template; streams in use; a closed session. So the
 * rules stay in Python (cupy/_core.py forward and _signature, client/session.py call and _replay):
 * this file repeats their common case, step for step, and tests/test_native.py checks that the
 * client sends byte for byte the same messages with it and without it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <structmember.h>

#define FORWARD_API 3    /* bump with any change to what call() or configure() take or read (_core.py checks) */
#define MAX_ITEMS 16     /* arguments of one call; longer calls take the Python path */

static PyObject *s_shape, *s_dtype, *s_session, *s_remote, *s_device, *s_handle, *s_lost, *s_closed, *s_lock,
    *s_acquire, *s_release, *s_max_templates, *s_templates, *s_handles, *s_releases, *s_queue_releases, *s_run,
    *s_open_run, *s_run_calls, *s_seq, *s_queued, *s_flush_ops, *s_flush, *s_ops, *s_replayed, *s_tobytes,
    *s_name, *s_streams_used, *s_filename, *s_out, *s_limit, *s_prefix, *s_batch_bytes, *zero;

/* Set once by configure() (cupy/_core.py, at import). */
static PyTypeObject *proxy_type, *generic_type;
static PyObject *wrap, *derived, *codes, *context, *stats;
static Py_ssize_t codes_limit;

/* The proxy class's slots (ndarray.__slots__) that ndarray._wrap fills, in its order; their offsets
 * in the object, read by configure() from the slots' member descriptors (-1: not found, and then
 * new_proxy() calls _wrap instead). */
enum { SLOT_SESSION, SLOT_HANDLE, SLOT_REMOTE, SLOT_DEVICE, SLOT_SHAPE, SLOT_DTYPE, SLOT_COUNT };
static Py_ssize_t slot_offsets[SLOT_COUNT] = {-1, -1, -1, -1, -1, -1};

/* Memo.put (gpuremote/memo.py): forget everything when full, then remember. */
static int memo_put(PyObject *memo, Py_ssize_t limit, PyObject *key, PyObject *value) {
    if (PyDict_GET_SIZE(memo) >= limit)
        PyDict_Clear(memo);
    return PyDict_SetItem(memo, key, value);
}

static int frame_lasti(PyFrameObject *f) {
#if PY_VERSION_HEX >= 0x030B0000
    return PyFrame_GetLasti(f);
#else
    PyObject *v = PyObject_GetAttrString((PyObject *)f, "f_lasti");
    int out = v ? (int)PyLong_AsLong(v) : -1;
    Py_XDECREF(v);
    return out;
#endif
}

static PyObject *frame_globals(PyFrameObject *f) {
#if PY_VERSION_HEX >= 0x030B0000
    return PyFrame_GetGlobals(f);
#else
    return PyObject_GetAttrString((PyObject *)f, "f_globals");
#endif
}

/* cupy/_core.site(): "file:line" of the first frame up the stack that is not gpuremote's own code,
 * with the same memo table: id(code) -> (code, whether it is gpuremote's, {bytecode offset: text}).
 * Keyed by identity, as hashing a code object hashes its constants and names at every call; the
 * entry holds the code, so its id cannot be reused while the entry lives. */
static PyObject *site(void) {
    PyFrameObject *f = PyEval_GetFrame();
    Py_XINCREF(f);
    while (f != NULL) {
        PyCodeObject *code = PyFrame_GetCode(f);
        PyObject *id = PyLong_FromVoidPtr(code), *rec = NULL;
        if (id != NULL && (rec = PyDict_GetItemWithError(codes, id)) != NULL) {
            Py_INCREF(rec);
        } else if (id != NULL && !PyErr_Occurred()) {
            PyObject *globals = frame_globals(f);
            PyObject *name = globals && PyDict_Check(globals) ? PyDict_GetItemWithError(globals, s_name) : NULL;
            int own = name != NULL && PyUnicode_Check(name)
                && PyUnicode_Tailmatch(name, s_prefix, 0, PY_SSIZE_T_MAX, -1) == 1;
            Py_XDECREF(globals);
            PyObject *lines = PyErr_Occurred() ? NULL : PyDict_New();
            rec = lines ? PyTuple_Pack(3, code, own ? Py_True : Py_False, lines) : NULL;
            Py_XDECREF(lines);
            if (rec != NULL && memo_put(codes, codes_limit, id, rec) < 0)
                Py_CLEAR(rec);
        }
        Py_XDECREF(id);
        if (rec != NULL && (!PyTuple_CheckExact(rec) || PyTuple_GET_SIZE(rec) != 3
                            || !PyDict_CheckExact(PyTuple_GET_ITEM(rec, 2)))) {
            PyErr_SetString(PyExc_TypeError, "malformed entry in cupy/_core._CODES");
            Py_CLEAR(rec);
        }
        if (rec == NULL) {
            Py_DECREF(code);
            Py_DECREF(f);
            return NULL;
        }
        if (PyTuple_GET_ITEM(rec, 1) != Py_True) {
            PyObject *lines = PyTuple_GET_ITEM(rec, 2);
            PyObject *offset = PyLong_FromLong(frame_lasti(f));
            PyObject *where = offset ? PyDict_GetItemWithError(lines, offset) : NULL;
            if (where != NULL) {
                Py_INCREF(where);
            } else if (offset != NULL && !PyErr_Occurred()) {
                PyObject *file = PyObject_GetAttr((PyObject *)code, s_filename);
                where = file ? PyUnicode_FromFormat("%U:%d", file, PyFrame_GetLineNumber(f)) : NULL;
                Py_XDECREF(file);
                if (where != NULL && PyDict_SetItem(lines, offset, where) < 0)
                    Py_CLEAR(where);
            }
            Py_XDECREF(offset);
            Py_DECREF(rec);
            Py_DECREF(code);
            Py_DECREF(f);
            return where;
        }
        Py_DECREF(rec);
        Py_DECREF(code);
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    return PyUnicode_FromString("");
}

/* cupy/_core._sig for the kinds this path takes; NULL without an error for any other (the Python
 * path then runs). An array's proxy goes to proxies[] (borrowed: the caller's arguments hold it). */
static PyObject *sig(PyObject *a, PyObject **proxies, Py_ssize_t *n_proxies, int depth) {
    PyTypeObject *t = Py_TYPE(a);
    if (t == proxy_type) {
        if (*n_proxies >= MAX_ITEMS)
            return NULL;
        PyObject *shape = PyObject_GetAttr(a, s_shape);
        if (shape == NULL || shape == Py_None) {
            Py_XDECREF(shape);
            return NULL;                    /* metadata not known yet */
        }
        PyObject *dtype = PyObject_GetAttr(a, s_dtype);
        PyObject *out = dtype ? PyTuple_Pack(2, shape, dtype) : NULL;
        Py_DECREF(shape);
        Py_XDECREF(dtype);
        proxies[(*n_proxies)++] = a;
        return out;
    }
    if (t == &PyLong_Type || t == &PyBool_Type || a == Py_None)
        return PyTuple_Pack(2, (PyObject *)t, a);
    if (t == &PyFloat_Type) {
        double v = PyFloat_AS_DOUBLE(a);
        if (v == 0.0 || v != v)
            return NULL;                    /* -0.0 and NaN are told apart by text there */
        return PyTuple_Pack(2, (PyObject *)t, a);
    }
    if (t == &PyTuple_Type || t == &PyList_Type || t == &PySlice_Type) {    /* `x[rows, cols]`, `x[a:b]` */
        PyObject *items[3];
        Py_ssize_t n;
        if (t == &PySlice_Type) {
            PySliceObject *sl = (PySliceObject *)a;
            items[0] = sl->start, items[1] = sl->stop, items[2] = sl->step;
            n = 3;
            depth = 1;                      /* as _sig(a.start, proxies, 1) */
        } else {
            n = PySequence_Fast_GET_SIZE(a);
            if (depth > 2 || n > MAX_ITEMS)
                return NULL;
            depth += 1;
        }
        PyObject *sigs = PyTuple_New(n);
        for (Py_ssize_t k = 0; sigs != NULL && k < n; k++) {
            PyObject *item = t == &PySlice_Type ? items[k] : PySequence_Fast_GET_ITEM(a, k);
            PyObject *s = sig(item, proxies, n_proxies, depth);
            if (s == NULL)
                Py_CLEAR(sigs);
            else
                PyTuple_SET_ITEM(sigs, k, s);
        }
        PyObject *out = sigs ? PyTuple_Pack(2, (PyObject *)t, sigs) : NULL;
        Py_XDECREF(sigs);
        return out;
    }
    if (PyObject_TypeCheck(a, generic_type)) {     /* a NumPy scalar: by its bytes */
        PyObject *bytes = PyObject_CallMethodNoArgs(a, s_tobytes);
        PyObject *out = bytes ? PyTuple_Pack(2, (PyObject *)t, bytes) : NULL;
        Py_XDECREF(bytes);
        return out;
    }
    return NULL;
}

static int set_int_attr(PyObject *obj, PyObject *name, Py_ssize_t delta, Py_ssize_t *value) {
    PyObject *cur = PyObject_GetAttr(obj, name);
    if (cur == NULL)
        return -1;
    Py_ssize_t v = PyLong_AsSsize_t(cur);
    Py_DECREF(cur);
    if (v == -1 && PyErr_Occurred())
        return -1;
    PyObject *next = PyLong_FromSsize_t(v + delta);
    int rc = next ? PyObject_SetAttr(obj, name, next) : -1;
    Py_XDECREF(next);
    if (value != NULL)
        *value = v + delta;
    return rc;
}

/* Session._queue_releases() of `releases` (session._releases, not empty): its common case here (one
 * array dropped since the last call, a run open: id 0 and the handle appended to the run), anything
 * else through the method. The GIL is held throughout, so no __del__ can append to the list in
 * between. */
static int queue_release(PyObject *session, PyObject *releases) {
    PyObject *run = PyObject_GetAttr(session, s_run);
    int rc = -1;
    if (run == NULL)
        goto done;
    if (PyList_CheckExact(releases) && PyList_GET_SIZE(releases) == 1 && PyList_CheckExact(run)) {
        PyObject *h = PyList_GET_ITEM(releases, 0);
        Py_INCREF(h);
        if (PyList_Append(run, zero) < 0 || PyList_Append(run, h) < 0
                || PyList_SetSlice(releases, 0, 1, NULL) < 0 || set_int_attr(session, s_batch_bytes, 12, NULL) < 0) {
            Py_DECREF(h);
            goto done;
        }
        Py_DECREF(h);
        rc = 0;
        goto done;
    }
    PyObject *r = PyObject_CallMethodNoArgs(session, s_queue_releases);
    Py_XDECREF(r);
    rc = r == NULL ? -1 : 0;
done:
    Py_XDECREF(run);
    return rc;
}

/* Session._replay(tid, proxies, (handle,) or () without one) under the session's lock, the template
 * known to exist. */
static int replay(PyObject *session, PyObject *tid, PyObject **proxies, Py_ssize_t n_proxies, PyObject *handle) {
    PyObject *releases = PyObject_GetAttr(session, s_releases);
    if (releases == NULL)
        return -1;
    int pending = PyObject_IsTrue(releases);
    int ok = pending > 0 ? queue_release(session, releases) : pending;
    Py_DECREF(releases);
    if (ok < 0)
        return -1;
    PyObject *run = PyObject_GetAttr(session, s_run);
    if (run == Py_None) {
        Py_DECREF(run);
        run = PyObject_CallMethodNoArgs(session, s_open_run);
    }
    if (run == NULL)
        return -1;
    int rc = -1;
    if (!PyList_CheckExact(run)) {
        PyErr_SetString(PyExc_TypeError, "Session._run is not a list");
        goto done;
    }
    Py_ssize_t calls;
    if (set_int_attr(session, s_run_calls, 1, &calls) < 0)
        goto done;
    if (calls > 1) {                        /* the i-th call of the run has the run op's seq + i */
        PyObject *seq = PyObject_GetAttr(session, s_seq);
        PyObject *skipped = seq ? PyIter_Next(seq) : NULL;
        Py_XDECREF(seq);
        if (skipped == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError, "Session._seq ended");
            goto done;
        }
        Py_DECREF(skipped);
    }
    if (PyList_Append(run, tid) < 0)
        goto done;
    for (Py_ssize_t k = 0; k < n_proxies; k++) {
        PyObject *h = PyObject_GetAttr(proxies[k], s_handle);
        int appended = h ? PyList_Append(run, h) : -1;
        Py_XDECREF(h);
        if (appended < 0)
            goto done;
    }
    if (handle != NULL && PyList_Append(run, handle) < 0)
        goto done;
    Py_ssize_t queued;
    if (set_int_attr(session, s_queued, 1, &queued) < 0 || set_int_attr(stats, s_ops, 1, NULL) < 0
            || set_int_attr(stats, s_replayed, 1, NULL) < 0)
        goto done;
    PyObject *limit = PyObject_GetAttr(session, s_flush_ops);
    Py_ssize_t flush_ops = limit ? PyLong_AsSsize_t(limit) : -1;
    Py_XDECREF(limit);
    if (flush_ops == -1 && PyErr_Occurred())
        goto done;
    if (queued >= flush_ops) {
        PyObject *r = PyObject_CallMethodNoArgs(session, s_flush);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
    }
    rc = 0;
done:
    Py_DECREF(run);
    return rc;
}

/* ndarray._wrap(session, handle, remote, device, meta): a new proxy with its slots filled, without
 * the classmethod's Python frame; `meta` is the (shape, dtype) derived for the result. */
static PyObject *new_proxy(PyObject *session, PyObject *handle, PyObject *remote, PyObject *device, PyObject *meta) {
    if (slot_offsets[0] < 0 || !PyTuple_CheckExact(meta) || PyTuple_GET_SIZE(meta) != 2)
        return PyObject_CallFunctionObjArgs(wrap, session, handle, remote, device, meta, NULL);
    PyObject *self = proxy_type->tp_alloc(proxy_type, 0);
    if (self == NULL)
        return NULL;
    PyObject *values[SLOT_COUNT] = {session, handle, remote, device, PyTuple_GET_ITEM(meta, 0),
                                    PyTuple_GET_ITEM(meta, 1)};
    for (int k = 0; k < SLOT_COUNT; k++)
        *(PyObject **)((char *)self + slot_offsets[k]) = Py_NewRef(values[k]);
    return self;
}

/* ndarray.__del__ (installed by finalizer()): Session.release(handle) of the proxy's session, that
 * is, the handle queued for release unless the session is closed; never raises, as the Python one. */
static PyObject *release_proxy(PyObject *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *session, *handle;
    if (slot_offsets[SLOT_SESSION] >= 0 && PyObject_TypeCheck(self, proxy_type)) {
        session = Py_XNewRef(*(PyObject **)((char *)self + slot_offsets[SLOT_SESSION]));
        handle = Py_XNewRef(*(PyObject **)((char *)self + slot_offsets[SLOT_HANDLE]));
    } else {        /* configure() has not found the slots (or was turned off): by name */
        session = PyObject_GetAttr(self, s_session);
        handle = session ? PyObject_GetAttr(self, s_handle) : NULL;
    }
    if (session == NULL || handle == NULL) {        /* a proxy never filled (ndarray.__new__ without a shape) */
        PyErr_Clear();
        Py_XDECREF(session);
        Py_XDECREF(handle);
        Py_RETURN_NONE;
    }
    PyObject *closed = PyObject_GetAttr(session, s_closed);
    int is_closed = closed ? PyObject_IsTrue(closed) : -1;
    Py_XDECREF(closed);
    if (is_closed == 0) {
        PyObject *releases = PyObject_GetAttr(session, s_releases);
        if (releases == NULL || (PyList_CheckExact(releases) ? PyList_Append(releases, handle)
                                                             : -1) < 0)
            is_closed = -1;
        Py_XDECREF(releases);
    }
    if (is_closed < 0)
        PyErr_Clear();
    Py_DECREF(session);
    Py_DECREF(handle);
    Py_RETURN_NONE;
}

static PyMethodDef release_def = {"__del__", release_proxy, METH_NOARGS,
                                  "Queue the array's handle for release (native/forward.c)."};

/* finalizer(): ndarray.__del__ as a method of the proxy class (configure() first). */
static PyObject *finalizer(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored)) {
    if (proxy_type == NULL || slot_offsets[0] < 0) {
        PyErr_SetString(PyExc_RuntimeError, "finalizer() needs configure() with a proxy class that has the slots");
        return NULL;
    }
    return PyDescr_NewMethod(proxy_type, &release_def);
}


/* call(name, args, kwargs, nin, in_place) -> the result's proxy, or None: see the top of this file.
 * `nin` is the ufunc's number of inputs for a module function (more arguments name outputs: Python's
 * path), else -1; `in_place` (`w -= g`: surface rule "self"): no result, the call returns args[0]. */
static PyObject *call(PyObject *Py_UNUSED(module), PyObject *const *argv, Py_ssize_t nargs) {
    if (nargs != 5 || !PyUnicode_Check(argv[0]) || !PyTuple_Check(argv[1]) || !PyDict_Check(argv[2])) {
        PyErr_SetString(PyExc_TypeError, "call(name: str, args: tuple, kwargs: dict, nin: int, in_place: bool)");
        return NULL;
    }
    int in_place = PyObject_IsTrue(argv[4]);
    if (in_place < 0)
        return NULL;
    if (proxy_type == NULL)
        Py_RETURN_NONE;                     /* not configured */
    PyObject *name = argv[0], *args = argv[1], *kwargs = argv[2];
    Py_ssize_t nin = PyLong_AsSsize_t(argv[3]);
    if (nin == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t n_args = PyTuple_GET_SIZE(args), n_kw = PyDict_GET_SIZE(kwargs);
    if (n_args + n_kw > MAX_ITEMS || (nin >= 0 && n_args > nin))
        Py_RETURN_NONE;
    PyObject *streams = PyObject_GetAttr(context, s_streams_used);
    int used = streams ? PyObject_IsTrue(streams) : -1;
    Py_XDECREF(streams);
    if (used != 0)
        return used < 0 ? NULL : Py_NewRef(Py_None);

    PyObject *proxies[MAX_ITEMS];
    Py_ssize_t n_proxies = 0;
    PyObject *key = PyTuple_New(1 + n_args + 2 * n_kw), *where = NULL, *tkey = NULL, *lock = NULL;
    PyObject *session = NULL, *remote = NULL, *device = NULL, *handle = NULL, *out = NULL, *meta = NULL;
    PyObject *tid = NULL;
    int locked = 0;
    if (key == NULL)
        return NULL;
    Py_INCREF(name);
    PyTuple_SET_ITEM(key, 0, name);
    Py_ssize_t pos = 1;     /* a fallback before the key is full leaves NULL items: tupledealloc skips them */
    for (Py_ssize_t k = 0; k < n_args; k++) {
        PyObject *s = sig(PyTuple_GET_ITEM(args, k), proxies, &n_proxies, 0);
        if (s == NULL)
            goto fallback;
        PyTuple_SET_ITEM(key, pos++, s);
    }
    PyObject *kname, *value;
    Py_ssize_t it = 0;
    while (PyDict_Next(kwargs, &it, &kname, &value)) {
        if (PyUnicode_Check(kname) && PyUnicode_Compare(kname, s_out) == 0)
            goto fallback;
        PyObject *s = sig(value, proxies, &n_proxies, 0);
        if (s == NULL)
            goto fallback;
        Py_INCREF(kname);
        PyTuple_SET_ITEM(key, pos++, kname);
        PyTuple_SET_ITEM(key, pos++, s);
    }
    if (n_proxies == 0 || (in_place && Py_TYPE(PyTuple_GET_ITEM(args, 0)) != proxy_type))
        goto fallback;                      /* no array (`arange(n)`), or an in-place call on something else */
    if (!in_place) {
        PyObject *metas = PyDict_GetItemWithError(derived, key);    /* borrowed */
        if (metas == NULL || !(PyTuple_CheckExact(metas) || PyList_CheckExact(metas))
                || PySequence_Fast_GET_SIZE(metas) != 1)
            goto fallback;                  /* not derived yet, or not one array */
        meta = Py_NewRef(PySequence_Fast_GET_ITEM(metas, 0));
    }
    if ((session = PyObject_GetAttr(proxies[0], s_session)) == NULL || (remote = PyObject_GetAttr(proxies[0], s_remote)) == NULL
            || (device = PyObject_GetAttr(proxies[0], s_device)) == NULL)
        goto fallback;
    for (Py_ssize_t k = 1; k < n_proxies; k++) {    /* arrays of two daemons: Python's error */
        PyObject *other = PyObject_GetAttr(proxies[k], s_session);
        Py_XDECREF(other);
        if (other != session)
            goto fallback;
    }
    PyObject *lost = PyObject_GetAttr(session, s_lost), *closed = lost ? PyObject_GetAttr(session, s_closed) : NULL;
    PyObject *templates_on = closed ? PyObject_GetAttr(session, s_max_templates) : NULL;
    int usable = templates_on != NULL && lost == Py_None && PyObject_IsTrue(closed) == 0 && PyObject_IsTrue(templates_on) == 1;
    Py_XDECREF(lost);
    Py_XDECREF(closed);
    Py_XDECREF(templates_on);
    if (!usable)
        goto fallback;
    if ((where = site()) == NULL)
        goto fallback;
    PyObject *stream = PyLong_FromLong(0);  /* no streams in use: context.current_stream_id is 0 */
    tkey = stream ? PyTuple_Pack(4, key, remote, stream, where) : NULL;
    Py_XDECREF(stream);
    if (tkey == NULL || (lock = PyObject_GetAttr(session, s_lock)) == NULL)
        goto fallback;
    PyObject *r = PyObject_CallMethodNoArgs(lock, s_acquire);
    if (r == NULL)
        goto fallback;
    Py_DECREF(r);
    locked = 1;
    PyObject *templates = PyObject_GetAttr(session, s_templates);
    tid = templates && PyDict_Check(templates) ? PyDict_GetItemWithError(templates, tkey) : NULL;
    Py_XINCREF(tid);
    Py_XDECREF(templates);
    if (tid == NULL)
        goto fallback;                      /* not a template yet: Python sights or defines it */
    /* From here on the call is queued: any error is the caller's exception, as in Python. */
    if (!in_place) {
        PyObject *counter = PyObject_GetAttr(session, s_handles);
        handle = counter ? PyIter_Next(counter) : NULL;
        Py_XDECREF(counter);
        if (handle == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError, "Session._handles ended");
            goto done;
        }
    }
    if (replay(session, tid, proxies, n_proxies, handle) < 0)
        goto done;
    r = PyObject_CallMethodNoArgs(lock, s_release);
    locked = 0;
    if (r == NULL)
        goto done;
    Py_DECREF(r);
    out = in_place ? Py_NewRef(PyTuple_GET_ITEM(args, 0))
                   : new_proxy(session, handle, remote, device, meta);
    goto done;
fallback:
    if (!PyErr_Occurred())
        out = Py_NewRef(Py_None);
done:
    if (locked) {                           /* keep the exception being raised, if any */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *r2 = PyObject_CallMethodNoArgs(lock, s_release);
        Py_XDECREF(r2);
        if (type != NULL) {
            PyErr_Clear();
            PyErr_Restore(type, value, tb);
        }
    }
    Py_XDECREF(key), Py_XDECREF(meta), Py_XDECREF(where), Py_XDECREF(tkey), Py_XDECREF(lock);
    Py_XDECREF(session), Py_XDECREF(remote), Py_XDECREF(device), Py_XDECREF(handle), Py_XDECREF(tid);
    if (out == NULL && !PyErr_Occurred())
        out = Py_NewRef(Py_None);
    return out;
}


static PyObject *configure(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *ptype, *gtype, *d, *cd, *ctx, *stt;
    if (PyTuple_GET_SIZE(args) == 0) {      /* off: call() answers None, the Python path runs every call */
        Py_CLEAR(wrap);
        Py_CLEAR(proxy_type);
        Py_CLEAR(generic_type);
        Py_CLEAR(derived);
        Py_CLEAR(codes);
        Py_CLEAR(context);
        Py_CLEAR(stats);
        for (int k = 0; k < SLOT_COUNT; k++)
            slot_offsets[k] = -1;
        Py_RETURN_NONE;
    }
    if (!PyArg_ParseTuple(args, "O!O!O!O!OO:configure", &PyType_Type, &ptype, &PyType_Type, &gtype,
                          &PyDict_Type, &d, &PyDict_Type, &cd, &ctx, &stt))
        return NULL;
    PyObject *w = PyObject_GetAttrString(ptype, "_wrap");
    PyObject *limit = w ? PyObject_GetAttr(cd, s_limit) : NULL;
    Py_ssize_t n = limit ? PyLong_AsSsize_t(limit) : -1;
    Py_XDECREF(limit);
    if (w == NULL || PyErr_Occurred()) {
        Py_XDECREF(w);
        return NULL;
    }
    Py_XSETREF(wrap, w);
    Py_XSETREF(proxy_type, (PyTypeObject *)Py_NewRef(ptype));
    Py_XSETREF(generic_type, (PyTypeObject *)Py_NewRef(gtype));
    Py_XSETREF(derived, Py_NewRef(d));
    Py_XSETREF(codes, Py_NewRef(cd));
    Py_XSETREF(context, Py_NewRef(ctx));
    Py_XSETREF(stats, Py_NewRef(stt));
    codes_limit = n;
    PyObject *slot_names[SLOT_COUNT] = {s_session, s_handle, s_remote, s_device, s_shape, s_dtype};
    Py_ssize_t found[SLOT_COUNT];
    int all = 1;
    for (int k = 0; k < SLOT_COUNT && all; k++) {     /* each a slot of ndarray's own: an object member */
        PyObject *descr = PyObject_GetAttr(ptype, slot_names[k]);
        all = descr != NULL && Py_IS_TYPE(descr, &PyMemberDescr_Type)
            && ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX;
        found[k] = all ? ((PyMemberDescrObject *)descr)->d_member->offset : -1;
        Py_XDECREF(descr);
    }
    PyErr_Clear();
    for (int k = 0; k < SLOT_COUNT; k++)
        slot_offsets[k] = all ? found[k] : -1;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"call", (PyCFunction)(void (*)(void))call, METH_FASTCALL,
     "call(name, args, kwargs, nin, in_place) -> the result's proxy, or None when the Python path must run the call."},
    {"configure", configure, METH_VARARGS,
     "configure(proxy_type, numpy.generic, derived, codes, context_module, stats): the tables call()\n"
     "reads; configure() with no arguments turns the path off."},
    {"finalizer", finalizer, METH_NOARGS, "finalizer() -> ndarray.__del__ in C (after configure())."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "gpuremote._forward", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__forward(void) {
    struct { PyObject **slot; const char *name; } names[] = {
        {&s_shape, "_shape"}, {&s_dtype, "_dtype"}, {&s_session, "_gr_session"}, {&s_remote, "_gr_remote"},
        {&s_device, "_gr_device"}, {&s_handle, "_gr_handle"}, {&s_lost, "lost"}, {&s_closed, "closed"},
        {&s_lock, "_lock"}, {&s_acquire, "acquire"}, {&s_release, "release"}, {&s_max_templates, "_max_templates"},
        {&s_templates, "_templates"}, {&s_handles, "_handles"}, {&s_releases, "_releases"},
        {&s_queue_releases, "_queue_releases"}, {&s_run, "_run"}, {&s_open_run, "_open_run"},
        {&s_run_calls, "_run_calls"}, {&s_seq, "_seq"}, {&s_queued, "_queued"}, {&s_flush_ops, "_flush_ops"},
        {&s_flush, "_flush"}, {&s_ops, "ops"}, {&s_replayed, "replayed"}, {&s_tobytes, "tobytes"},
        {&s_name, "__name__"}, {&s_streams_used, "_streams_used"}, {&s_filename, "co_filename"},
        {&s_out, "out"}, {&s_limit, "limit"}, {&s_prefix, "gpuremote."}, {&s_batch_bytes, "_batch_bytes"},
    };
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        if ((*names[k].slot = PyUnicode_InternFromString(names[k].name)) == NULL)
            return NULL;
    }
    if ((zero = PyLong_FromLong(0)) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    /* cupy/_core.py uses the module only if API is the contract it was written for. */
    if (m != NULL && PyModule_AddIntConstant(m, "API", FORWARD_API) < 0)
        Py_CLEAR(m);
    return m;
}
