/* strataio.storage._filebatch: one call reads a range of (or stats) each of many files.
 *
 * read_ranges(paths, offsets, outs, nowait) -> list of (err, size, ino, ctime_ns)
 * stat_files(paths) -> list of (err, size, ino, ctime_ns)
 *
 * Per file, with the GIL released for the whole batch: open, POSIX_FADV_RANDOM, one
 * preadv2 (RWF_NOWAIT with nowait), fstat, close; a call a signal interrupts is made again,
 * as Python's os functions do, and the advice's failure is no failure of the read. err is 0 on success; ENOENT for a
 * missing file; EINPROGRESS when nowait and the bytes are not in the page cache (their
 * pages are asked for with POSIX_FADV_WILLNEED first); any other errno on failure. Bytes
 * past the end of a file read as zeros. The pure-Python loop of PosixBackend is the same
 * contract, and the fallback where this module is not built.
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

typedef struct {
    const char *path;
    char *buf;
    Py_ssize_t len;
    long long offset;
    int err;
    long long size;
    unsigned long long ino;
    long long ctime_ns;
} item_t;

/* A system call retried while a signal interrupts it (as Python's os functions do). */
#define RETRY(expr) ({ long _r; do { _r = (long)(expr); } while (_r < 0 && errno == EINTR); _r; })

static void read_one(item_t *it, int nowait) {
    int fd = (int)RETRY(open(it->path, O_RDONLY | O_CLOEXEC));
    if (fd < 0) {
        it->err = errno;
        return;
    }
    struct stat st;
    ssize_t got = 0;
    /* one call reads the whole range: readahead has nothing to add, and its markers on
       cached pages make RWF_NOWAIT refuse reads that need no I/O */
    posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    struct iovec v = {it->buf, (size_t)it->len};
    if (nowait) {
        got = RETRY(preadv2(fd, &v, 1, it->offset, RWF_NOWAIT));
        /* a file system that takes no RWF_NOWAIT read (tmpfs, FUSE) is read plainly */
        if (got < 0 && errno == EOPNOTSUPP)
            got = RETRY(preadv(fd, &v, 1, it->offset));
        if (got < 0) {
            if (errno != EAGAIN) {
                it->err = errno;
                close(fd);
                return;
            }
            got = 0;
        }
        if (RETRY(fstat(fd, &st)) != 0) {
            it->err = errno;
            close(fd);
            return;
        }
        if (got < it->len && it->offset + got < (long long)st.st_size) {
            posix_fadvise(fd, it->offset + got, it->len - got, POSIX_FADV_WILLNEED);
            it->err = EINPROGRESS;
            close(fd);
            return;
        }
    } else {
        got = RETRY(preadv(fd, &v, 1, it->offset));
        if (got < 0) {
            it->err = errno;
            close(fd);
            return;
        }
    }
    /* a short read: read on to the end of the file, zeros past it */
    while (got < it->len) {
        ssize_t n = pread(fd, it->buf + got, (size_t)(it->len - got), it->offset + got);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            it->err = errno;
            close(fd);
            return;
        }
        if (n == 0) {
            memset(it->buf + got, 0, (size_t)(it->len - got));
            break;
        }
        got += n;
    }
    if (RETRY(fstat(fd, &st)) != 0) {
        it->err = errno;
        close(fd);
        return;
    }
    close(fd);
    it->err = 0;
    it->size = (long long)st.st_size;
    it->ino = (unsigned long long)st.st_ino;
    it->ctime_ns = (long long)st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec;
}

static PyObject *read_ranges(PyObject *self, PyObject *args) {
    PyObject *paths, *offsets, *outs;
    int nowait;
    if (!PyArg_ParseTuple(args, "O!O!O!p", &PyList_Type, &paths, &PyList_Type, &offsets,
                          &PyList_Type, &outs, &nowait))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(paths);
    if (PyList_GET_SIZE(offsets) != n || PyList_GET_SIZE(outs) != n) {
        PyErr_SetString(PyExc_ValueError, "paths, offsets and outs differ in length");
        return NULL;
    }
    item_t *items = PyMem_Calloc(n ? n : 1, sizeof(item_t));
    Py_buffer *views = PyMem_Calloc(n ? n : 1, sizeof(Py_buffer));
    PyObject *result = NULL;
    Py_ssize_t held = 0;
    if (items == NULL || views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *p = PyList_GET_ITEM(paths, i);
        if (!PyBytes_Check(p)) {
            PyErr_SetString(PyExc_TypeError, "paths must be bytes");
            goto done;
        }
        items[i].path = PyBytes_AS_STRING(p);
        items[i].offset = PyLong_AsLongLong(PyList_GET_ITEM(offsets, i));
        if (items[i].offset == -1 && PyErr_Occurred())
            goto done;
        if (PyObject_GetBuffer(PyList_GET_ITEM(outs, i), &views[i],
                               PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0)
            goto done;
        held = i + 1;
        items[i].buf = views[i].buf;
        items[i].len = views[i].len;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        read_one(&items[i], nowait);
    Py_END_ALLOW_THREADS
    result = PyList_New(n);
    if (result == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = Py_BuildValue("(iLKL)", items[i].err, items[i].size, items[i].ino,
                                    items[i].ctime_ns);
        if (t == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, t);
    }
done:
    for (Py_ssize_t i = 0; i < held; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(items);
    PyMem_Free(views);
    return result;
}

static PyObject *stat_files(PyObject *self, PyObject *args) {
    PyObject *paths;
    if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &paths))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(paths);
    item_t *items = PyMem_Calloc(n ? n : 1, sizeof(item_t));
    if (items == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *p = PyList_GET_ITEM(paths, i);
        if (!PyBytes_Check(p)) {
            PyMem_Free(items);
            PyErr_SetString(PyExc_TypeError, "paths must be bytes");
            return NULL;
        }
        items[i].path = PyBytes_AS_STRING(p);
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        struct stat st;
        if (RETRY(stat(items[i].path, &st)) != 0) {
            items[i].err = errno;
            continue;
        }
        items[i].size = (long long)st.st_size;
        items[i].ino = (unsigned long long)st.st_ino;
        items[i].ctime_ns = (long long)st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec;
    }
    Py_END_ALLOW_THREADS
    PyObject *result = PyList_New(n);
    for (Py_ssize_t i = 0; result != NULL && i < n; i++) {
        PyObject *t = Py_BuildValue("(iLKL)", items[i].err, items[i].size, items[i].ino,
                                    items[i].ctime_ns);
        if (t == NULL)
            Py_CLEAR(result);
        else
            PyList_SET_ITEM(result, i, t);
    }
    PyMem_Free(items);
    return result;
}

static PyMethodDef methods[] = {
    {"read_ranges", read_ranges, METH_VARARGS,
     "read_ranges(paths, offsets, outs, nowait) -> [(err, size, ino, ctime_ns)]: per file, "
     "open, one read of len(out) bytes from offset into out, fstat, close (GIL released)."},
    {"stat_files", stat_files, METH_VARARGS,
     "stat_files(paths) -> [(err, size, ino, ctime_ns)]: one stat per file (GIL released)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_filebatch",
    "One call reads a range of each of many files (see PosixBackend.readinto_ranges_versioned).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__filebatch(void) { return PyModule_Create(&module); }
