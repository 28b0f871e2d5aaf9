/* The router's per-event relay in C: one streamed event from a replica to its client without running Python.
 *
 * A streamed request costs the router one read and one write per event (kernel work every router pays)
 * plus what it runs per event in between. In Python that was four frames and a dozen attribute loads,
 * which at 10 ms between a stream's events run on cold caches: about a fifth more CPU per request than
 * vllm-router (docs/router.md, "What a request costs the router"). This object takes the replica's
 * transport as its protocol while a stream is relayed (transport.set_protocol), so the event loop calls
 * straight into C for each read.
 *
 * It handles only vLLM's usual read: exactly one HTTP chunk holding exactly one single-line SSE event,
 * going to a client whose write buffer has room. Such a chunk's bytes are already the client's framing
 * (both sides speak chunked HTTP/1.1), so they are written as they came. Everything else (a partial or
 * multiple chunks, [DONE], the terminating chunk, a lagging or closing client, any state the Python relay
 * owns) is handed to the replica connection's Python protocol unchanged, which parses it with httptools as
 * if this object were not there. Handing over is lossless because the fast path consumes whole chunks
 * only: the parser sees a chunk boundary next whenever this object last took bytes.
 *
 * What the Python relay does per event and this object must do the same way (builders/router/relay.py,
 * Relay.on_body): store the call's last upstream time, count the gap since the previous event in the ITL
 * histogram (counts and sum), write, and raise the router's stream buffer peak.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#if PY_VERSION_HEX < 0x030C0000
/* Python 3.12 moved the member types into Python.h under Py_ names; older ones have only these. */
#include <structmember.h>
#define Py_T_BOOL T_BOOL
#define Py_T_ULONGLONG T_ULONGLONG
#define Py_READONLY READONLY
#endif
#include <string.h>
#include <time.h>

typedef struct {
    PyObject_HEAD
    PyObject *connection; /* the replica connection's Python protocol: everything off the fast path */
    PyObject *owner;      /* the Python Relay: says whether the fast path may go on after a hand-over */
    PyObject *call;       /* its last_upstream is stored per event */
    PyObject *events;     /* the Python framer: last_event is handed over with the bytes */
    PyObject *transport;  /* the client's */
    PyObject *itl;        /* HistogramSeries: counts (a list) and total */
    PyObject *router;     /* stream_buffer_peak */
    double *bounds;       /* itl.bounds, copied: the bucket search runs on doubles */
    Py_ssize_t nbounds;
    Py_ssize_t write_low;
    double last_event;
    int has_last_event;
    char enabled; /* a char: Py_T_BOOL members are */
    unsigned long long relayed;
} Relay;

static PyObject *s_data_received, *s_connection_lost, *s_eof_received, *s_pause_writing, *s_resume_writing;
static PyObject *s_fast_ok, *s_last_event, *s_last_upstream, *s_counts, *s_total, *s_bounds;
static PyObject *s_stream_buffer_peak, *s_write, *s_is_closing, *s_get_write_buffer_size;

