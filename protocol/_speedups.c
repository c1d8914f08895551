/* Schema-driven decoder for the generated message classes (optional accelerator).
 *
 * protocol/accel.py compiles the StructSpecs of one (message, version) into Program objects,
 * one per struct: the class to build, and one op per class field in class order. An op either
 * reads a value from the wire (int8..float64, bool, uuid, string, bytes, records, struct,
 * array of any of these) or supplies the value of a field the version does not carry: a
 * constant, a fresh list, or a fresh default instance (a struct op whose program only holds
 * defaults, so it reads nothing). Flexible versions end each struct with a tag buffer: known
 * tags decode into their field, unknown ones are skipped.
 *
 * Objects are built like the generated Python decoder builds them: a bare instance of the
 * slotted class whose slots are filled directly (the generated __init__ does nothing else).
 * Malformed input raises protocol.errors.ProtocolError on exactly the inputs where the
 * pure-Python decoder fails; no read ever leaves the buffer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#ifndef Py_T_OBJECT_EX
#define Py_T_OBJECT_EX T_OBJECT_EX
#endif
#ifndef Py_READONLY
#define Py_READONLY READONLY
#endif

enum {
    K_INT8 = 0,
    K_INT16,
    K_UINT16,
    K_INT32,
    K_UINT32,
    K_INT64,
    K_FLOAT64,
    K_BOOL,
    K_UUID,
    K_STRING,
    K_BYTES,
    K_RECORDS,
    K_STRUCT,
    K_ARRAY,
    K_CONST, /* value absent from the wire: a shared immutable default */
    K_NEWLIST, /* ... a fresh empty list */
    K_COUNT
};

static const char *const KIND_NAMES[K_COUNT] = {
    "int8", "int16", "uint16", "int32", "uint32", "int64", "float64", "bool", "uuid",
    "string", "bytes", "records", "struct", "array", "const", "newlist",
};

#define F_NULLABLE 1 /* a negative length (or struct marker) means None */
#define F_COMPACT 2  /* lengths are unsigned varints holding length + 1 */

/* set once by configure() */
static PyObject *ProtocolError = NULL;
static PyObject *ZeroUUID = NULL;
static PyTypeObject *UUIDType = NULL;
static PyObject *UUIDUnknown = NULL; /* uuid.SafeUUID.unknown */
static Py_ssize_t uuid_int_offset = -1; /* slots of uuid.UUID, or -1: call the class */
static Py_ssize_t uuid_safe_offset = -1;

/* an encoder's tagged field is left out when None / empty / its default */
enum { SKIP_NONE = 1, SKIP_FALSY, SKIP_EQUAL };

/* One field of a struct at one version, for the decoder (Program) or the encoder (Encoder). */
typedef struct {
    Py_ssize_t offset; /* of the field's slot in the instance */
    int kind;
    int flags;
    int elem;          /* element kind of arrays */
    int skip;          /* an encoder's tagged fields: the SKIP_ rule */
    long long tag;     /* tagged fields only */
    PyObject *arg;     /* Program/Encoder (struct, struct elements) or a decoder's constant (owned) */
    PyObject *name;    /* for error messages: the decoder's field label, the encoder's attribute (owned) */
    PyObject *dflt;    /* an encoder's SKIP_EQUAL fields: the default (owned) */
} Op;

/* A Program (decoder) or an Encoder of one struct at one version: the same layout, two types. */
typedef struct {
    PyObject_HEAD
    PyTypeObject *cls; /* owned */
    PyObject *name;    /* struct name (owned) */
    int flex;          /* a tag buffer ends the struct */
    Py_ssize_t nops;
    Py_ssize_t ntagged;
    Op *ops; /* nops field ops, then ntagged tagged-field ops (an Encoder's sorted by tag) */
} StructCodec;

typedef StructCodec Program;
typedef StructCodec Encoder;

static PyTypeObject ProgramType;
static PyTypeObject EncoderType;

typedef struct {
    const unsigned char *buf;
    Py_ssize_t len;
    Py_ssize_t pos;
    PyObject *mv; /* memoryview of the input: records are slices of it */
    int mv_flat;  /* mv is a 1-D memoryview of bytes: slice it the quick way */
} Reader;

/* ---- errors ------------------------------------------------------------------------------ */

static PyObject *
corrupt(const Op *op, const char *what)
{
    if (op != NULL && op->name != NULL)
        PyErr_Format(ProtocolError, "%U: %s", op->name, what);
    else
        PyErr_SetString(ProtocolError, what);
    return NULL;
}

/* whether n more bytes are there (n may be any 64-bit length read from the wire) */
static inline int
has(const Reader *r, long long n)
{
    return r->pos <= r->len && n <= (long long)(r->len - r->pos);
}

/* ---- primitives -------------------------------------------------------------------------- */

static inline uint16_t
be16(const unsigned char *p)
{
    return (uint16_t)((p[0] << 8) | p[1]);
}

static inline uint32_t
be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline uint64_t
be64(const unsigned char *p)
{
    return ((uint64_t)be32(p) << 32) | be32(p + 4);
}

/* Kafka's 32-bit unsigned varint: at most 5 bytes (the value itself may use up to 35 bits,
 * as in the Python decoder; callers compare it with the buffer size). */
static int
read_uvarint(Reader *r, const Op *op, long long *out)
{
    unsigned long long result = 0;
    int shift = 0;
    for (;;) {
        if (r->pos >= r->len || r->pos < 0) {
            corrupt(op, "truncated varint");
            return -1;
        }
        unsigned int b = r->buf[r->pos++];
        result |= (unsigned long long)(b & 0x7F) << shift;
        if (b < 0x80) {
            *out = (long long)result;
            return 0;
        }
        shift += 7;
        if (shift > 28) {
            corrupt(op, "unsigned varint is longer than 5 bytes");
            return -1;
        }
    }
}

