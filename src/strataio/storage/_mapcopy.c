/* strataio.storage._mapcopy: copy a range of a file's cached pages through a mapping.
 *
 * read_cached(fd, offset, out, stream=0) -> bytes copied, or -1 where the caller must read
 *     instead
 * gather_cached(fd, out, file, lengths, mem, stream=0) -> bytes copied, or -1 where the
 *     caller must read instead: pieces (int64 vectors) of the file into out, from one mapping
 * copy_guarded(src_address, out, stream=0) -> 0, or -1 where reading the source raised SIGBUS
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
 *
 * stream: 1 copies with non-temporal stores (x86-64; memcpy elsewhere), which write the
 * destination straight to memory instead of first reading each of its lines into the cache.
 * For a copy larger than the cache can hold that saves a third of the memory traffic (16 MiB
 * from a mapping on the 2-core machine: 22 GB/s against memcpy's 14, four processes at once
 * 24-27 GiB/s in all against 16-17); for one that fits, memcpy is faster (8 MiB: 26 against
 * 23) and leaves the bytes in the cache for whatever reads them next. The caller decides.
 * 2 streams with the 16-byte stores of SSE2, which every x86-64 processor has, where AVX2's
 * 32-byte ones would be taken (so that tests reach that path); 0 copies with memcpy.
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

#if defined(__x86_64__)
/* Non-temporal copies are ordered with later stores only by a fence (end_copies, once after
   a run of copies). Only the bytes before dst's first 16-byte boundary and after its last go
   through memcpy: a line written partly by ordinary stores and partly by non-temporal ones
   costs more than the copy (the pieces of a gather). */

/* 16-byte non-temporal stores of [dst, dst + n), dst 16-aligned, n a multiple of 16 */
static inline void stream_granules(char *dst, const char *src, size_t n) {
    size_t i = 0;
    for (; i + 64 <= n; i += 64) { /* four loads, then their four stores */
        __m128i v[4];
        for (int j = 0; j < 4; j++)
            v[j] = _mm_loadu_si128((const __m128i *)(src + i + 16 * j));
        for (int j = 0; j < 4; j++)
            _mm_stream_si128((__m128i *)(dst + i + 16 * j), v[j]);
    }
    for (; i < n; i += 16)
        _mm_stream_si128((__m128i *)(dst + i), _mm_loadu_si128((const __m128i *)(src + i)));
}

/* memcpy of the bytes before dst's first 16-byte boundary (all n where it has none); how
   many */
static inline size_t copy_to_granule(char *dst, const char *src, size_t n) {
    size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
    if (head > n)
        head = n;
    memcpy(dst, src, head);
    return head;
}

/* the end of a copy from a 16-aligned dst: whole granules streamed, the rest by memcpy */
static inline void stream_tail(char *dst, const char *src, size_t n) {
    size_t body = n & ~(size_t)15;
    stream_granules(dst, src, body);
    memcpy(dst + body, src + body, n - body);
}

/* n bytes from src to dst through SSE2's non-temporal stores (every x86-64 processor has
   them) */
static void stream_copy_sse2(char *dst, const char *src, size_t n) {
    size_t head = copy_to_granule(dst, src, n);
    stream_tail(dst + head, src + head, n - head);
}

/* the same with AVX2's 32-byte stores from dst's first 32-byte boundary, 128 bytes a step */
__attribute__((target("avx2"))) static void stream_copy_avx2(char *dst, const char *src,
                                                              size_t n) {
    size_t head = copy_to_granule(dst, src, n);
    dst += head, src += head, n -= head;
    size_t lead = ((uintptr_t)dst & 31) && n >= 16 ? 16 : 0;
    stream_granules(dst, src, lead);
    dst += lead, src += lead, n -= lead;
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(src + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(src + i + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(src + i + 64));
        __m256i d = _mm256_loadu_si256((const __m256i *)(src + i + 96));
        _mm256_stream_si256((__m256i *)(dst + i), a);
        _mm256_stream_si256((__m256i *)(dst + i + 32), b);
        _mm256_stream_si256((__m256i *)(dst + i + 64), c);
        _mm256_stream_si256((__m256i *)(dst + i + 96), d);
    }
    stream_tail(dst + i, src + i, n - i);
}
#endif

/* after a run of copy_bytes: their non-temporal stores land before any store that follows */
static void end_copies(int stream) {
#if defined(__x86_64__)
    if (stream)
        _mm_sfence();
#endif
    (void)stream;
}

static void copy_bytes(char *dst, const char *src, size_t n, int stream) {
#if defined(__x86_64__)
    if (stream) {
        if (stream == 1 && __builtin_cpu_supports("avx2"))
            stream_copy_avx2(dst, src, n);
        else
            stream_copy_sse2(dst, src, n);
        return;
    }
#endif
    (void)stream;
    memcpy(dst, src, n);
}

/* the pieces' copies (copy_bytes) from src + file[i] - base to dst + mem[i], len[i] bytes
   each; -1 instead of dying where a source page raises SIGBUS (the pieces before it copied) */
static int guarded_gather(char *dst, const char *src, long long base, const long long *file,
                          const long long *len, const long long *mem, Py_ssize_t count,
                          int stream) {
    sigjmp_buf jump;
    if (guard_enter() != 0)
        return -1;
    int rc = 0;
    if (sigsetjmp(jump, 1) == 0) {
        guard_jump = &jump;
        for (Py_ssize_t i = 0; i < count; i++)
            copy_bytes(dst + mem[i], src + (file[i] - base), (size_t)len[i], stream);
    } else {
        rc = -1;
    }
    end_copies(stream); /* (also those of a copy cut short: before the caller's own) */
    guard_jump = NULL;
    guard_leave();
    return rc;
}

