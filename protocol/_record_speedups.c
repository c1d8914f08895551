/* The records section of a RecordBatch v2, decoded in C (optional accelerator).
 *
 * protocol/records.py holds the pure-Python decoders these mirror: `_decode_records` (every
 * record as a Record: offset, timestamp, key, value, headers, attributes) and `_keys_values`
 * (only each record's (key, value), for loading internal topics: headers and timestamps are
 * checked but not built). Both raise protocol.errors.ProtocolError on exactly the inputs where
 * the Python decoders fail; no read ever leaves the buffer.
 *
 * Record layout: length varint, attributes int8, timestampDelta varlong, offsetDelta varint,
 * key and value (varint length, negative = null), header count varint, headers (key: varint
 * length + UTF-8, value: varint length, negative = null). Varints are zigzag-encoded; a varint
 * keeps the low 32 bits of at most 5 bytes, a varlong the low 64 bits of at most 10 (Java's
 * readVarint / readVarlong).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* set once by configure() */
static PyObject *ProtocolError = NULL;
static PyTypeObject *RecordType = NULL;

typedef struct {
    const unsigned char *buf;
    Py_ssize_t len;
    Py_ssize_t pos;
} Reader;

static int
fail(const char *what)
{
    PyErr_SetString(ProtocolError, what);
    return -1;
}

#define TRUNCATED "record batch ends inside a record"

/* A zigzag varint of at most `max_bytes` bytes, keeping the low `bits` bits before decoding. */
static int
read_zigzag(Reader *r, int max_bytes, int bits, int64_t *out)
{
    uint64_t raw = 0;
    for (int i = 0;; i++) {
        if (r->pos >= r->len)
            return fail(TRUNCATED);
        unsigned int b = r->buf[r->pos++];
        if (i < 10) /* bits past 64 are dropped, as the Python mask does */
            raw |= (uint64_t)(b & 0x7F) << (7 * i);
        if (b < 0x80)
            break;
        if (i + 1 >= max_bytes)
            return fail(bits == 32 ? "varint is longer than 5 bytes" : "varlong is longer than 10 bytes");
    }
    if (bits == 32)
        raw &= 0xFFFFFFFFu;
    *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
    return 0;
}

static inline int
read_varint(Reader *r, int64_t *out)
{
    if (r->pos < r->len && r->buf[r->pos] < 0x80) { /* the common one-byte case */
        unsigned int b = r->buf[r->pos++];
        *out = (int64_t)(b >> 1) ^ -(int64_t)(b & 1);
        return 0;
    }
    return read_zigzag(r, 5, 32, out);
}

/* A key, value or header value: None for a negative length; NULL with ProtocolError set. */
static PyObject *
read_nullable_bytes(Reader *r, Py_ssize_t record_end, const char *overrun)
{
    int64_t size;
    if (read_varint(r, &size) < 0)
        return NULL;
    if (size < 0)
        Py_RETURN_NONE;
    if (r->pos + size > record_end) {
        fail(overrun);
        return NULL;
    }
    PyObject *v = PyBytes_FromStringAndSize((const char *)r->buf + r->pos, (Py_ssize_t)size);
    r->pos += (Py_ssize_t)size;
    return v;
}

/* The headers of a record: a list of (str, bytes | None) when `build`, else only checked
 * (Py_None is returned). The key is decoded with surrogateescape, which never fails. */
static PyObject *
read_headers(Reader *r, Py_ssize_t record_end, int build)
{
    int64_t n;
    if (read_varint(r, &n) < 0)
        return NULL;
    if (n < 0 || n > record_end - r->pos)
        return fail("invalid record header count"), NULL;
    PyObject *headers = build ? PyList_New((Py_ssize_t)n) : Py_NewRef(Py_None);
    if (headers == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < (Py_ssize_t)n; i++) {
        int64_t size;
        if (read_varint(r, &size) < 0)
            goto error;
        if (size < 0 || r->pos + size > record_end) {
            fail("invalid record header key length");
            goto error;
        }
        PyObject *key = NULL;
        if (build) {
            key = PyUnicode_DecodeUTF8((const char *)r->buf + r->pos, (Py_ssize_t)size, "surrogateescape");
            if (key == NULL)
                goto error;
        }
        r->pos += (Py_ssize_t)size;
        PyObject *value = read_nullable_bytes(r, record_end, "record header value overruns its record");
        if (value == NULL) {
            Py_XDECREF(key);
            goto error;
        }
        if (build) {
            PyObject *pair = PyTuple_Pack(2, key, value);
            Py_DECREF(key);
            Py_DECREF(value);
            if (pair == NULL)
                goto error;
            PyList_SET_ITEM(headers, i, pair);
        }
        else {
            Py_DECREF(value);
        }
    }
    return headers;
error:
    Py_DECREF(headers);
    return NULL;
}

/* base + delta as a Python int (exact: Python's ints do not overflow, so neither may this) */
static PyObject *
add_int64(int64_t base, int64_t delta)
{
    int64_t sum;
    if (!__builtin_add_overflow(base, delta, &sum))
        return PyLong_FromLongLong(sum);
    PyObject *a = PyLong_FromLongLong(base), *b = PyLong_FromLongLong(delta);
    PyObject *result = (a != NULL && b != NULL) ? PyNumber_Add(a, b) : NULL;
    Py_XDECREF(a);
    Py_XDECREF(b);
    return result;
}

typedef struct {
    int full; /* Record objects, else (key, value) tuples */
    int64_t base_offset;
    int64_t base_timestamp;
    PyObject *log_append_time; /* None: CreateTime (base + delta) */
} Mode;