/* A length prefix; -1 (or any negative) means null. `wide` selects int32 over int16 in
 * non-flexible versions (strings use int16). */
static int
read_length(Reader *r, const Op *op, int flags, int wide, long long *out)
{
    if (flags & F_COMPACT) {
        long long v;
        if (read_uvarint(r, op, &v) < 0)
            return -1;
        *out = v - 1;
        return 0;
    }
    Py_ssize_t size = wide ? 4 : 2;
    if (!has(r, size)) {
        corrupt(op, "truncated length");
        return -1;
    }
    *out = wide ? (int32_t)be32(r->buf + r->pos) : (int16_t)be16(r->buf + r->pos);
    r->pos += size;
    return 0;
}

static PyObject *
make_uuid(const unsigned char *p)
{
    static const unsigned char zero[16] = {0};
    if (memcmp(p, zero, 16) == 0)
        return Py_NewRef(ZeroUUID);
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *value = PyLong_FromUnsignedNativeBytes(
        p, 16, Py_ASNATIVEBYTES_BIG_ENDIAN | Py_ASNATIVEBYTES_UNSIGNED_BUFFER);
#else
    PyObject *value = _PyLong_FromByteArray(p, 16, 0, 0);
#endif
    if (value == NULL)
        return NULL;
    if (uuid_int_offset < 0) {
        PyObject *kw = Py_BuildValue("{sN}", "int", value);
        if (kw == NULL)
            return NULL;
        PyObject *empty = PyTuple_New(0);
        PyObject *u = empty ? PyObject_Call((PyObject *)UUIDType, empty, kw) : NULL;
        Py_XDECREF(empty);
        Py_DECREF(kw);
        return u;
    }
    PyObject *u = UUIDType->tp_alloc(UUIDType, 0);
    if (u == NULL) {
        Py_DECREF(value);
        return NULL;
    }
    *(PyObject **)((char *)u + uuid_int_offset) = value;
    *(PyObject **)((char *)u + uuid_safe_offset) = Py_NewRef(UUIDUnknown);
    return u;
}

/* A fixed-size value at the reader's position (bounds already checked). */
static inline PyObject *
read_fixed(int kind, const unsigned char *p)
{
    switch (kind) {
    case K_INT8:
        return PyLong_FromLong((int8_t)p[0]);
    case K_INT16:
        return PyLong_FromLong((int16_t)be16(p));
    case K_UINT16:
        return PyLong_FromLong(be16(p));
    case K_INT32:
        return PyLong_FromLong((int32_t)be32(p));
    case K_UINT32:
        return PyLong_FromUnsignedLong(be32(p));
    case K_INT64:
        return PyLong_FromLongLong((int64_t)be64(p));
    case K_FLOAT64: {
        double d = PyFloat_Unpack8((const char *)p, 0);
        if (d == -1.0 && PyErr_Occurred())
            return NULL;
        return PyFloat_FromDouble(d);
    }
    case K_BOOL:
        return Py_NewRef(p[0] ? Py_True : Py_False);
    case K_UUID:
        return make_uuid(p);
    }
    PyErr_SetString(PyExc_SystemError, "not a fixed-size kind");
    return NULL;
}

static const Py_ssize_t FIXED_SIZE[K_COUNT] = {1, 2, 2, 4, 4, 8, 8, 1, 16, 0, 0, 0, 0, 0, 0, 0};

/* mv[start:start + n], as the Python decoder's records values. For a flat memoryview this
 * is what memoryview slicing does (a new view registered on the same managed buffer, then
 * narrowed), without building index and slice objects. */
static PyObject *
slice_input(const Reader *r, Py_ssize_t start, Py_ssize_t n)
{
    if (r->mv_flat && start + n <= ((PyMemoryViewObject *)r->mv)->view.len) {
        PyObject *v = PyMemoryView_FromObject(r->mv);
        if (v == NULL)
            return NULL;
        Py_buffer *view = &((PyMemoryViewObject *)v)->view;
        view->buf = (char *)view->buf + start;
        view->len = n;
        view->shape[0] = n;
        return v;
    }
    return PySequence_GetSlice(r->mv, start, start + n);
}

/* string, bytes or records */
static PyObject *
read_blob(Reader *r, const Op *op, int kind, int flags)
{
    long long n;
    if (read_length(r, op, flags, kind != K_STRING, &n) < 0)
        return NULL;
    if (n < 0) {
        if (flags & F_NULLABLE)
            Py_RETURN_NONE;
        return corrupt(op, "null value for a non-nullable field");
    }
    if (!has(r, n))
        return corrupt(op, "value overruns the buffer");
    const char *p = (const char *)r->buf + r->pos;
    PyObject *v;
    if (kind == K_STRING) {
        v = PyUnicode_DecodeUTF8(p, (Py_ssize_t)n, NULL);
        if (v == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            return corrupt(op, "invalid UTF-8 in a string");
        }
    }
    else if (kind == K_BYTES) {
        v = PyBytes_FromStringAndSize(p, (Py_ssize_t)n);
    }
    else {
        v = slice_input(r, r->pos, (Py_ssize_t)n);
    }
    if (v != NULL)
        r->pos += (Py_ssize_t)n;
    return v;
}

static PyObject *decode_struct(Program *p, Reader *r);