static double monotonic_now(void) {
    /* The clock time.monotonic() reads on Linux, so times stored here compare with the router's own. */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The payload's offset when data is exactly one chunk holding one single-line "data:" event, else -1. */
static Py_ssize_t one_event_chunk(const char *p, Py_ssize_t n, Py_ssize_t *size_out) {
    Py_ssize_t i = 0, size = 0;
    int v;
    /* Eight hex digits are 4 GiB: more would be a chunk no stream sends, and could overflow. */
    while (i < n && i < 8 && (v = hex_value(p[i])) >= 0) {
        size = size * 16 + v;
        i++;
    }
    /* A chunk extension (";...") or a longer size line goes to httptools, which knows every form. */
    if (i == 0 || i + 2 > n || p[i] != '\r' || p[i + 1] != '\n') return -1;
    Py_ssize_t start = i + 2;
    if (size < 7 || start + size + 2 != n || p[n - 2] != '\r' || p[n - 1] != '\n') return -1;
    const char *payload = p + start;
    if (memcmp(payload, "data:", 5) != 0) return -1;
    /* One line, then the blank line that ends the event: the first newline is the second-to-last byte. */
    if (payload[size - 1] != '\n' || memchr(payload, '\n', (size_t)size) != payload + size - 2) return -1;
    /* [DONE] ends the answer; the Python relay marks the call delivered. It comes once per stream. */
    if ((size == 14 && memcmp(payload, "data: [DONE]\n\n", 14) == 0) ||
        (size == 13 && memcmp(payload, "data:[DONE]\n\n", 13) == 0))
        return -1;
    *size_out = size;
    return start;
}

static int observe_gap(Relay *self, double gap) {
    /* bisect_left over the bucket bounds: the first bound at or above the gap, as HistogramSeries.observe. */
    Py_ssize_t lo = 0, hi = self->nbounds;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (self->bounds[mid] < gap) lo = mid + 1;
        else hi = mid;
    }
    PyObject *counts = PyObject_GetAttr(self->itl, s_counts);
    if (counts == NULL) return -1;
    if (!PyList_CheckExact(counts) || PyList_GET_SIZE(counts) <= lo) {
        Py_DECREF(counts);
        PyErr_SetString(PyExc_TypeError, "itl.counts is not a list with a count per bucket");
        return -1;
    }
    Py_ssize_t before = PyLong_AsSsize_t(PyList_GET_ITEM(counts, lo));
    PyObject *count = before == -1 && PyErr_Occurred() ? NULL : PyLong_FromSsize_t(before + 1);
    if (count == NULL) {
        Py_DECREF(counts);
        return -1;
    }
    PyList_SetItem(counts, lo, count); /* steals count */
    Py_DECREF(counts);
    PyObject *total = PyObject_GetAttr(self->itl, s_total);
    if (total == NULL) return -1;
    double sum = PyFloat_AsDouble(total);
    Py_DECREF(total);
    if (sum == -1.0 && PyErr_Occurred()) return -1;
    PyObject *new_total = PyFloat_FromDouble(sum + gap);
    if (new_total == NULL) return -1;
    int rc = PyObject_SetAttr(self->itl, s_total, new_total);
    Py_DECREF(new_total);
    return rc;
}

/* 1: relayed; 0: not this object's to relay (nothing was done); -1: an exception is set. */
static int relay_fast(Relay *self, PyObject *data) {
    Py_ssize_t size;
    Py_ssize_t start = one_event_chunk(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), &size);
    if (start < 0) return 0;
    PyObject *closing = PyObject_CallMethodNoArgs(self->transport, s_is_closing);
    if (closing == NULL) return -1;
    int is_closing = PyObject_IsTrue(closing);
    Py_DECREF(closing);
    if (is_closing) return is_closing < 0 ? -1 : 0;
    PyObject *buffered_obj = PyObject_CallMethodNoArgs(self->transport, s_get_write_buffer_size);
    if (buffered_obj == NULL) return -1;
    Py_ssize_t buffered = PyLong_AsSsize_t(buffered_obj);
    Py_DECREF(buffered_obj);
    if (buffered == -1 && PyErr_Occurred()) return -1;
    /* The same low-water test as the Python relay: a client that lags gets its bytes through the backlog. */
    if (buffered + size > self->write_low) return 0;

    double now = monotonic_now();
    PyObject *now_obj = PyFloat_FromDouble(now);
    if (now_obj == NULL) return -1;
    int rc = PyObject_SetAttr(self->call, s_last_upstream, now_obj);
    Py_DECREF(now_obj);
    if (rc < 0) return -1;
    if (self->has_last_event && observe_gap(self, now - self->last_event) < 0) return -1;
    self->last_event = now;
    self->has_last_event = 1;
    PyObject *written = PyObject_CallMethodOneArg(self->transport, s_write, data);
    if (written == NULL) return -1;
    Py_DECREF(written);
    self->relayed++;
    if (buffered > 0) {
        /* Read before this write, as in the Python relay; a client that keeps up leaves it at 0. */
        PyObject *peak_obj = PyObject_GetAttr(self->router, s_stream_buffer_peak);
        if (peak_obj == NULL) return -1;
        Py_ssize_t peak = PyLong_AsSsize_t(peak_obj);
        Py_DECREF(peak_obj);
        if (peak == -1 && PyErr_Occurred()) return -1;
        if (buffered > peak) {
            PyObject *value = PyLong_FromSsize_t(buffered);
            if (value == NULL) return -1;
            rc = PyObject_SetAttr(self->router, s_stream_buffer_peak, value);
            Py_DECREF(value);
            if (rc < 0) return -1;
        }
    }
    return 1;
}

static int store_last_event(Relay *self) {
    if (!self->has_last_event) return PyObject_SetAttr(self->events, s_last_event, Py_None);
    PyObject *value = PyFloat_FromDouble(self->last_event);
    if (value == NULL) return -1;
    int rc = PyObject_SetAttr(self->events, s_last_event, value);
    Py_DECREF(value);
    return rc;
}