/* one guarded copy of n bytes from src to dst: 0, or -1 where a source page raised SIGBUS */
static int guarded_copy(char *dst, const char *src, size_t n, int stream) {
    const long long at = 0, length = (long long)n;
    return guarded_gather(dst, src, 0, &at, &length, &at, 1, stream);
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

static long long map_and_copy(int fd, long long offset, char *dst, size_t len,
                               int stream) {
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
        guarded_copy(dst, map + lead, n, stream) == 0)
        got = (long long)n;
    munmap(map, span);
    return got;
}

/* the pieces, all within the file bytes [first, end), copied from a mapping of those bytes if
   the file reaches end and every page is cached: the bytes copied, or -1 */
static long long map_and_gather(int fd, long long first, long long end, char *dst,
                                const long long *file, const long long *len,
                                const long long *mem, Py_ssize_t count, int stream) {
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || end > (long long)st.st_size)
        return -1;
    long page = sysconf(_SC_PAGESIZE);
    off_t base = (off_t)(first & ~(long long)(page - 1));
    size_t span = (size_t)(end - base);
    char *map = mmap(NULL, span, PROT_READ, MAP_SHARED, fd, base);
    if (map == MAP_FAILED)
        return -1;
    long long got = -1;
    if (all_cached(fd, map, base, span, (span + (size_t)page - 1) / (size_t)page) &&
        guarded_gather(dst, map, (long long)base, file, len, mem, count, stream) == 0) {
        got = 0;
        for (Py_ssize_t i = 0; i < count; i++)
            got += len[i];
    }
    munmap(map, span);
    return got;
}

static PyObject *read_cached(PyObject *self, PyObject *args) {
    int fd, stream = 0;
    long long offset;
    Py_buffer out;
    if (!PyArg_ParseTuple(args, "iLw*|i", &fd, &offset, &out, &stream))
        return NULL;
    long long got;
    Py_BEGIN_ALLOW_THREADS
    got = map_and_copy(fd, offset, out.buf, (size_t)out.len, stream);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out);
    return PyLong_FromLongLong(got);
}

static PyObject *gather_cached(PyObject *self, PyObject *args) {
    int fd, stream = 0;
    Py_buffer out, fb, lb, mb;
    if (!PyArg_ParseTuple(args, "iw*y*y*y*|i", &fd, &out, &fb, &lb, &mb, &stream))
        return NULL;
    PyObject *result = NULL;
    /* (the buffers' bytes are taken as int64s: strataio.storage.mapped passes int64 arrays) */
    Py_ssize_t count = fb.len / 8;
    if (fb.len % 8 || lb.len != fb.len || mb.len != fb.len) {
        PyErr_SetString(PyExc_ValueError,
                        "gather_cached: file, lengths and mem must be int64 vectors of one length");
        goto done;
    }
    const long long *file = fb.buf, *len = lb.buf, *mem = mb.buf;
    long long first = 0, end = 0;
    for (Py_ssize_t i = 0; i < count; i++) { /* every piece inside out, none negative */
        if (file[i] < 0 || len[i] < 0 || mem[i] < 0 || len[i] > out.len - mem[i] ||
            file[i] > LLONG_MAX - len[i]) {
            PyErr_Format(PyExc_ValueError, "gather_cached: piece %zd lies outside the "
                         "buffer or the file", i);
            goto done;
        }
        if (i == 0 || file[i] < first)
            first = file[i];
        if (i == 0 || file[i] + len[i] > end)
            end = file[i] + len[i];
    }
    long long got = -1;
    Py_BEGIN_ALLOW_THREADS
    got = count == 0 ? 0 : map_and_gather(fd, first, end, out.buf, file, len, mem, count, stream);
    Py_END_ALLOW_THREADS
    result = PyLong_FromLongLong(got);
done:
    PyBuffer_Release(&out);
    PyBuffer_Release(&fb);
    PyBuffer_Release(&lb);
    PyBuffer_Release(&mb);
    return result;
}

static PyObject *copy_guarded(PyObject *self, PyObject *args) {
    unsigned long long src;
    int stream = 0;
    Py_buffer out;
    if (!PyArg_ParseTuple(args, "Kw*|i", &src, &out, &stream))
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = guarded_copy(out.buf, (const char *)(uintptr_t)src, (size_t)out.len, stream);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out);
    return PyLong_FromLong(rc);
}

static PyMethodDef methods[] = {
    {"read_cached", read_cached, METH_VARARGS,
     "read_cached(fd, offset, out, stream=0) -> bytes copied from the file's cached pages "
     "through a mapping, or -1 where the caller must read instead (GIL released); stream: "
     "1 with non-temporal stores, 2 with SSE2's only."},
    {"gather_cached", gather_cached, METH_VARARGS,
     "gather_cached(fd, out, file, lengths, mem, stream=0) -> bytes copied: each piece "
     "(int64 vectors: file offset, length, position in out) from a mapping of the file "
     "bytes the pieces span, or -1 where the caller must read instead (the file ends "
     "before the span does, a page is not cached, a page raised SIGBUS; GIL released)."},
    {"copy_guarded", copy_guarded, METH_VARARGS,
     "copy_guarded(src_address, out, stream=0) -> 0, or -1 where a source page raised "
     "SIGBUS; stream: 1 with non-temporal stores, 2 with SSE2's only."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_mapcopy",
    "Copies of a file's cached pages through a mapping (see strataio.storage.mapped).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__mapcopy(void) { return PyModule_Create(&module); }