static PyObject *
read_array(Reader *r, const Op *op)
{
    long long n;
    if (read_length(r, op, op->flags, 1, &n) < 0)
        return NULL;
    if (n < 0) {
        if (op->flags & F_NULLABLE)
            Py_RETURN_NONE;
        return corrupt(op, "null array for a non-nullable field");
    }
    if (!has(r, n))
        return corrupt(op, "array is longer than the buffer");
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (list == NULL || n == 0)
        return list;
    int elem = op->elem;
    Py_ssize_t i;
    if (elem <= K_UUID) {
        Py_ssize_t size = FIXED_SIZE[elem];
        if (!has(r, n * size)) {
            Py_DECREF(list);
            return corrupt(op, "array overruns the buffer");
        }
        for (i = 0; i < n; i++) {
            PyObject *v = read_fixed(elem, r->buf + r->pos);
            if (v == NULL)
                goto fail;
            PyList_SET_ITEM(list, i, v);
            r->pos += size;
        }
        return list;
    }
    for (i = 0; i < n; i++) {
        PyObject *v;
        if (elem == K_STRUCT)
            v = decode_struct((Program *)op->arg, r);
        else
            v = read_blob(r, op, elem, op->flags);
        if (v == NULL)
            goto fail;
        PyList_SET_ITEM(list, i, v);
    }
    return list;
fail:
    Py_DECREF(list);
    return NULL;
}

static PyObject *
read_op(Reader *r, const Op *op)
{
    int kind = op->kind;
    if (kind <= K_UUID) {
        Py_ssize_t size = FIXED_SIZE[kind];
        if (!has(r, size))
            return corrupt(op, "truncated value");
        PyObject *v = read_fixed(kind, r->buf + r->pos);
        if (v != NULL)
            r->pos += size;
        return v;
    }
    switch (kind) {
    case K_STRING:
    case K_BYTES:
    case K_RECORDS:
        return read_blob(r, op, kind, op->flags);
    case K_ARRAY:
        return read_array(r, op);
    case K_STRUCT:
        if (op->flags & F_NULLABLE) {
            if (!has(r, 1))
                return corrupt(op, "truncated struct marker");
            int8_t marker = (int8_t)r->buf[r->pos++];
            if (marker < 0)
                Py_RETURN_NONE;
        }
        return decode_struct((Program *)op->arg, r);
    case K_CONST:
        return Py_NewRef(op->arg);
    case K_NEWLIST:
        return PyList_New(0);
    }
    PyErr_SetString(PyExc_SystemError, "bad op kind");
    return NULL;
}

#define SLOT(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))

static PyObject *
decode_struct(Program *p, Reader *r)
{
    PyObject *obj = p->cls->tp_alloc(p->cls, 0);
    if (obj == NULL)
        return NULL;
    const Op *op = p->ops;
    const Op *end = op + p->nops;
    for (; op < end; op++) {
        PyObject *v = read_op(r, op);
        if (v == NULL)
            goto fail;
        Py_XSETREF(SLOT(obj, op->offset), v);
    }
    if (p->flex) {
        long long count, k;
        if (read_uvarint(r, NULL, &count) < 0)
            goto fail;
        for (k = 0; k < count; k++) {
            long long tag, size;
            if (read_uvarint(r, NULL, &tag) < 0 || read_uvarint(r, NULL, &size) < 0)
                goto fail;
            if (!has(r, size)) {
                corrupt(NULL, "tagged field overruns the buffer");
                goto fail;
            }
            Py_ssize_t stop = r->pos + (Py_ssize_t)size;
            const Op *t = p->ops + p->nops;
            const Op *tend = t + p->ntagged;
            for (; t < tend; t++) {
                if (t->tag == tag)
                    break;
            }
            if (t < tend) {
                PyObject *v = read_op(r, t);
                if (v == NULL)
                    goto fail;
                if (r->pos != stop) {
                    Py_DECREF(v);
                    corrupt(t, "tagged field size mismatch");
                    goto fail;
                }
                Py_XSETREF(SLOT(obj, t->offset), v);
            }
            r->pos = stop;
        }
    }
    return obj;
fail:
    Py_DECREF(obj);
    return NULL;
}

/* ---- Program and Encoder objects --------------------------------------------------------- */