static int load_last_event(Relay *self) {
    PyObject *value = PyObject_GetAttr(self->events, s_last_event);
    if (value == NULL) return -1;
    if (value == Py_None) {
        self->has_last_event = 0;
    } else {
        double t = PyFloat_AsDouble(value);
        if (t == -1.0 && PyErr_Occurred()) {
            Py_DECREF(value);
            return -1;
        }
        self->last_event = t;
        self->has_last_event = 1;
    }
    Py_DECREF(value);
    return 0;
}

/* Give the bytes to the Python protocol, with the framer's state as this object left it, and take the
 * state back afterwards together with the Python relay's word on whether the fast path may go on. */
static PyObject *hand_over(Relay *self, PyObject *data) {
    PyObject *connection = self->connection;
    if (connection == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the relay was detached from its connection");
        return NULL;
    }
    if (self->events != NULL && store_last_event(self) < 0) return NULL;
    Py_INCREF(connection);
    PyObject *result = PyObject_CallMethodOneArg(connection, s_data_received, data);
    Py_DECREF(connection);
    if (result == NULL) return NULL;
    Py_DECREF(result);
    if (self->owner == NULL) {
        /* Detached while Python handled the bytes: nothing is this object's any more. */
        self->enabled = 0;
        Py_RETURN_NONE;
    }
    if (load_last_event(self) < 0) return NULL;
    PyObject *ok = PyObject_CallMethodNoArgs(self->owner, s_fast_ok);
    if (ok == NULL) return NULL;
    int enabled = PyObject_IsTrue(ok);
    Py_DECREF(ok);
    if (enabled < 0) return NULL;
    self->enabled = enabled;
    Py_RETURN_NONE;
}

static PyObject *Relay_data_received(Relay *self, PyObject *data) {
    if (self->enabled && self->owner != NULL && PyBytes_CheckExact(data)) {
        int done = relay_fast(self, data);
        if (done < 0) return NULL;
        if (done) Py_RETURN_NONE;
    }
    return hand_over(self, data);
}

static PyObject *delegate(Relay *self, PyObject *name, PyObject *arg) {
    if (self->connection == NULL) Py_RETURN_NONE;
    PyObject *connection = self->connection;
    Py_INCREF(connection);
    PyObject *result = arg == NULL ? PyObject_CallMethodNoArgs(connection, name)
                                   : PyObject_CallMethodOneArg(connection, name, arg);
    Py_DECREF(connection);
    return result;
}

static PyObject *Relay_connection_lost(Relay *self, PyObject *exc) {
    self->enabled = 0;
    return delegate(self, s_connection_lost, exc);
}

static PyObject *Relay_eof_received(Relay *self, PyObject *Py_UNUSED(ignored)) {
    return delegate(self, s_eof_received, NULL);
}

static PyObject *Relay_pause_writing(Relay *self, PyObject *Py_UNUSED(ignored)) {
    return delegate(self, s_pause_writing, NULL);
}

static PyObject *Relay_resume_writing(Relay *self, PyObject *Py_UNUSED(ignored)) {
    return delegate(self, s_resume_writing, NULL);
}

static PyObject *Relay_connection_made(Relay *self, PyObject *Py_UNUSED(transport)) {
    /* Installed with set_protocol on a connected transport; a fresh connection never reaches this object. */
    Py_RETURN_NONE;
}

/* Everything but the connection: what a stream's relay refers to. */
static void drop_stream(Relay *self) {
    Py_CLEAR(self->owner);
    Py_CLEAR(self->call);
    Py_CLEAR(self->events);
    Py_CLEAR(self->transport);
    Py_CLEAR(self->itl);
    Py_CLEAR(self->router);
    self->enabled = 0;
}

static int Relay_clear(Relay *self) {
    drop_stream(self);
    Py_CLEAR(self->connection);
    return 0;
}

static PyObject *Relay_detach(Relay *self, PyObject *Py_UNUSED(ignored)) {
    /* Drops the references to the stream (the relay, its owner and the transports refer to one another)
     * and keeps the connection: a transport that still has this object as its protocol reports its loss
     * through it, and the pool must hear of it. The framer gets the last event's time first, so bytes the
     * Python protocol reads next are timed from it. */
    if (self->events != NULL && self->owner != NULL && store_last_event(self) < 0) return NULL;
    drop_stream(self);
    Py_RETURN_NONE;
}

static int Relay_traverse(Relay *self, visitproc visit, void *arg) {
    Py_VISIT(self->connection);
    Py_VISIT(self->owner);
    Py_VISIT(self->call);
    Py_VISIT(self->events);
    Py_VISIT(self->transport);
    Py_VISIT(self->itl);
    Py_VISIT(self->router);
    return 0;
}

