/* strataio.storage._mapcopy: copy a range of a file's cached pages through a mapping.
 *
 * read_cached(fd, offset, out) -> bytes copied, or -1 where the caller must read instead
 * copy_guarded(src_address, out) -> 0, or -1 where reading the source raised SIGBUS
 *
 * read_cached maps the file bytes [offset, offset + len(out)) (up to the end of the file),
 * and copies them into out only if every page is in the page cache already (cachestat, or
 * mincore on kernels before 6.5): a mapping that faults pages in from the disk reads ahead
 * less than read() does. It returns
 * the bytes copied (fewer than len(out) only at the end of the file; the rest of out is left
 * as it was), or -1 when it did nothing useful: not a regular file, a mapping refused, a
 * page not cached, or the file cut shorter during the copy. The GIL is released throughout.
 *
 * A mapped page past a file's end raises SIGBUS when touched, which would kill the process
 * where read() would return short. The copy therefore runs under a SIGBUS handler that
 * returns from it instead: installed while at least one guarded copy runs, it jumps out of
 * the copy of the thread that touched the page, and hands any other SIGBUS to the handler
 * it replaced.
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* this thread's guarded copy in progress (NULL: none); static TLS, so that the handler's
   read of it never allocates */
static __thread sigjmp_buf *volatile guard_jump __attribute__((tls_model("initial-exec")));
static pthread_mutex_t guard_lock = PTHREAD_MUTEX_INITIALIZER;
static int guard_users;
static struct sigaction guard_saved;

static void on_sigbus(int sig, siginfo_t *info, void *context) {
    sigjmp_buf *jump = guard_jump;
    if (jump != NULL)
        siglongjmp(*jump, 1);
    /* not a guarded copy: as if this handler were not there */
    if ((guard_saved.sa_flags & SA_SIGINFO) && guard_saved.sa_sigaction != NULL) {
        guard_saved.sa_sigaction(sig, info, context);
        return;
    }
    if (!(guard_saved.sa_flags & SA_SIGINFO) && guard_saved.sa_handler != SIG_DFL &&
        guard_saved.sa_handler != SIG_IGN) {
        guard_saved.sa_handler(sig);
        return;
    }
    /* the default action: restored, the faulting access runs again and takes it */
    sigaction(SIGBUS, &guard_saved, NULL);
}

static int guard_enter(void) {
    int ok = 0;
    pthread_mutex_lock(&guard_lock);
    if (guard_users == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGBUS, &sa, &guard_saved) != 0)
            ok = -1;
    }
    if (ok == 0)
        guard_users++;
    pthread_mutex_unlock(&guard_lock);
    return ok;
}

static void guard_leave(void) {
    pthread_mutex_lock(&guard_lock);
    if (--guard_users == 0)
        sigaction(SIGBUS, &guard_saved, NULL);
    pthread_mutex_unlock(&guard_lock);
}

/* memcpy that returns -1 instead of dying where a source page raises SIGBUS */
static int guarded_memcpy(char *dst, const char *src, size_t n) {
    sigjmp_buf jump;
    if (guard_enter() != 0)
        return -1;
    int rc = 0;
    if (sigsetjmp(jump, 1) == 0) {
        guard_jump = &jump;
        memcpy(dst, src, n);
    } else {
        rc = -1;
    }
    guard_jump = NULL;
    guard_leave();
    return rc;
}

/* cachestat(2), Linux 6.5 and later; the same number on every architecture that has it */
#ifndef __NR_cachestat
#define __NR_cachestat 451
#endif
struct cache_range {
    unsigned long long off, len;
};
struct cache_counts {
    unsigned long long nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};
static int no_cachestat; /* the kernel lacks it: mincore instead */

/* whether every page of the file bytes [base, base + span), mapped at map, is cached */
static int all_cached(int fd, char *map, off_t base, size_t span, size_t pages) {
    if (!no_cachestat) {
        struct cache_range range = {(unsigned long long)base, span};
        struct cache_counts counts;
        if (syscall(__NR_cachestat, fd, &range, &counts, 0) == 0)
            return counts.nr_cache >= pages;
        if (errno != ENOSYS)
            return 0;
        no_cachestat = 1;
    }
    /* a page cache walk per page: about 60 us per MiB, against 1 us for cachestat */
    unsigned char few[512];
    unsigned char *resident = pages <= sizeof few ? few : malloc(pages);
    int cached = resident != NULL && mincore(map, span, resident) == 0;
    for (size_t i = 0; cached && i < pages; i++)
        cached = resident[i] & 1;
    if (resident != few)
        free(resident);
    return cached;
}

static long long map_and_copy(int fd, long long offset, char *dst, size_t len) {
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || offset < 0)
        return -1;
    if (offset >= (long long)st.st_size || len == 0)
        return 0;
    size_t n = (size_t)(st.st_size - offset) < len ? (size_t)(st.st_size - offset) : len;
    long page = sysconf(_SC_PAGESIZE);
    off_t base = (off_t)(offset & ~(long long)(page - 1));
    size_t lead = (size_t)(offset - base), span = n + lead;
    char *map = mmap(NULL, span, PROT_READ, MAP_SHARED, fd, base);
    if (map == MAP_FAILED)
        return -1;
    long long got = -1;
    /* the copy's faults map cached pages many at a time (fault-around, large folios):
       measured, that beats filling the page tables first (MAP_POPULATE) */
    if (all_cached(fd, map, base, span, (span + (size_t)page - 1) / (size_t)page) &&
        guarded_memcpy(dst, map + lead, n) == 0)
        got = (long long)n;
    munmap(map, span);
    return got;
}

static PyObject *read_cached(PyObject *self, PyObject *args) {
    int fd;
    long long offset;
    Py_buffer out;
    if (!PyArg_ParseTuple(args, "iLw*", &fd, &offset, &out))
        return NULL;
    long long got;
    Py_BEGIN_ALLOW_THREADS
    got = map_and_copy(fd, offset, out.buf, (size_t)out.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out);
    return PyLong_FromLongLong(got);
}

static PyObject *copy_guarded(PyObject *self, PyObject *args) {
    unsigned long long src;
    Py_buffer out;
    if (!PyArg_ParseTuple(args, "Kw*", &src, &out))
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = guarded_memcpy(out.buf, (const char *)(uintptr_t)src, (size_t)out.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out);
    return PyLong_FromLong(rc);
}

static PyMethodDef methods[] = {
    {"read_cached", read_cached, METH_VARARGS,
     "read_cached(fd, offset, out) -> bytes copied from the file's cached pages through a "
     "mapping, or -1 where the caller must read instead (GIL released)."},
    {"copy_guarded", copy_guarded, METH_VARARGS,
     "copy_guarded(src_address, out) -> 0, or -1 where a source page raised SIGBUS."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_mapcopy",
    "Copies of a file's cached pages through a mapping (see strataio.storage.mapped).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__mapcopy(void) { return PyModule_Create(&module); }