static void
codec_dealloc(StructCodec *self)
{
    Py_ssize_t i;
    if (self->ops != NULL) {
        for (i = 0; i < self->nops + self->ntagged; i++) {
            Py_XDECREF(self->ops[i].arg);
            Py_XDECREF(self->ops[i].name);
            Py_XDECREF(self->ops[i].dflt);
        }
        PyMem_Free(self->ops);
    }
    Py_XDECREF(self->cls);
    Py_XDECREF(self->name);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Offset of the slot `name` of `cls`, checked to be an object slot inside the instance. */
static Py_ssize_t
slot_offset(PyTypeObject *cls, PyObject *name)
{
    PyObject *descr = PyObject_GetAttr((PyObject *)cls, name);
    if (descr == NULL)
        return -1;
    Py_ssize_t offset = -1;
    if (!Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyErr_Format(PyExc_TypeError, "%s.%U is not a slot", cls->tp_name, name);
    }
    else {
        PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
        PyTypeObject *owner = PyDescr_TYPE(descr);
        if (m->type != Py_T_OBJECT_EX || (m->flags & Py_READONLY) || !PyType_IsSubtype(cls, owner)
            || m->offset < (Py_ssize_t)sizeof(PyObject)
            || m->offset + (Py_ssize_t)sizeof(PyObject *) > cls->tp_basicsize) {
            PyErr_Format(PyExc_TypeError, "%s.%U is not a writable object slot", cls->tp_name, name);
        }
        else {
            offset = m->offset;
        }
    }
    Py_DECREF(descr);
    return offset;
}

static int
valid_kind(int kind, int allow_default)
{
    return kind >= 0 && kind < K_COUNT && (allow_default || kind <= K_ARRAY);
}

/* Fill `op` from its spec; `slots` are the class' slot names. A Program's op is (slot index, kind,
 * flags, arg, field label), an Encoder's (slot index, kind, flags, arg, skip, default): arg is the
 * Program/Encoder of a struct or of struct elements, the element kind of other arrays, or a
 * decoder's constant (the const and newlist kinds supply a field the version does not carry: an
 * encoder has no op for it); skip and default matter for an Encoder's tagged fields only. */
static int
parse_op(StructCodec *self, PyObject *spec, PyObject *slots, Op *op)
{
    PyTypeObject *type = Py_TYPE(self);
    int decoder = type == &ProgramType;
    Py_ssize_t index;
    int kind, flags, skip = 0;
    PyObject *arg, *name = NULL, *dflt = NULL;
    if (!PyTuple_Check(spec)) {
        PyErr_SetString(PyExc_TypeError, "an op is a tuple");
        return -1;
    }
    if (decoder ? !PyArg_ParseTuple(spec, "niiOU", &index, &kind, &flags, &arg, &name)
                : !PyArg_ParseTuple(spec, "niiOiO", &index, &kind, &flags, &arg, &skip, &dflt))
        return -1;
    if (index < 0 || index >= PyTuple_GET_SIZE(slots)) {
        PyErr_SetString(PyExc_ValueError, "slot index out of range");
        return -1;
    }
    if (!valid_kind(kind, decoder)) {
        PyErr_Format(PyExc_ValueError, "bad kind %d", kind);
        return -1;
    }
    op->elem = -1;
    if (kind == K_STRUCT && !PyObject_TypeCheck(arg, type)) {
        PyErr_Format(PyExc_TypeError, "a struct op needs another %s", decoder ? "Program" : "Encoder");
        return -1;
    }
    if (kind == K_ARRAY) {
        if (PyObject_TypeCheck(arg, type)) {
            op->elem = K_STRUCT;
        }
        else {
            long elem = PyLong_AsLong(arg);
            if (elem == -1 && PyErr_Occurred())
                return -1;
            if (!valid_kind((int)elem, 0) || elem == K_STRUCT || elem == K_ARRAY) {
                PyErr_Format(PyExc_ValueError, "bad array element kind %ld", elem);
                return -1;
            }
            op->elem = (int)elem;
        }
    }
    PyObject *attr = PyTuple_GET_ITEM(slots, index);
    op->name = Py_NewRef(decoder ? name : attr);
    op->offset = slot_offset(self->cls, attr);
    if (op->offset < 0)
        return -1;
    op->kind = kind;
    op->flags = flags;
    op->skip = skip;
    op->arg = Py_NewRef(arg);
    op->dflt = Py_XNewRef(dflt);
    return 0;
}

/* Program(cls, name, slots, ops, tagged, flex) and Encoder(the same): `ops` describe the class'
 * fields (a Program's: all of them, in class order; an Encoder's: those on the wire, in wire
 * order), `tagged` holds (tag, op) pairs. */
static PyObject *
codec_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"cls", "name", "slots", "ops", "tagged", "flex", NULL};
    PyObject *cls, *name, *slots, *ops, *tagged;
    int flex;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!UO!O!O!p", kwlist, &PyType_Type, &cls, &name,
                                     &PyTuple_Type, &slots, &PyTuple_Type, &ops, &PyTuple_Type,
                                     &tagged, &flex))
        return NULL;
    int decoder = type == &ProgramType;
    Py_ssize_t i, nops = PyTuple_GET_SIZE(ops), ntagged = PyTuple_GET_SIZE(tagged);
    if (!decoder && ntagged > 64) {
        PyErr_SetString(PyExc_ValueError, "more than 64 tagged fields"); /* encode_tagged's stack */
        return NULL;
    }
    for (i = 0; i < PyTuple_GET_SIZE(slots); i++) {
        if (!PyUnicode_Check(PyTuple_GET_ITEM(slots, i))) {
            PyErr_SetString(PyExc_TypeError, "slot names are strings");
            return NULL;
        }
    }
    if (((PyTypeObject *)cls)->tp_alloc == NULL) {
        PyErr_SetString(PyExc_TypeError, "class cannot be allocated");
        return NULL;
    }
    StructCodec *self = (StructCodec *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->cls = (PyTypeObject *)Py_NewRef(cls);
    self->name = Py_NewRef(name);
    self->flex = flex;
    self->ops = PyMem_Calloc((size_t)(nops + ntagged) + 1, sizeof(Op));
    if (self->ops == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    /* counted before they are filled: codec_dealloc releases what a failed parse_op leaves */
    self->nops = nops;
    self->ntagged = ntagged;
    for (i = 0; i < nops; i++) {
        if (parse_op(self, PyTuple_GET_ITEM(ops, i), slots, &self->ops[i]) < 0)
            goto fail;
    }
    for (i = 0; i < ntagged; i++) {
        PyObject *item = PyTuple_GET_ITEM(tagged, i);
        PyObject *spec;
        Op *op = &self->ops[nops + i];
        if (!PyTuple_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "a tagged op is a (tag, op) tuple");
            goto fail;
        }
        if (!PyArg_ParseTuple(item, "LO", &op->tag, &spec) || parse_op(self, spec, slots, op) < 0)
            goto fail;
        if (op->tag < 0 || op->kind > K_ARRAY || (!decoder && (op->skip < SKIP_NONE || op->skip > SKIP_EQUAL))) {
            PyErr_SetString(PyExc_ValueError,
                            "a tagged op needs a tag >= 0, to read from the wire and (encoding) a skip rule");
            goto fail;
        }
    }
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static PyObject *
codec_repr(StructCodec *self)
{
    return PyUnicode_FromFormat("<%s %U: %zd ops, %zd tagged>", Py_IS_TYPE(self, &ProgramType) ? "Program" : "Encoder",
                                self->name, self->nops, self->ntagged);
}

/* decode(data, mv, pos) -> (object, end position), as the generated Python decoders. */
static PyObject *
program_decode(Program *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "decode(data, mv, pos) takes 3 arguments");
        return NULL;
    }
    if (ProtocolError == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "protocol._speedups.configure() was not called");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[2]);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    if (pos < 0) {
        PyErr_SetString(PyExc_ValueError, "negative position");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Reader r = {(const unsigned char *)view.buf, view.len, pos, args[1], 0};
    if (PyMemoryView_Check(r.mv)) {
        const Py_buffer *v = PyMemoryView_GET_BUFFER(r.mv);
        r.mv_flat = v->ndim == 1 && v->itemsize == 1 && v->shape != NULL && v->strides != NULL
                    && v->strides[0] == 1 && v->suboffsets == NULL;
    }
    /* Decoding creates no reference cycles, so collections while it runs would only traverse
     * the young message again and again (a large one spans several generation-0 rounds and
     * gets promoted); one collection afterwards, if the count asks for it, does the job. */
    int gc_was_enabled = PyGC_Disable();
    PyObject *obj = decode_struct(self, &r);
    if (gc_was_enabled)
        PyGC_Enable();
    PyBuffer_Release(&view);
    if (obj == NULL)
        return NULL;
    PyObject *end = PyLong_FromSsize_t(r.pos);
    if (end == NULL) {
        Py_DECREF(obj);
        return NULL;
    }
    PyObject *result = PyTuple_New(2);
    if (result == NULL) {
        Py_DECREF(obj);
        Py_DECREF(end);
        return NULL;
    }
    PyTuple_SET_ITEM(result, 0, obj);
    PyTuple_SET_ITEM(result, 1, end);
    return result;
}