static PyObject *
decode_view(const Py_buffer *view, Py_ssize_t count, const Mode *mode)
{
    if (count < 0)
        return fail("invalid record count"), NULL;
    Reader rd = {(const unsigned char *)view->buf, view->len, 0};
    Reader *r = &rd;
    PyObject *records = PyList_New(0); /* not sized by `count`: the wire's claim until checked */
    if (records == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t length, timestamp_delta, offset_delta;
        if (read_varint(r, &length) < 0)
            goto error;
        Py_ssize_t record_end = r->pos + (Py_ssize_t)length;
        if (length < 1 || length > r->len - r->pos) {
            fail("record length does not fit the batch");
            goto error;
        }
        int attributes = r->buf[r->pos++];
        if (read_zigzag(r, 10, 64, &timestamp_delta) < 0 || read_varint(r, &offset_delta) < 0)
            goto error;
        PyObject *key = read_nullable_bytes(r, record_end, "record key overruns its record");
        if (key == NULL)
            goto error;
        PyObject *value = read_nullable_bytes(r, record_end, "record value overruns its record");
        if (value == NULL) {
            Py_DECREF(key);
            goto error;
        }
        PyObject *headers = read_headers(r, record_end, mode->full);
        if (headers == NULL || r->pos != record_end) {
            if (headers != NULL)
                fail("record declares more bytes than it holds");
            Py_XDECREF(headers);
            Py_DECREF(key);
            Py_DECREF(value);
            goto error;
        }
        PyObject *item;
        if (!mode->full) {
            Py_DECREF(headers);
            item = PyTuple_New(2);
            if (item == NULL) {
                Py_DECREF(key);
                Py_DECREF(value);
                goto error;
            }
            PyTuple_SET_ITEM(item, 0, key);
            PyTuple_SET_ITEM(item, 1, value);
        }
        else {
            PyObject *offset = add_int64(mode->base_offset, offset_delta);
            PyObject *timestamp = mode->log_append_time != Py_None
                ? Py_NewRef(mode->log_append_time) : add_int64(mode->base_timestamp, timestamp_delta);
            PyObject *attrs = PyLong_FromLong(attributes);
            /* a Record: tuple.__new__(Record, fields), filled in place */
            item = (offset && timestamp && attrs) ? RecordType->tp_alloc(RecordType, 6) : NULL;
            if (item == NULL) {
                Py_XDECREF(offset);
                Py_XDECREF(timestamp);
                Py_XDECREF(attrs);
                Py_DECREF(key);
                Py_DECREF(value);
                Py_DECREF(headers);
                goto error;
            }
            PyTuple_SET_ITEM(item, 0, offset);
            PyTuple_SET_ITEM(item, 1, timestamp);
            PyTuple_SET_ITEM(item, 2, key);
            PyTuple_SET_ITEM(item, 3, value);
            PyTuple_SET_ITEM(item, 4, headers);
            PyTuple_SET_ITEM(item, 5, attrs);
        }
        int appended = PyList_Append(records, item);
        Py_DECREF(item);
        if (appended < 0)
            goto error;
    }
    if (r->pos != r->len) {
        fail("bytes remain after the batch's records");
        goto error;
    }
    return records;
error:
    Py_DECREF(records);
    return NULL;
}

/* The records of `data` (any buffer), for both entry points */
static PyObject *
decode(PyObject *data, Py_ssize_t count, const Mode *mode)
{
    if (ProtocolError == NULL || RecordType == NULL)
        return PyErr_Format(PyExc_RuntimeError, "configure() was not called"), NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *result = decode_view(&view, count, mode);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *
decode_records(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *data;
    Py_ssize_t count;
    long long base_offset, base_timestamp;
    Mode mode = {1, 0, 0, NULL};
    if (!PyArg_ParseTuple(args, "OnLLO", &data, &count, &base_offset, &base_timestamp, &mode.log_append_time))
        return NULL;
    mode.base_offset = base_offset;
    mode.base_timestamp = base_timestamp;
    return decode(data, count, &mode);
}

static PyObject *
keys_values(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *data;
    Py_ssize_t count;
    Mode mode = {0, 0, 0, Py_None};
    if (!PyArg_ParseTuple(args, "On", &data, &count))
        return NULL;
    return decode(data, count, &mode);
}

static PyObject *
configure(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *error, *record;
    if (!PyArg_ParseTuple(args, "OO!", &error, &PyType_Type, &record))
        return NULL;
    if (!PyType_Check(error) || !PyType_IsSubtype((PyTypeObject *)error, (PyTypeObject *)PyExc_Exception))
        return PyErr_Format(PyExc_TypeError, "the protocol error must be an exception class"), NULL;
    if (!PyType_IsSubtype((PyTypeObject *)record, &PyTuple_Type))
        return PyErr_Format(PyExc_TypeError, "the record class must be a tuple subclass"), NULL;
    Py_XSETREF(ProtocolError, Py_NewRef(error));
    Py_XSETREF(RecordType, (PyTypeObject *)Py_NewRef(record));
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"configure", configure, METH_VARARGS, "configure(ProtocolError, Record)"},
    {"decode_records", decode_records, METH_VARARGS,
     "decode_records(data, count, base_offset, base_timestamp, log_append_time) -> list[Record]"},
    {"keys_values", keys_values, METH_VARARGS,
     "keys_values(data, count) -> list[(key, value)]"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "protocol._record_speedups",
    .m_doc = "RecordBatch v2 records decoded in C (see protocol/records.py).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__record_speedups(void)
{
    return PyModule_Create(&module_def);
}