static void Relay_dealloc(Relay *self) {
    PyObject_GC_UnTrack(self);
    Relay_clear(self);
    PyMem_Free(self->bounds);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Relay_init(Relay *self, PyObject *args, PyObject *kwds) {
    static char *keywords[] = {"connection", "owner", "call", "events", "transport", "itl", "router", "write_low", NULL};
    PyObject *connection, *owner, *call, *events, *transport, *itl, *router;
    Py_ssize_t write_low;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "$OOOOOOOn", keywords, &connection, &owner, &call, &events,
                                     &transport, &itl, &router, &write_low))
        return -1;
    PyObject *bounds = PyObject_GetAttr(itl, s_bounds);
    if (bounds == NULL) return -1;
    PyObject *seq = PySequence_Fast(bounds, "itl.bounds must be a sequence of floats");
    Py_DECREF(bounds);
    if (seq == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    double *copy = PyMem_Malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    if (copy == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        copy[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
        if (copy[i] == -1.0 && PyErr_Occurred()) {
            PyMem_Free(copy);
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    Relay_clear(self);
    PyMem_Free(self->bounds);
    self->bounds = copy;
    self->nbounds = n;
    self->connection = Py_NewRef(connection);
    self->owner = Py_NewRef(owner);
    self->call = Py_NewRef(call);
    self->events = Py_NewRef(events);
    self->transport = Py_NewRef(transport);
    self->itl = Py_NewRef(itl);
    self->router = Py_NewRef(router);
    self->write_low = write_low;
    self->relayed = 0;
    self->enabled = 0;
    return load_last_event(self);
}

static PyMethodDef Relay_methods[] = {
    {"data_received", (PyCFunction)Relay_data_received, METH_O, "Relay one event here, or hand the bytes over."},
    {"connection_made", (PyCFunction)Relay_connection_made, METH_O, "Unused: installed on a live transport."},
    {"connection_lost", (PyCFunction)Relay_connection_lost, METH_O, "Passed to the connection's protocol."},
    {"eof_received", (PyCFunction)Relay_eof_received, METH_NOARGS, "Passed to the connection's protocol."},
    {"pause_writing", (PyCFunction)Relay_pause_writing, METH_NOARGS, "Passed to the connection's protocol."},
    {"resume_writing", (PyCFunction)Relay_resume_writing, METH_NOARGS, "Passed to the connection's protocol."},
    {"detach", (PyCFunction)Relay_detach, METH_NOARGS, "Hand the last event's time back and drop every reference."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Relay_members[] = {
    {"enabled", Py_T_BOOL, offsetof(Relay, enabled), 0, "Whether a read may be relayed here (set by the Python relay)."},
    {"relayed", Py_T_ULONGLONG, offsetof(Relay, relayed), Py_READONLY, "Events relayed without Python."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject RelayType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "builders.router._fastrelay.Relay",
    .tp_doc = "The replica transport's protocol while a stream is relayed: one-event chunks in C, the rest to Python.",
    .tp_basicsize = sizeof(Relay),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Relay_init,
    .tp_dealloc = (destructor)Relay_dealloc,
    .tp_traverse = (traverseproc)Relay_traverse,
    .tp_clear = (inquiry)Relay_clear,
    .tp_methods = Relay_methods,
    .tp_members = Relay_members,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "builders.router._fastrelay",
    .m_doc = "The router's per-event relay in C (see builders/router/_fastrelay.c).",
    .m_size = -1,
};

#define INTERN(var, text)                                  \
    do {                                                   \
        if ((var = PyUnicode_InternFromString(text)) == NULL) \
            return NULL;                                   \
    } while (0)

PyMODINIT_FUNC PyInit__fastrelay(void) {
    INTERN(s_data_received, "data_received");
    INTERN(s_connection_lost, "connection_lost");
    INTERN(s_eof_received, "eof_received");
    INTERN(s_pause_writing, "pause_writing");
    INTERN(s_resume_writing, "resume_writing");
    INTERN(s_fast_ok, "_fast_ok");
    INTERN(s_last_event, "last_event");
    INTERN(s_last_upstream, "last_upstream");
    INTERN(s_counts, "counts");
    INTERN(s_total, "total");
    INTERN(s_bounds, "bounds");
    INTERN(s_stream_buffer_peak, "stream_buffer_peak");
    INTERN(s_write, "write");
    INTERN(s_is_closing, "is_closing");
    INTERN(s_get_write_buffer_size, "get_write_buffer_size");
    if (PyType_Ready(&RelayType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&RelayType);
    if (PyModule_AddObject(m, "Relay", (PyObject *)&RelayType) < 0) {
        Py_DECREF(&RelayType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