static PyMethodDef program_methods[] = {
    {"decode", (PyCFunction)(void (*)(void))program_decode, METH_FASTCALL,
     "decode(data, mv, pos) -> (object, end position)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ProgramType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "protocol._speedups.Program",
    .tp_basicsize = sizeof(Program),
    .tp_dealloc = (destructor)codec_dealloc,
    .tp_repr = (reprfunc)codec_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Program(cls, name, slots, ops, tagged, flex): decoder of one struct at one version.",
    .tp_methods = program_methods,
    .tp_new = codec_new,
};

/* ---- encoder ----------------------------------------------------------------------------- */
/* The other direction, for the same generated classes (protocol/accel.py builds Encoders): one
 * Encoder per struct at one version, holding the fields the version carries in wire order and
 * its tagged fields by tag, each with the test that leaves a tagged field out (its default).
 * encode() writes the whole message into one buffer and returns the list of parts the generated
 * Python encoder's writer receives joined: one bytes object, except that records values that are
 * not small buffers (file slices, large batches) are passed through as parts of their own.
 * Given a header, the first part starts with the int32 size of the frame and that header. */

#define COPY_RECORDS_MAX 16384 /* records buffers up to this size are copied, larger ones passed through */

typedef struct {
    char *buf;
    Py_ssize_t len;
    Py_ssize_t cap;
    int heap;          /* buf was allocated (else it is the caller's stack buffer) */
    PyObject *parts;   /* flushed bytes and passed-through values, or NULL */
    Py_ssize_t moved;  /* total length of the parts */
    int copy_all;      /* a tagged field's writer: everything is copied */
} Writer;

static int
w_grow(Writer *w, Py_ssize_t need)
{
    Py_ssize_t cap = w->cap;
    while (cap - w->len < need) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *buf;
    if (w->heap) {
        buf = PyMem_Realloc(w->buf, (size_t)cap);
    }
    else {
        buf = PyMem_Malloc((size_t)cap);
        if (buf != NULL)
            memcpy(buf, w->buf, (size_t)w->len);
    }
    if (buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    w->buf = buf;
    w->cap = cap;
    w->heap = 1;
    return 0;
}

static inline char *
w_reserve(Writer *w, Py_ssize_t n)
{
    if (w->cap - w->len < n && w_grow(w, n) < 0)
        return NULL;
    char *p = w->buf + w->len;
    w->len += n;
    return p;
}

static inline int
w_bytes(Writer *w, const void *data, Py_ssize_t n)
{
    char *p = w_reserve(w, n);
    if (p == NULL)
        return -1;
    memcpy(p, data, (size_t)n);
    return 0;
}

static inline int
w_uvarint(Writer *w, unsigned long long v)
{
    char *p = w_reserve(w, 10);
    if (p == NULL)
        return -1;
    Py_ssize_t n = 0;
    while (v >= 0x80) {
        p[n++] = (char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    p[n++] = (char)v;
    w->len -= 10 - n;
    return 0;
}

static inline void
put_be(char *p, unsigned long long v, int size)
{
    for (int i = size - 1; i >= 0; i--) {
        p[i] = (char)(v & 0xFF);
        v >>= 8;
    }
}

/* v as a big-endian integer of `size` bytes */
static inline int
w_be(Writer *w, unsigned long long v, int size)
{
    char *p = w_reserve(w, size);
    if (p == NULL)
        return -1;
    put_be(p, v, size);
    return 0;
}

/* The bytes written so far become a part of their own; `value` (of length n) follows them. */
static int
w_pass(Writer *w, PyObject *value, Py_ssize_t n)
{
    if (w->parts == NULL && (w->parts = PyList_New(0)) == NULL)
        return -1;
    if (w->len) {
        PyObject *chunk = PyBytes_FromStringAndSize(w->buf, w->len);
        if (chunk == NULL)
            return -1;
        int rc = PyList_Append(w->parts, chunk);
        Py_DECREF(chunk);
        if (rc < 0)
            return -1;
        w->moved += w->len;
        w->len = 0;
    }
    if (PyList_Append(w->parts, value) < 0)
        return -1;
    w->moved += n;
    return 0;
}

static void
w_free(Writer *w)
{
    if (w->heap)
        PyMem_Free(w->buf);
    Py_CLEAR(w->parts);
}

static int
enc_error(const Op *op, PyObject *exc, const char *what)
{
    if (op != NULL && op->name != NULL)
        PyErr_Format(exc, "%U: %s", op->name, what);
    else
        PyErr_SetString(exc, what);
    return -1;
}

static int
write_int(Writer *w, const Op *op, int kind, PyObject *v)
{
    static const long long lo[] = {-128, -32768, 0, -2147483648LL, 0};
    static const long long hi[] = {127, 32767, 65535, 2147483647LL, 4294967295LL};
    static const int size[] = {1, 2, 2, 4, 4};
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (kind == K_INT64) {
        if (overflow)
            return enc_error(op, PyExc_OverflowError, "int64 out of range");
        return w_be(w, (unsigned long long)x, 8);
    }
    if (overflow || x < lo[kind] || x > hi[kind])
        return enc_error(op, PyExc_OverflowError, "integer out of range for its type");
    return w_be(w, (unsigned long long)x, size[kind]);
}

static int
write_uuid(Writer *w, const Op *op, PyObject *v)
{
    char *p = w_reserve(w, 16);
    if (p == NULL)
        return -1;
    if (Py_IS_TYPE(v, UUIDType) && uuid_int_offset >= 0) {
        PyObject *i = SLOT(v, uuid_int_offset);
        if (i == NULL || !PyLong_Check(i))
            return enc_error(op, PyExc_TypeError, "a UUID without its int");
#if PY_VERSION_HEX >= 0x030D0000
        Py_ssize_t n = PyLong_AsNativeBytes(i, p, 16, Py_ASNATIVEBYTES_BIG_ENDIAN | Py_ASNATIVEBYTES_UNSIGNED_BUFFER
                                                          | Py_ASNATIVEBYTES_REJECT_NEGATIVE);
        if (n < 0)
            return -1;
        if (n > 16)
            return enc_error(op, PyExc_OverflowError, "UUID int out of range");
#else
        if (_PyLong_AsByteArray((PyLongObject *)i, (unsigned char *)p, 16, 0, 0) < 0)
            return -1;
#endif
        return 0;
    }
    /* anything with a .bytes attribute, as the generated encoder takes it (struct's 16s pads) */
    PyObject *raw = PyObject_GetAttrString(v, "bytes");
    if (raw == NULL)
        return -1;
    Py_buffer view;
    if (PyObject_GetBuffer(raw, &view, PyBUF_SIMPLE) < 0) {
        Py_DECREF(raw);
        return -1;
    }
    memset(p, 0, 16);
    memcpy(p, view.buf, (size_t)(view.len < 16 ? view.len : 16));
    PyBuffer_Release(&view);
    Py_DECREF(raw);
    return 0;
}

static int
write_fixed(Writer *w, const Op *op, int kind, PyObject *v)
{
    switch (kind) {
    case K_INT8:
    case K_INT16:
    case K_UINT16:
    case K_INT32:
    case K_UINT32:
        return write_int(w, op, kind, v);
    case K_INT64:
        return write_int(w, op, kind, v);
    case K_FLOAT64: {
        double d = PyFloat_AsDouble(v);
        if (d == -1.0 && PyErr_Occurred())
            return -1;
        char *p = w_reserve(w, 8);
        if (p == NULL)
            return -1;
        return PyFloat_Pack8(d, p, 0);
    }
    case K_BOOL: {
        int t = PyObject_IsTrue(v);
        if (t < 0)
            return -1;
        char c = (char)t;
        return w_bytes(w, &c, 1);
    }
    case K_UUID:
        return write_uuid(w, op, v);
    }
    PyErr_SetString(PyExc_SystemError, "not a fixed-size kind");
    return -1;
}

/* A length prefix (or null when n < 0): compact varint of n + 1, else int16 (strings) or int32. */
static int
write_length(Writer *w, const Op *op, int flags, int wide, long long n)
{
    if (flags & F_COMPACT)
        return w_uvarint(w, (unsigned long long)(n + 1));
    if (wide) {
        if (n > 2147483647LL)
            return enc_error(op, PyExc_OverflowError, "length out of range");
        return w_be(w, (unsigned long long)n, 4);
    }
    if (n > 32767)
        return enc_error(op, PyExc_OverflowError, "string longer than 32767 bytes");
    return w_be(w, (unsigned long long)n, 2);
}

/* string, bytes or records; None is written as null, as the generated encoder does */
static int
write_blob(Writer *w, const Op *op, int kind, int flags, PyObject *v)
{
    if (v == Py_None)
        return write_length(w, op, flags, kind != K_STRING, -1);
    if (kind == K_STRING) {
        if (!PyUnicode_Check(v))
            return enc_error(op, PyExc_TypeError, "a string field needs a str");
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(v, &n);
        if (s == NULL)
            return -1;
        if (write_length(w, op, flags, 0, n) < 0)
            return -1;
        return w_bytes(w, s, n);
    }
    if (PyBytes_CheckExact(v)) {
        Py_ssize_t n = PyBytes_GET_SIZE(v);
        if (write_length(w, op, flags, 1, n) < 0)
            return -1;
        if (kind == K_RECORDS && n > COPY_RECORDS_MAX && !w->copy_all)
            return w_pass(w, v, n);
        return w_bytes(w, PyBytes_AS_STRING(v), n);
    }
    if (PyObject_CheckBuffer(v)) {
        Py_buffer view;
        if (PyObject_GetBuffer(v, &view, PyBUF_SIMPLE) < 0)
            return -1;
        int rc = write_length(w, op, flags, 1, view.len);
        if (rc == 0) {
            if (kind == K_RECORDS && view.len > COPY_RECORDS_MAX && !w->copy_all)
                rc = w_pass(w, v, view.len);
            else
                rc = w_bytes(w, view.buf, view.len);
        }
        PyBuffer_Release(&view);
        return rc;
    }
    /* no buffer: a records value read only when it is sent (a file slice) */
    Py_ssize_t n = PyObject_Length(v);
    if (n < 0)
        return -1;
    if (kind != K_RECORDS || w->copy_all)
        return enc_error(op, PyExc_TypeError, "a bytes field needs a bytes-like value");
    if (write_length(w, op, flags, 1, n) < 0)
        return -1;
    return w_pass(w, v, n);
}

static int encode_struct(Encoder *e, PyObject *obj, Writer *w);

static int
write_array(Writer *w, const Op *op, PyObject *v)
{
    if (v == Py_None)
        return write_length(w, op, op->flags, 1, -1);
    PyObject *seq = PySequence_Fast(v, "an array field needs a sequence");
    if (seq == NULL)
        return -1;
    Py_ssize_t i, n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int rc = write_length(w, op, op->flags, 1, n);
    int elem = op->elem;
    for (i = 0; i < n && rc == 0; i++) {
        if (elem == K_STRUCT)
            rc = encode_struct((Encoder *)op->arg, items[i], w);
        else if (elem <= K_UUID)
            rc = write_fixed(w, op, elem, items[i]);
        else
            rc = write_blob(w, op, elem, op->flags, items[i]);
    }
    Py_DECREF(seq);
    return rc;
}

static int
write_op(Writer *w, const Op *op, PyObject *v)
{
    int kind = op->kind;
    if (kind <= K_UUID)
        return write_fixed(w, op, kind, v);
    switch (kind) {
    case K_STRING:
    case K_BYTES:
    case K_RECORDS:
        return write_blob(w, op, kind, op->flags, v);
    case K_ARRAY:
        return write_array(w, op, v);
    case K_STRUCT:
        if (op->flags & F_NULLABLE) {
            char marker = v == Py_None ? (char)-1 : 1;
            if (w_bytes(w, &marker, 1) < 0)
                return -1;
            if (v == Py_None)
                return 0;
        }
        return encode_struct((Encoder *)op->arg, v, w);
    }
    PyErr_SetString(PyExc_SystemError, "bad encoder op kind");
    return -1;
}

/* the field's value: the slot when obj is of the encoder's class, else the attribute (new ref) */
static inline PyObject *
field_value(Encoder *e, PyObject *obj, const Op *op)
{
    if (Py_IS_TYPE(obj, e->cls)) {
        PyObject *v = SLOT(obj, op->offset);
        if (v == NULL) {
            PyErr_Format(PyExc_AttributeError, "'%s' object has no attribute '%U'", e->cls->tp_name, op->name);
            return NULL;
        }
        return Py_NewRef(v);
    }
    return PyObject_GetAttr(obj, op->name);
}

static int
tagged_present(const Op *op, PyObject *v)
{
    switch (op->skip) {
    case SKIP_NONE:
        return v != Py_None;
    case SKIP_FALSY:
        return PyObject_IsTrue(v);
    default:
        return PyObject_RichCompareBool(v, op->dflt, Py_NE);
    }
}

static int
encode_tagged(Encoder *e, PyObject *obj, Writer *w)
{
    const Op *t = e->ops + e->nops;
    Py_ssize_t i, count = 0, n = e->ntagged;
    PyObject *values[64]; /* a struct has far fewer tagged fields: accel.py checks */
    for (i = 0; i < n; i++) {
        values[i] = field_value(e, obj, t + i);
        int present = values[i] == NULL ? -1 : tagged_present(t + i, values[i]);
        if (present <= 0) {
            Py_XDECREF(values[i]);
            values[i] = NULL;
            if (present < 0) {
                while (i-- > 0)
                    Py_XDECREF(values[i]);
                return -1;
            }
        }
        else {
            count++;
        }
    }
    int rc = w_uvarint(w, (unsigned long long)count);
    for (i = 0; i < n; i++) {
        if (values[i] == NULL)
            continue;
        if (rc == 0) {
            char stack[256];
            Writer sub = {stack, 0, sizeof stack, 0, NULL, 0, 1};
            rc = write_op(&sub, t + i, values[i]);
            if (rc == 0)
                rc = w_uvarint(w, (unsigned long long)t[i].tag);
            if (rc == 0)
                rc = w_uvarint(w, (unsigned long long)sub.len);
            if (rc == 0)
                rc = w_bytes(w, sub.buf, sub.len);
            w_free(&sub);
        }
        Py_DECREF(values[i]);
    }
    return rc;
}

static int
encode_struct(Encoder *e, PyObject *obj, Writer *w)
{
    const Op *op = e->ops;
    const Op *end = op + e->nops;
    for (; op < end; op++) {
        PyObject *v = field_value(e, obj, op);
        if (v == NULL)
            return -1;
        int rc = write_op(w, op, v);
        Py_DECREF(v);
        if (rc < 0)
            return -1;
    }
    if (!e->flex)
        return 0;
    if (e->ntagged == 0) {
        char zero = 0;
        return w_bytes(w, &zero, 1);
    }
    return encode_tagged(e, obj, w);
}

/* encode(obj, head=None) -> [parts]: with a head (bytes), the first part starts with the int32
 * size of everything after it and then the head (a response frame). */
static PyObject *
encoder_encode(Encoder *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "encode(obj, head=None) takes 1 or 2 arguments");
        return NULL;
    }
    PyObject *head = nargs == 2 ? args[1] : Py_None;
    if (head != Py_None && !PyBytes_Check(head)) {
        PyErr_SetString(PyExc_TypeError, "the head must be bytes");
        return NULL;
    }
    char stack[1024];
    Writer w = {stack, 0, sizeof stack, 0, NULL, 0, 0};
    if (head != Py_None) {
        char *p = w_reserve(&w, 4);
        if (p == NULL || w_bytes(&w, PyBytes_AS_STRING(head), PyBytes_GET_SIZE(head)) < 0)
            goto fail;
    }
    if (encode_struct(self, args[0], &w) < 0)
        goto fail;
    PyObject *last = PyBytes_FromStringAndSize(w.buf, w.len);
    if (last == NULL)
        goto fail;
    PyObject *parts;
    if (w.parts == NULL) {
        parts = PyList_New(1);
        if (parts == NULL) {
            Py_DECREF(last);
            goto fail;
        }
        PyList_SET_ITEM(parts, 0, last);
    }
    else {
        parts = Py_NewRef(w.parts);
        int rc = w.len ? PyList_Append(parts, last) : 0;
        Py_DECREF(last);
        if (rc < 0) {
            Py_DECREF(parts);
            goto fail;
        }
    }
    if (head != Py_None) {
        /* the first part is ours alone until it is returned: fill in the size */
        Py_ssize_t total = w.moved + w.len - 4;
        if (total > 2147483647LL) {
            Py_DECREF(parts);
            enc_error(NULL, PyExc_OverflowError, "frame larger than 2 GB");
            goto fail;
        }
        put_be(PyBytes_AS_STRING(PyList_GET_ITEM(parts, 0)), (unsigned long long)total, 4);
    }
    w_free(&w);
    return parts;
fail:
    w_free(&w);
    return NULL;
}


static PyMethodDef encoder_methods[] = {
    {"encode", (PyCFunction)(void (*)(void))encoder_encode, METH_FASTCALL,
     "encode(obj, head=None) -> list of parts; with a head, the first starts with the frame size and the head"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EncoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "protocol._speedups.Encoder",
    .tp_basicsize = sizeof(Encoder),
    .tp_dealloc = (destructor)codec_dealloc,
    .tp_repr = (reprfunc)codec_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Encoder(cls, name, slots, ops, tagged, flex): encoder of one struct at one version.",
    .tp_methods = encoder_methods,
    .tp_new = codec_new,
};

/* ---- module ------------------------------------------------------------------------------ */

static PyObject *
configure(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *error, *zero, *uuid_type, *unknown;
    if (!PyArg_ParseTuple(args, "OOO!O", &error, &zero, &PyType_Type, &uuid_type, &unknown))
        return NULL;
    if (!PyType_Check(error) || !PyType_IsSubtype((PyTypeObject *)error, (PyTypeObject *)PyExc_Exception)) {
        PyErr_SetString(PyExc_TypeError, "the protocol error must be an exception class");
        return NULL;
    }
    Py_XSETREF(ProtocolError, Py_NewRef(error));
    Py_XSETREF(ZeroUUID, Py_NewRef(zero));
    Py_XSETREF(UUIDType, (PyTypeObject *)Py_NewRef(uuid_type));
    Py_XSETREF(UUIDUnknown, Py_NewRef(unknown));
    /* build UUIDs by filling their two slots when uuid.UUID has them, else call the class */
    PyObject *int_name = PyUnicode_FromString("int");
    PyObject *safe_name = PyUnicode_FromString("is_safe");
    if (int_name == NULL || safe_name == NULL) {
        Py_XDECREF(int_name);
        Py_XDECREF(safe_name);
        return NULL;
    }
    uuid_int_offset = slot_offset(UUIDType, int_name);
    uuid_safe_offset = uuid_int_offset < 0 ? -1 : slot_offset(UUIDType, safe_name);
    if (uuid_int_offset < 0 || uuid_safe_offset < 0) {
        PyErr_Clear();
        uuid_int_offset = uuid_safe_offset = -1;
    }
    Py_DECREF(int_name);
    Py_DECREF(safe_name);
    return PyBool_FromLong(uuid_int_offset >= 0);
}

static PyMethodDef module_methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(ProtocolError, ZERO_UUID, uuid.UUID, uuid.SafeUUID.unknown) -> whether UUID slots are used"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "protocol._speedups",
    .m_doc = "Schema-driven decoder of protocol messages (see protocol/accel.py).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (PyType_Ready(&ProgramType) < 0 || PyType_Ready(&EncoderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&speedups_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Program", (PyObject *)&ProgramType) < 0
        || PyModule_AddObjectRef(m, "Encoder", (PyObject *)&EncoderType) < 0)
        goto fail;
    PyObject *kinds = PyDict_New();
    if (kinds == NULL)
        goto fail;
    for (int k = 0; k < K_COUNT; k++) {
        PyObject *v = PyLong_FromLong(k);
        if (v == NULL || PyDict_SetItemString(kinds, KIND_NAMES[k], v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(kinds);
            goto fail;
        }
        Py_DECREF(v);
    }
    if (PyModule_AddObject(m, "KINDS", kinds) < 0) {
        Py_DECREF(kinds);
        goto fail;
    }
    if (PyModule_AddIntConstant(m, "NULLABLE", F_NULLABLE) < 0 || PyModule_AddIntConstant(m, "COMPACT", F_COMPACT) < 0)
        goto fail;
    if (PyModule_AddIntConstant(m, "SKIP_NONE", SKIP_NONE) < 0 || PyModule_AddIntConstant(m, "SKIP_FALSY", SKIP_FALSY) < 0
        || PyModule_AddIntConstant(m, "SKIP_EQUAL", SKIP_EQUAL) < 0
        || PyModule_AddIntConstant(m, "COPY_RECORDS_MAX", COPY_RECORDS_MAX) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
