"""Tiers: named backends of the storage hierarchy, ordered fastest first, with health and usage.

A :class:`Tier` is a :class:`~strataio.storage.base.Backend` plus what placement needs to know
about it: its role (``memory``, ``localdisk``, ``remotedisk``, ``remotetape``), its capacity in
bytes (``None`` = unbounded), its rank in the hierarchy, whether it answers (``up``/``down`` and
the last error seen), whether its device reported no space left (:attr:`Tier.out_of_space`: no
writes for a while, reads as before), whether it is configured read-only
(:attr:`Tier.read_only`: never written, probed by reads only) or its storage refuses writes
now (:attr:`Tier.writes_refused`: read-only for a while, as configured) and how many bytes of
chunk copies it holds. A :class:`TierSet` is the
registry of every configured tier; usage is accounted from the catalog's residency rows.

A tier of the ``memory`` role is **volatile**: a cache level that dies with the process. It
holds copies as any tier does and is the fastest stage and prefetch target, but it is never a
write's home nor the only copy of a chunk, its copies are not catalogued, and evicting them
simply drops them (a persistent copy always exists). Configured without a capacity it gets
:data:`DEFAULT_MEMORY_BYTES`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import crc32c

from strataio.catalog.base import TIER_ROLES, ChunkCopy, TierRecord, TierUsage
from strataio.errors import (
    BackendError,
    ChecksumError,
    ConfigError,
    ExistsError,
    NotFoundError,
    ObjectError,
    ReadOnlyError,
    StoreMissingError,
    StrataError,
    TierDownError,
    TierFullError,
    WritesRefusedError,
)
from strataio.storage.base import Backend, BytesLike, Version

if TYPE_CHECKING:
    from strataio.tiers.commit import Commit

#: default number of simultaneous transfers per tier role (a tape has few drives)
DEFAULT_CONCURRENCY = {"memory": 8, "localdisk": 4, "remotedisk": 8, "remotetape": 2}

#: capacity of a memory tier configured without one
DEFAULT_MEMORY_BYTES = 256 << 20

#: key of the small object a health check writes, reads back and deletes
PROBE_KEY = ".strataio/health-probe"
#: the folder of the probe objects
PROBE_DIR = PROBE_KEY.rsplit("/", 1)[0]

#: the backend calls that change what a tier holds, which a read-only tier is never asked
_CHANGES = (
    *("write", "put", "put_new", "put_versioned", "put_if", "truncate"),
    *("delete", "delete_if", "delete_if_many", "remove_empty_folders"),
)


#: the CRC-32C of any bytes that end with their own CRC-32C (little-endian, as the ``crc32c``
#: codec appends it): the CRC's residue, one constant for all of them
_RESIDUE = 0x48674BC7
#: the prefix of checksums recorded as that constant before :func:`checksum` told such
#: bytes apart (the catalog upgrade marks them so); copies of the same bytes keep that kind
#: until the chunk is rewritten
LEGACY = "crc32c:"


def checksum(data: BytesLike) -> str:
    """The checksum the catalog records for a copy of ``data``: its hex CRC-32C, except for
    bytes that end with their own CRC-32C (a chunk whose last codec is ``crc32c``), whose
    CRC-32C is one constant: for those, that own CRC (which the constant just confirmed),
    so that two versions of such a chunk differ."""
    view = memoryview(data).cast("B")
    crc = crc32c.crc32c(view)
    if crc == _RESIDUE and len(view) >= 4:
        crc = int.from_bytes(view[-4:], "little")
    return f"{crc:08x}"


def checksum_like(model: str, data: BytesLike) -> str:
    """The checksum of ``data`` of the kind ``model`` (a recorded checksum) is: a plain
    CRC-32C for one recorded before :func:`checksum` told self-checked chunks apart
    (``crc32c:`` prefixed), else :func:`checksum`."""
    if model.startswith(LEGACY):
        return f"{LEGACY}{crc32c.crc32c(memoryview(data).cast('B')):08x}"
    return checksum(data)


def accepts_data(copy: Any, data: BytesLike) -> str | None:
    """The recorded checksum of ``copy`` (:class:`ChunkCopy`) that ``data`` matches, its new
    or (announced rewrite) its old one, each computed the way it was recorded; ``""`` where
    the copy records no checksum; None if the bytes are no version of the copy."""
    if not copy.checksum:
        return ""
    if checksum_like(copy.checksum, data) == copy.checksum:
        return copy.checksum
    old = copy.old_checksum
    if copy.state == "in-transit" and old and checksum_like(old, data) == old:
        return old
    return None


def os_error_in(exc: BaseException | None, errnos: Iterable[int]) -> OSError | None:
    """The first error of ``exc`` and those it was raised from (its cause, else its context)
    that is an :class:`OSError` with one of ``errnos``; None if there is none."""
    for _ in range(8):  # (a chain of wrapped errors, never a cycle)
        if exc is None:
            return None
        if isinstance(exc, OSError) and exc.errno in errnos:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def no_space_left(exc: BaseException | None) -> bool:
    """True if ``exc``, or an error it was raised from, is the device having no space left
    (ENOSPC, or EDQUOT: over a quota)."""
    return os_error_in(exc, (errno.ENOSPC, errno.EDQUOT)) is not None


#: errors of storage that refuses changes while it may still be read: a file system mounted,
#: or remounted after disk errors, read-only (EROFS); write permission denied (EACCES, EPERM)
_REFUSED = (errno.EROFS, errno.EACCES, errno.EPERM)


#: errors of one path in an object's way, not of the storage: a directory where the object
#: should be (EISDIR), a file where one of its folders should be (ENOTDIR)
_IN_THE_WAY = (errno.EISDIR, errno.ENOTDIR)


def in_the_way(exc: BaseException | None) -> OSError | None:
    """The error, ``exc`` or one it was raised from, of something in the way of one object
    (EISDIR, ENOTDIR); None if there is none."""
    return os_error_in(exc, _IN_THE_WAY)


#: errors of one object that the storage refuses for what the object is, not for what the
#: storage is: a name too long (ENAMETOOLONG; an S3 key over 1024 bytes: KeyTooLongError), a
#: size over what it takes (EFBIG; S3 EntityTooLarge), a name or argument it takes of no
#: object (EINVAL, EILSEQ; S3 InvalidArgument)
_OF_ONE_OBJECT = (errno.ENAMETOOLONG, errno.EFBIG, errno.EINVAL, errno.EILSEQ)


def refused_object(exc: BaseException | None) -> OSError | None:
    """The error, ``exc`` or one it was raised from, of the storage refusing one object for
    what it is (``_OF_ONE_OBJECT``: a name too long, a size too large); None if there is
    none."""
    return os_error_in(exc, _OF_ONE_OBJECT)


def is_backend_failure(exc: BaseException) -> bool:
    """True if ``exc`` means the backend itself failed (connection refused, timeout, I/O
    error), as opposed to a missing object, one object that cannot be used
    (:class:`ObjectError`) or a caller error."""
    if isinstance(exc, NotFoundError | FileNotFoundError | ObjectError):
        return False
    if isinstance(exc, BackendError):
        return True
    if isinstance(exc, StrataError):
        return False
    return isinstance(exc, OSError | TimeoutError | ConnectionError)


@dataclass
class _Pause:
    """A while during which a tier takes no writes: each one twice as long as the one
    before, within bounds, until :meth:`end` starts them over."""

    until: float = 0.0  # (monotonic s)
    wait: float = 0.0  # (s: the last one's length)

    @property
    def on(self) -> bool:
        # (no clock read where none was started: the look every write of a tier makes)
        return self.until != 0.0 and time.monotonic() < self.until

    def start(self, least: float, most: float) -> float:
        """Start the next while (twice the last, ``least`` s at least, ``most`` at most);
        return its length in seconds."""
        self.wait = min(max(2 * self.wait, least), most)
        self.until = time.monotonic() + self.wait
        return self.wait

    def end(self) -> None:
        self.until = self.wait = 0.0


@dataclass(eq=False)
class Tier:
    """One level of the storage hierarchy.

    ``order`` ranks tiers (0 = fastest). ``used`` counts bytes of catalogued chunk copies on
    the tier; ``capacity`` bounds it (``None`` = unbounded). ``state`` is ``"up"`` or
    ``"down"``; ``last_error`` the message of the failure that marked it down.
    ``concurrency`` bounds simultaneous transfers through :attr:`slots`. ``read_only``
    (configured ``read_only = true``): storage this process may read but not write (a
    read-only mount, an archive served to readers, credentials that only read): it takes no
    writes and is no move's or eviction's destination (:meth:`has_room` is always False), no
    ``zarr.json`` is put there, and :meth:`check` probes it by reads alone. Nothing on it is
    deleted either: a copy there that a write makes obsolete loses its row and its object
    stays (fsck reports it, and leaves it); a migration keeps the copies there, catalogued;
    an eviction from it is refused. :meth:`call` refuses a change there
    (:class:`ReadOnlyError`) without asking the backend, and never marks the tier down for it.

    Storage that refuses changes while it is read (a file system mounted, or remounted after
    disk errors, read-only: EROFS; write permission denied: EACCES, EPERM) makes the tier
    :attr:`writes_refused`, not down: where a put, write or delete fails so (through
    :meth:`call`, or a probe's put) and a read of the tier answers (the look-up that probes a
    read-only tier), the tier stays up and is, for a while, read-only as if configured so
    (:attr:`unwritable`): its chunks are read, and moved off, as before; it takes no writes,
    stages or migrations (they go to the next tier the hint allows) and no ``zarr.json``;
    nothing there is deleted (a copy there that a write makes obsolete loses its row and its
    object stays this process's to delete once the tier takes changes again, as on a tier
    that is down, or fsck's; a migration keeps the copies there, catalogued; an eviction from
    it is refused with :class:`WritesRefusedError`, a :class:`ReadOnlyError`), and
    :meth:`call` refuses a change there without asking the backend. The while is
    :attr:`RECHECK_S`, doubled each time the storage refuses again, up to
    :attr:`RECHECK_MAX_S`; then a write tries the tier again, and a probe whose put succeeds
    (:meth:`check`) ends it at once. :attr:`condition` names it; :attr:`last_error` is the
    refusal. Where the read fails too the tier is marked down, as for any other failure. For
    :meth:`call_alone` (a call about one object) only EROFS counts: permission denied there
    may be that object's alone.
    """

    name: str
    backend: Backend
    role: str
    capacity: int | None = None
    order: int = 0
    state: str = "up"
    last_error: str = ""
    concurrency: int = 4
    used: int = 0
    reserved: int = 0
    read_only: bool = False
    #: a tier the catalog registers that the configuration lacks (see :meth:`unconfigured`)
    configured: bool = True
    #: records each health change in the catalog (set by the session)
    commit: Commit | None = field(default=None, repr=False)
    slots: threading.BoundedSemaphore = field(init=False, repr=False)
    _lock: threading.Lock = field(init=False, repr=False, default_factory=threading.Lock)
    _changed: threading.Condition = field(init=False, repr=False)
    _keeps_versions: bool | None = field(init=False, repr=False, default=None)
    _probed: float = field(init=False, repr=False, default=0.0)  # (monotonic s; see recheck)
    #: when a probe last found the tier answering (monotonic s; see object_error)
    _answered: float = field(init=False, repr=False, default=-float("inf"))
    _probing: threading.Lock = field(init=False, repr=False, default_factory=threading.Lock)
    _backoff: float = field(init=False, repr=False, default=0.0)  # (s; 0: RECHECK_S)
    _full: _Pause = field(init=False, repr=False, default_factory=_Pause)  # (see mark_full)
    _refused: _Pause = field(init=False, repr=False, default_factory=_Pause)  # (mark_refused)
    #: why the catalog says the tier is down, where :attr:`last_error` is taken from it (see
    #: :meth:`TierSet.apply_states`): :meth:`record` passes it on as it is
    _catalog_why: str = field(init=False, repr=False, default="")

    #: seconds at least between two probes of a down tier made on a read's or a write's behalf
    #: (:meth:`recheck`), doubled after each probe that fails, up to :attr:`RECHECK_MAX_S`
    RECHECK_S = 2.0
    RECHECK_MAX_S = 60.0

    def __post_init__(self) -> None:
        if self.role not in TIER_ROLES:
            raise StrataError(
                f"tier {self.name!r}: role {self.role!r} is not one of {', '.join(TIER_ROLES)}"
            )
        if self.capacity is not None and self.capacity < 0:
            raise StrataError(f"tier {self.name!r}: negative capacity {self.capacity}")
        self.slots = threading.BoundedSemaphore(max(1, int(self.concurrency)))
        self._changed = threading.Condition(self._lock)

    @property
    def keeps_versions(self) -> bool:
        """Whether the backend gives its objects versions (:meth:`Backend.versions`; asked
        once per tier)."""
        keeps = self._keeps_versions
        if keeps is None:
            keeps = self._keeps_versions = self.backend.versions([]) is not None
        return keeps

    # ----------------------------------------------------------------- health
    @property
    def up(self) -> bool:
        return self.state == "up"

    @property
    def condition(self) -> str:
        """The tier's health in words: ``down`` (``down (read-only)`` for one configured
        :attr:`read_only`, ``down (not configured)`` for a tier the configuration lacks:
        :meth:`unconfigured`), or ``up`` and, where it takes no writes, why: ``up (read-only)``
        (configured :attr:`read_only`), ``up (read-only: its storage refuses writes)``
        (:attr:`writes_refused`), ``up (no space left)`` (:attr:`out_of_space`)."""
        if not self.configured:
            return "down (not configured)"
        if not self.up:
            return "down (read-only)" if self.read_only else "down"
        if self.read_only:
            return "up (read-only)"
        if self.writes_refused:
            return "up (read-only: its storage refuses writes)"
        if self.out_of_space:
            return "up (no space left)"
        return "up"

    @property
    def volatile(self) -> bool:
        """True for a memory tier: its copies die with the process (see the module doc)."""
        return self.role == "memory"

    def mark_down(self, error: BaseException | str) -> None:
        """Record a backend failure: the tier is skipped until a check finds it answering."""
        changed = self.state != "down"
        self.state = "down"
        self.last_error = str(error) or type(error).__name__
        self._probed = time.monotonic()  # (it just failed: no probe before RECHECK_S)
        if changed and self.commit is not None:
            self.commit.tier_changed(self)

    @property
    def out_of_space(self) -> bool:
        """True for a while after the tier's device reported no space left (ENOSPC,
        EDQUOT): it then takes no writes (:meth:`has_room` is False, and nothing is evicted
        to make room) and is read, and moved off, as before: a full disk holds its data
        intact. The while is :attr:`RECHECK_S`, doubled each time the device is found full
        again, up to :attr:`RECHECK_MAX_S`; then a write tries it again."""
        return self._full.on

    def mark_full(self, error: BaseException | str) -> float:
        """Record that the device has no space left (see :attr:`out_of_space`); returns the
        seconds the tier now takes no writes."""
        return self._pause(self._full, error)

    @property
    def writes_refused(self) -> bool:
        """True for a while after the tier's storage refused a change while its reads
        answered (EROFS, EACCES, EPERM: see the class doc): it is then read-only as if
        configured so (:attr:`unwritable`)."""
        return self._refused.on

    @property
    def unwritable(self) -> bool:
        """True where nothing is to be written to the tier nor deleted from it: configured
        :attr:`read_only`, or :attr:`writes_refused` now."""
        return self.read_only or self._refused.on

    def mark_refused(self, error: BaseException | str) -> float:
        """Record that the tier's storage refuses changes while it is read (see
        :attr:`writes_refused`); returns the seconds the tier now takes none. A refusal
        met while the tier is marked so already (another thread's put, started before)
        does not lengthen the while."""
        return self._pause(self._refused, error, again=False)

    def _pause(self, pause: _Pause, error: BaseException | str, *, again: bool = True) -> float:
        with self._lock:
            if again or not pause.on:
                wait = pause.start(self.RECHECK_S, self.RECHECK_MAX_S)
            else:
                wait = pause.until - time.monotonic()
        self.last_error = str(error)
        return wait

    def refused(self, exc: BaseException, *, alone: bool = False) -> WritesRefusedError | None:
        """The :class:`WritesRefusedError` that ``exc``, raised by a change asked of the tier
        (a put, write or delete), amounts to, or None. Where ``exc`` is the storage refusing
        it (EROFS, EACCES, EPERM; with ``alone``, for a call about one object, EROFS only)
        and a read of the tier answers (the look-up that probes a read-only tier), the tier
        is marked :attr:`writes_refused` (and up, where it was down). None where ``exc`` is
        no such refusal, or the read fails too: the tier does not answer (the caller marks
        it down)."""
        if os_error_in(exc, (errno.EROFS,) if alone else _REFUSED) is None:
            return None
        if self._read_probe() is not None:
            return None
        self._answered = time.monotonic()
        if not self.up:
            self.mark_up()
        wait = self.mark_refused(exc)
        err = WritesRefusedError(
            f"tier {self.name!r} refuses writes (its storage is read-only, or permission to "
            f"write is denied): it takes no writes, and nothing there is deleted, for "
            f"{wait:.3g} s, and is read as before ({exc})"
        )
        err.tier = self.name  # type: ignore[attr-defined]
        return err

    def mark_up(self) -> None:
        if not self.configured:
            return  # (it stays down: nothing of it is configured to answer)
        changed = self.state != "up"
        self.state = "up"
        self.last_error = ""
        self._backoff = 0.0
        if changed and self.commit is not None:
            self.commit.tier_changed(self)

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args)`` against this tier within its concurrency slots; a backend failure
        marks the tier down and is raised as :class:`TierDownError` naming the tier, but for
        one object that cannot be used (:meth:`object_error`), raised as
        :class:`ObjectError`, the tier left up. A change to a :attr:`read_only` tier (a put,
        write or delete) raises :class:`ReadOnlyError` and is not tried."""
        return self._call(fn, args, kwargs, alone=False)

    def call_alone(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """As :meth:`call`, for a call about one object ``args[0]`` whose failure may be that
        object's alone (permission denied, an I/O error on it), where the caller goes on to
        other objects (fsck's repairs): a backend failure is raised as :class:`ObjectError`,
        the tier left up, where the tier answers (as :meth:`object_error` asks: a probe
        made, or one that found it answering less than :attr:`RECHECK_S` ago); where it
        does not, the tier is marked down as by :meth:`call`. A device with no space left
        is as for :meth:`call`."""
        return self._call(fn, args, kwargs, alone=True)

    def _call(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], alone: bool
    ) -> Any:
        if self.unwritable:
            change = self._change(fn)
            if change is not None:
                what = f"{change} {args[0]!r}" if args else change
                if self.read_only:
                    raise ReadOnlyError(
                        f"tier {self.name!r} is read-only: nothing there is written or deleted "
                        f"({what} refused)"
                    )
                err: TierDownError = WritesRefusedError(
                    f"tier {self.name!r} refuses writes for now: nothing there is written or "
                    f"deleted ({what} not tried; {self.last_error})"
                )
                err.tier = self.name  # type: ignore[attr-defined]
                raise err
        if not self.up:
            raise TierDownError(f"tier {self.name!r} is down: {self.last_error}")
        with self.slots:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                if not is_backend_failure(exc):
                    raise
                blocked = self.object_error(exc, args[0] if args else None)
                if blocked is not None:
                    raise blocked from exc
                if no_space_left(exc):
                    wait = self.mark_full(exc)
                    err = TierFullError(
                        f"tier {self.name!r} has no space left on its device: it takes no "
                        f"writes for {wait:g} s and is read as before ({exc})"
                    )
                    err.tier = self.name  # type: ignore[attr-defined]
                    raise err from exc
                if self._change(fn) is not None:
                    refused = self.refused(exc, alone=alone)
                    if refused is not None:
                        raise refused from exc
                if alone and self._answers():
                    what = f"object {args[0]!r}" if args else "an object"
                    raise ObjectError(
                        f"tier {self.name!r}: {what} cannot be used: {exc}; the tier answers "
                        "and is not marked down"
                    ) from exc
                self.mark_down(exc)
                err = TierDownError(f"tier {self.name!r} failed and is now marked down: {exc}")
                err.tier = self.name  # type: ignore[attr-defined]
                raise err from exc

    def _change(self, fn: Callable[..., Any]) -> str | None:
        """The name of the backend call ``fn`` is where it changes what the tier holds (one
        of ``_CHANGES``), else None."""
        return next((n for n in _CHANGES if fn == getattr(self.backend, n, None)), None)

    def object_error(self, exc: BaseException, key: Any = None) -> ObjectError | None:
        """The :class:`ObjectError` that ``exc`` amounts to, or None. An error of something in
        the way of an object (:func:`in_the_way`: a directory at its path, a file at one of
        its folders'), or of the storage refusing that object for what it is
        (:func:`refused_object`: its name too long, its size too large), is one object's
        where the tier answers a probe (:meth:`check`), which a tier whose own root is in
        the way fails (it is then marked down). A probe that
        found the tier answering less than :attr:`RECHECK_S` ago stands for one (so many
        objects under one thing in the way cost one probe, not one each; a root put in the
        way meanwhile is found by the first probe after that), and none is made where the
        tier was marked down as recently. ``key``: the object asked for, named where the
        error names no path."""
        blocked = in_the_way(exc)
        refused = refused_object(exc) if blocked is None else None
        if (blocked is None and refused is None) or not self._answers():
            return None
        if refused is not None:
            if isinstance(key, list | tuple) and len(key) == 1:
                key = key[0]  # (a look at one object's version)
            obj = key if isinstance(key, str) else None
            what = f"object {obj or refused.filename!r}" if obj or refused.filename else ""
            long = refused.errno == errno.ENAMETOOLONG and obj is not None
            why = self.backend.key_problem(obj) if long else ""
            said = refused.strerror or str(refused)
            return ObjectError(
                f"tier {self.name!r}: {what or 'an object'} cannot be stored there: {why or said}"
                f"{f' ({said})' if why else ''}; the tier answers and is not marked down"
            )
        where = blocked.filename2 or blocked.filename or (key if isinstance(key, str) else None)
        what = "an object" if where is None else f"object {where!r}"
        return ObjectError(
            f"tier {self.name!r}: {what} cannot be used: {blocked.strerror} (a "
            "directory stands where the object should be, or a file where one of its folders "
            "should be); the tier answers and is not marked down: move that away"
        )

    def _answers(self) -> bool:
        """Whether the tier answers, as :meth:`object_error` asks: True where a probe found
        it answering less than :attr:`RECHECK_S` ago, False where it was marked down as
        recently, else the outcome of a probe made now. One probe at a time: threads asking
        meanwhile wait for its outcome rather than each probing."""
        with self._probing:
            now = time.monotonic()
            if self.up and now - self._answered < self.RECHECK_S:
                return True
            if not self.up and now - self._probed < self.RECHECK_S:
                return False
            return self.check()

    def recheck(self) -> bool:
        """Whether the tier is up, probing it (:meth:`check`) where it is down and was last
        probed, or failed, long enough ago: :attr:`RECHECK_S`, doubled after each probe that
        failed, up to :attr:`RECHECK_MAX_S` (a probe of a tier that does not answer may take
        its backend's timeout, on the caller's time). A read that finds a chunk's only
        copies on down tiers asks, or a copy on a down tier faster than the one it reads,
        an open that finds a dataset's ``zarr.json`` on no tier
        that is up, and a write whose preferred tiers are down, so a
        long-running job sees a tier come back (another process's ``strataio tiers
        --check`` marks it up in the catalog, not here)."""
        if self.up:
            return True
        if not self.probe_due():
            return False
        wait = max(self._backoff, self.RECHECK_S)
        self._probed = time.monotonic()
        if self.check():
            return True
        self._backoff = min(2 * wait, max(self.RECHECK_MAX_S, self.RECHECK_S))
        return False

    def probe_due(self) -> bool:
        """Whether :meth:`recheck` would probe the tier now: it is marked down and was last
        probed long enough ago."""
        if not self.configured:
            return False  # (never probed: see unconfigured)
        return not self.up and time.monotonic() - self._probed >= max(self._backoff, self.RECHECK_S)

    def check(self) -> bool:
        """Probe the backend; update and return health. A writable tier is probed by a put,
        a get and a delete of a small object of its own (a put its storage refuses while a
        read answers finds it up and :attr:`writes_refused`; one that succeeds ends that, and
        :attr:`out_of_space`). A :attr:`read_only` tier, which would refuse that put (and so
        never be found up again once marked down), is probed by a read only: the size of the
        probe object's key is looked up, and "no such object" is an answer (a POSIX tier
        whose directory is gone gives none: its backend does not answer). Any other failure
        means the tier does not answer. A tier the configuration lacks (:meth:`unconfigured`)
        is not probed: False, nothing asked of any storage."""
        if not self.configured:
            return False
        answers = self._check_by_reading() if self.read_only else self._check_by_writing()
        if answers:
            self._answered = time.monotonic()
        return answers

    def _check_by_writing(self) -> bool:
        """:meth:`check` of a writable tier: a put, a get and a delete."""
        payload = f"strataio {time.time():.6f}".encode()
        # (a probe object of its own per process and thread: probes of one tier by many
        # readers at once would otherwise delete each other's and mark it down)
        key = f"{PROBE_KEY}-{socket.gethostname()}-{os.getpid()}-{threading.get_ident()}"
        try:
            self.backend.put(key, payload)
            got = bytes(self.backend.get(key))
            self.backend.delete(key)
        except Exception as exc:  # any failure of the probe means the tier does not answer
            if no_space_left(exc):  # (but for a full device: it answers, and is read)
                self.mark_up()
                self.mark_full(exc)
                return True
            if self.refused(exc) is not None:  # (nor for one that refuses writes: it is read)
                return True
            self.mark_down(exc)
            return False
        self._full.end()  # (room again, and writes taken: it was written)
        self._refused.end()
        if got != payload:
            self.mark_down("health probe read back different bytes")
            return False
        self.mark_up()
        return True

    def _check_by_reading(self) -> bool:
        """:meth:`check` of a :attr:`read_only` tier: reads only."""
        failed = self._read_probe()
        if failed is not None:
            self.mark_down(failed)
            return False
        self.mark_up()
        return True

    def _read_probe(self) -> Exception | None:
        """Look the tier up by a read alone; the error if it does not answer, else None."""
        try:
            # (one look-up, not a listing of the tier, which on an object store reads every
            # key first; "no such object" is an answer)
            try:
                self.backend.size(PROBE_KEY)
            except (NotFoundError, FileNotFoundError):
                # (an object store answers a look-up in a bucket that does not exist as it
                # answers one of a missing object, a HEAD having no body to say which: a
                # listing of the probe's folder, which holds at most the probes running, says.
                # Only that it does not exist counts: credentials that may read objects but
                # not list them, common for a read-only store, got their answer above)
                try:
                    next(iter(self.backend.list(PROBE_DIR)), None)
                except StoreMissingError:
                    raise
                except Exception:
                    pass  # (a listing refused: the look-up above was answered)
        except Exception as exc:  # any other failure of the reads: the tier does not answer
            return exc
        return None

    # ----------------------------------------------------------------- capacity
    @property
    def free(self) -> int | None:
        """Bytes left before the capacity is reached (``None`` = unbounded; 0 on a device
        with no space left, and on an :attr:`unwritable` tier)."""
        if self.out_of_space or self.unwritable:
            return 0
        if self.capacity is None:
            return None
        return max(0, self.capacity - self.used - self.reserved)

    def has_room(self, nbytes: int) -> bool:
        if self.out_of_space or self.unwritable:
            return False
        return self.capacity is None or self.used + self.reserved + nbytes <= self.capacity

    def reserve(self, nbytes: int) -> bool:
        """Claim ``nbytes`` of room for a put in flight (atomic against other threads);
        :meth:`release` it once the copy is recorded (or failed)."""
        with self._lock:
            if not self.has_room(nbytes):
                return False
            self.reserved += nbytes
            return True

    def release(self, nbytes: int) -> None:
        with self._lock:
            self.reserved = max(0, self.reserved - nbytes)
            self._changed.notify_all()

    def wait_for_change(self, timeout: float) -> None:
        """Wait until a reservation is released or usage changes (``timeout`` seconds at
        most)."""
        with self._changed:
            self._changed.wait(timeout)

    def account(self, delta: int, *, release: int = 0, keep: int = 0) -> None:
        """Add ``delta`` bytes (negative to free) to :attr:`used`, and in the same step drop
        ``release`` bytes of reservation and reserve ``keep`` bytes of the room freed: a
        recorded put turns its reservation into usage atomically, so no other thread sees the
        room counted twice (a false "full") or not at all (an overfilled tier)."""
        with self._lock:
            self.used = max(0, self.used + int(delta))
            self.reserved = max(0, self.reserved - int(release)) + int(keep)
            self._changed.notify_all()

    @classmethod
    def unconfigured(cls, record: TierRecord, order: int) -> Tier:
        """A stand-in for tier ``record`` that the catalog registers and the configuration
        lacks (dropped from it, perhaps for a while), ranked ``order`` (after every configured
        tier): always down (:attr:`condition` ``down (not configured)``), never written nor
        probed up (:meth:`check` asks nothing), its backend refusing every call. Its copies
        are then as a down tier's: reads use other copies, writes go elsewhere, one a write
        makes obsolete is left to delete once the tier is configured again, fsck reports them
        not checked and keeps their rows."""
        why = (
            f"not configured: the catalog knows this tier ({record.url}) and may record copies "
            "there, but the configuration has no tier of that name; add it back to reach them"
        )
        return cls(
            name=record.name,
            backend=UnconfiguredBackend(record.name, record.url),
            role=record.role,
            capacity=record.capacity_bytes,
            order=order,
            state="down",
            last_error=why,
            configured=False,
        )

    def record(self) -> TierRecord:
        """This tier as a catalog row (``why`` the catalog's own where it is down only
        because the catalog says so)."""
        why = self.last_error if self.state != "up" else ""
        if why and why == _marked_down(self._catalog_why):
            why = self._catalog_why
        return TierRecord(
            self.name, self.backend.url, self.role, self.capacity, self.order, self.state, why
        )


class UnconfiguredBackend(Backend):
    """The backend of a tier the configuration lacks (:meth:`Tier.unconfigured`): every
    call raises :class:`TierDownError` naming the tier, and nothing is touched."""

    def __init__(self, name: str, url: str) -> None:
        self.name, self.url = name, url

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TierDownError(
            f"tier {self.name!r} is not configured: the catalog knows it ({self.url}), the "
            "configuration has no tier of that name"
        )

    read = write = get = put = size = exists = delete = list = _refuse  # type: ignore[assignment]
    put_versioned = put_new = object_versions = put_if = delete_if = _refuse  # type: ignore[assignment]
    delete_if_many = remove_empty_folders = sync = versions = _refuse  # type: ignore[assignment]
    readinto_range = readinto_range_versioned = readinto_ranges_versioned = _refuse  # type: ignore[assignment]
    get_many = _refuse  # type: ignore[assignment]


def _marked_down(why: str) -> str:
    """A tier's :attr:`Tier.last_error` where only the catalog says it is down, for ``why``."""
    return "marked down in the catalog" + (f": {why}" if why else "")


def transfer(src: Tier, dst: Tier, dataset: str, key: str, expect: str = "") -> tuple[int, str]:
    """Copy chunk ``key`` of ``dataset`` from ``src`` to ``dst`` the safe way; return
    ``(nbytes, checksum)``: :func:`read_checked` from ``src``, then :func:`put_checked` to
    ``dst``."""
    data = read_checked(src, dataset, key, expect)
    n, digest, _ = put_checked(dst, dataset, key, data, like=expect)
    return n, digest


def read_checked(src: Tier, dataset: str, key: str, expect: str = "") -> bytes:
    """The bytes of chunk ``key`` of ``dataset`` on ``src``, checked against ``expect`` (when
    given). A failing tier is marked down (:class:`TierDownError`); a missing object raises
    :class:`NotFoundError`; a mismatch raises :class:`ChecksumError` naming the dataset, the
    chunk and the tier. Nothing is put anywhere."""
    data = src.call(src.backend.get, f"{dataset}/{key}")
    got = checksum_like(expect, data)
    if expect and got != expect:
        raise ChecksumError(
            f"chunk {key!r} of dataset {dataset!r} on tier {src.name!r} has checksum {got}, "
            f"catalog says {expect}"
        )
    return data


def put_checked(
    dst: Tier,
    dataset: str,
    key: str,
    data: BytesLike,
    *,
    new: bool = False,
    over: Version | None = None,
    like: str = "",
) -> tuple[int, str, Any]:
    """Put ``data`` as chunk ``key`` of ``dataset`` on ``dst`` durably (fsync / completed
    PUT), read it back and check it, so the copy is known good before anyone records it;
    return ``(nbytes, checksum, version)``, the version that of the object put
    (:meth:`Backend.put_versioned`). ``new``: only where no object is there yet
    (:meth:`Backend.put_new`; else :class:`ExistsError`, and nothing is put). ``over``: only
    over the object at that version (:meth:`Backend.put_if`; else as ``new``). ``like``: the
    recorded checksum of the copy the bytes come from, whose kind the new copy's keeps
    (:func:`checksum_like`). Raises as :func:`read_checked` does."""
    obj = f"{dataset}/{key}"
    got = checksum_like(like, data)
    try:
        if new:
            version = dst.call(dst.backend.put_new, obj, data, durable=True)
        elif over is not None:
            version = dst.call(dst.backend.put_if, obj, data, over, durable=True)
        else:
            version = dst.call(dst.backend.put_versioned, obj, data, durable=True)
    except ExistsError:
        raise _unknown_object(dst, dataset, key) from None
    try:
        back = checksum_like(like, dst.call(dst.backend.get, obj))
    except (NotFoundError, FileNotFoundError):
        # (a ChecksumError too, as below: the copy is not to be recorded)
        raise ChecksumError(
            f"chunk {key!r} of dataset {dataset!r}: another process deleted the copy just "
            f"put on tier {dst.name!r} before it was read back (this copy is not recorded)"
        ) from None
    if back != got:
        if version is not None and dst.call(dst.backend.object_versions, [obj]) != [version]:
            # (a ChecksumError still, as callers take it: the copy is not to be recorded)
            raise ChecksumError(
                f"chunk {key!r} of dataset {dataset!r}: another process replaced the copy "
                f"just put on tier {dst.name!r} before it was read back (nothing is damaged; "
                "this copy is not recorded)"
            )
        raise ChecksumError(
            f"chunk {key!r} of dataset {dataset!r} read back from tier {dst.name!r} has "
            f"checksum {back}, {got} was written"
        )
    return len(data), got, version


def refuse_unknown_object(dst: Tier, dataset: str, key: str) -> None:
    """Raise :class:`ExistsError` if ``dst`` holds an object of chunk ``key`` of
    ``dataset``: the caller knows of none there, so it belongs to another process (a write
    not yet recorded) or is a leftover, and is not to be replaced."""
    if _exists(dst, f"{dataset}/{key}"):
        raise _unknown_object(dst, dataset, key)


def _unknown_object(dst: Tier, dataset: str, key: str) -> ExistsError:
    return ExistsError(
        f"chunk {key!r} of dataset {dataset!r}: tier {dst.name!r} holds an object of it "
        "that no copy known here names: another process's write not recorded yet, or a "
        "leftover (of a process that is gone, or a copy superseded while the tier was away "
        "whose handle closed before it could delete it), which 'strataio fsck --repair' "
        "removes once no process has the dataset open"
    )


def _exists(tier: Tier, obj: str) -> bool:
    try:
        tier.call(tier.backend.size, obj)
    except (NotFoundError, FileNotFoundError):
        return False
    return True


class TierSet:
    """The registry of tiers, fastest first. Look tiers up by name (``tiers["disk"]``)."""

    def __init__(self, tiers: Sequence[Tier]) -> None:
        names = [t.name for t in tiers]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise StrataError(f"tier names must be unique; repeated: {', '.join(sorted(dup))}")
        if not tiers:
            raise StrataError("a storage hierarchy needs at least one tier")
        self._tiers = sorted(tiers, key=lambda t: t.order)
        self._by_name = {t.name: t for t in self._tiers}

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_config(cls, config: Any, known: Collection[str] = ()) -> TierSet:
        """Tiers of a :class:`strataio.config.Config` (its ``tiers`` list, fastest first).

        ``known``: the names of the tiers the catalog has registered (:meth:`Catalog.tiers`):
        a POSIX tier among them whose directory is missing is built down, the directory not
        made (see :func:`tier_from_config`). An ``OSError`` setting a tier up is raised as
        :class:`ConfigError` naming the configuration, and so is any other error building
        one (a setting its backend refuses: an S3 bucket name, endpoint or prefix, read from
        the environment too), naming the tier as well."""
        names = set(known)
        where = getattr(config, "source", None) or "the default configuration"
        tiers = []
        for i, tc in enumerate(config.tiers):
            try:
                tiers.append(tier_from_config(tc, i, known=tc.name in names))
            except OSError as exc:
                raise ConfigError(f"cannot set up the tiers configured in {where}: {exc}") from None
            except ConfigError:
                raise
            except StrataError as exc:
                raise ConfigError(
                    f"cannot set up tier {tc.name!r} configured in {where}: {exc}"
                ) from None
        return cls(tiers)

    # ----------------------------------------------------------------- lookup
    def __getitem__(self, name: str) -> Tier:
        try:
            return self._by_name[name]
        except KeyError:
            raise NotFoundError(
                f"no tier named {name!r}; tiers are {', '.join(self._by_name)}"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[Tier]:
        return iter(self._tiers)

    def __len__(self) -> int:
        return len(self._tiers)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self._tiers]

    def by_role(self, role: str) -> list[Tier]:
        """Configured tiers of ``role``, fastest first."""
        return [t for t in self._tiers if t.role == role and t.configured]

    def rank(self, name: str) -> int:
        """Position of tier ``name`` in the hierarchy (0 = fastest)."""
        return self._tiers.index(self[name])

    # ----------------------------------------------------------------- catalog sync
    def records(self) -> list[TierRecord]:
        """The configured tiers as catalog rows (not those the configuration lacks, whose
        rows the catalog keeps as they are)."""
        return [t.record() for t in self._tiers if t.configured]

    def with_unconfigured(self, records: Iterable[TierRecord]) -> TierSet:
        """These tiers and, after them (slowest), a stand-in (:meth:`Tier.unconfigured`) for
        each tier of ``records`` (the catalog's, :meth:`Catalog.tiers`) that they lack, so a
        copy the catalog records there is a copy on a tier that is down, not a tier unknown.
        Memory tiers get none: no copy there is catalogued. ``self`` where none is lacking."""
        last = max(t.order for t in self._tiers)
        gone = sorted(
            (r for r in records if r.name not in self._by_name and r.role != "memory"),
            key=lambda r: (r.order, r.name),
        )
        if not gone:
            return self
        extra = [Tier.unconfigured(r, last + 1 + i) for i, r in enumerate(gone)]
        return TierSet([*self._tiers, *extra])

    def apply_states(self, records: Iterable[TierRecord]) -> None:
        """Adopt the health states the catalog holds for known tiers; a tier found unusable
        here stays down (the catalog then learns it from :meth:`records`)."""
        for r in records:
            t = self._by_name.get(r.name)
            if t is not None and t.configured and r.state != t.state and t.state != "down":
                t.state = r.state
                if r.state == "down" and not t.last_error:
                    # (another process found it down: its error, and that it is not this one's)
                    t.last_error, t._catalog_why = _marked_down(r.why), r.why

    def account_usage(self, copies: Iterable[ChunkCopy | TierUsage]) -> None:
        """Set each tier's :attr:`Tier.used` from catalogued copies of all datasets, or from
        the catalog's sums of them (:meth:`Catalog.usage`: a row per dataset and tier)."""
        used = dict.fromkeys(self._by_name, 0)
        for c in copies:
            if c.tier in used:
                used[c.tier] += c.nbytes
        for name, n in used.items():
            self._by_name[name].used = n

    def close(self) -> None:
        for t in self._tiers:
            # closing a dead connection must not mask the caller's error
            with contextlib.suppress(Exception):
                t.backend.close()


def register_configured_tiers(
    catalog: Any, config: Any, *, make_dirs: bool = True
) -> list[TierRecord]:
    """Register ``config``'s tiers in ``catalog``, keeping the health states it holds (and
    why a tier is down); returns
    the records of those new to it. With ``make_dirs``, a POSIX tier new to the catalog (and
    not read-only) first gets its directory where missing, as a Session makes it (one that
    cannot be made is left: the tier is down where it is used), since nothing makes the
    directory of a tier the catalog knows but ``strataio init``."""
    known = {t.name: t for t in catalog.tiers()}
    records = [
        replace(r, state=known[r.name].state, why=known[r.name].why) if r.name in known else r
        for r in config.tier_records()
    ]
    for t in config.tiers if make_dirs else ():
        if t.name not in known and not t.read_only and t.kind == "posix" and t.path:
            with contextlib.suppress(OSError):
                os.makedirs(t.path, exist_ok=True)
    catalog.register_tiers(records)
    return [r for r in records if r.name not in known]


def tier_from_config(tc: Any, order: int, *, known: bool = False) -> Tier:
    """Build a :class:`Tier` from one ``TierConfig`` (``kind`` ``posix``/``s3``/``memory``,
    optionally wrapped in a :class:`~strataio.storage.shaped.Shaped` cost model).

    A POSIX tier's directory is made where it is missing only for a tier new to the catalog
    (``known`` false: the catalog has never registered it, as on the first use of a
    configuration or for a tier just added to it), and never for a ``read_only`` one. Where
    the catalog knows the tier (``known``), a missing directory is a volume not mounted or a
    directory removed, not an empty tier: the tier is built down, saying so and how to bring
    it back (mount it or put it back, or make it new and empty with ``strataio init``; then
    a probe, ``strataio tiers --check``, marks it up), and nothing is made in its place, so
    reads fall over to other copies, writes go to other tiers and fsck checks no copy there
    (nor drops a row of one). A directory that cannot be made or used leaves the tier down
    too, with the reason; the other tiers serve."""
    kind = getattr(tc, "kind", "posix")
    read_only = bool(getattr(tc, "read_only", False))
    unusable = ""
    if kind == "posix":
        backend, unusable = _posix_backend(tc.path, read_only=read_only, known=known)
    elif kind == "memory":
        from strataio.storage.memory import MemoryBackend

        backend = MemoryBackend(tc.name)
    elif kind == "s3":
        from strataio.storage.s3 import S3Backend

        endpoint = getattr(tc, "endpoint", None)
        backend = S3Backend(
            tc.bucket,
            getattr(tc, "prefix", "") or "",
            endpoint=endpoint,
            region=getattr(tc, "region", None),
            access_key=(tc.credentials or {}).get("access_key_id"),
            secret_key=(tc.credentials or {}).get("secret_access_key"),
            session_token=(tc.credentials or {}).get("session_token"),
            allow_http=bool(endpoint and endpoint.startswith("http://")),
        )
    else:
        raise StrataError(f"tier {tc.name!r}: unknown kind {kind!r} (posix, s3 or memory)")
    preset = getattr(tc, "shaped", None)
    if preset:
        from strataio.storage.shaped import CostModel, Shaped

        backend = Shaped(backend, CostModel.from_preset(preset), getattr(tc, "time_scale", 1.0))
    role = getattr(tc, "role", "localdisk")
    conc = getattr(tc, "concurrency", None) or DEFAULT_CONCURRENCY.get(role, 4)
    capacity = tc.capacity_bytes
    if capacity is None and role == "memory":
        capacity = DEFAULT_MEMORY_BYTES
    return Tier(
        name=tc.name,
        backend=backend,
        role=role,
        capacity=capacity,
        order=order,
        concurrency=conc,
        read_only=read_only,
        state="down" if unusable else "up",
        last_error=unusable,
    )


def _posix_backend(path: str, *, read_only: bool, known: bool) -> tuple[Backend, str]:
    """The backend of a POSIX tier configured at ``path``, and why its directory cannot be
    used ("" where it can), made where missing as :func:`tier_from_config` says."""
    from strataio.storage.posix import ROOT_MISSING, PosixBackend

    if known and not read_only:
        backend = PosixBackend(path, create=None)
        why = backend.root_problem()
        if why == ROOT_MISSING:
            return backend, (
                f"its directory {path} is missing (a volume not mounted, or the directory "
                "removed): nothing is made in its place, as the catalog knows this tier; mount "
                "it or put it back, or make it new and empty with `strataio init` (with "
                "`--remake-tier NAME` where copies are recorded there), then "
                "`strataio tiers --check` marks the tier up"
            )
        return backend, why and f"cannot use its directory {path}: {why}"
    try:
        # (a read-only tier's directory is not made: it must be there)
        return PosixBackend(path, create=not read_only), ""
    except OSError as exc:
        # (a mount point missing, a file in its place): the tier is down, not the hierarchy
        why = f"cannot use its directory {path}: {exc.strerror or exc}"
        return PosixBackend(path, create=None), why
