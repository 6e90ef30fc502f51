"""Where checkpoints and run files live: a local folder or an object store (``s3://``, ``gs://``,
what ``pyarrow.fs.FileSystem.from_uri`` opens), behind one small set of file operations.

A *location* is a string: a local path or a URI ``scheme://bucket/key/prefix``.  The endpoint,
region and credentials of an object store come from the standard environment variables
(``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``GOOGLE_APPLICATION_CREDENTIALS``, ...), never from the URI, so no location carries a secret.

The two kinds differ in one thing that matters: a local folder can be renamed atomically, an
object store cannot.  :meth:`Store.stage` hides it: on a local disk a new folder is written as a
temporary sibling, fsynced and renamed into place; on an object store the files are uploaded where
they belong, and whoever writes decides what makes the folder complete (a checkpoint's manifest,
written last: trainers/loop/checkpoint.py).  A single object (:meth:`Store.write_bytes`) is
atomic on both: a temporary file renamed on a disk, one PUT on an object store.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import shutil
import socket
from collections.abc import Iterator
from typing import IO, Any, Literal

from trainers.errors import one_line

Kind = Literal["file", "dir"]

# Schemes pyarrow.fs.FileSystem.from_uri opens (file:// is a local path here).
URI_SCHEMES = ("s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss")
# Variables a store's filesystem reads when it opens: a different value is a different store.
_ENV_PREFIXES = ("AWS_", "GOOGLE_", "GCS_", "STORAGE_EMULATOR_HOST", "AZURE_", "HADOOP_", "ARROW_")


def is_uri(location: str) -> bool:
    return "://" in location


def resolve(location: str) -> str:
    """A local folder made absolute (a resume from another folder reaches the same place), a
    ``file://`` URI as that local path, any other URI as given without a trailing slash."""
    if location.startswith("file://"):
        location = location[len("file://") :] or "/"
    if not is_uri(location):
        return os.path.abspath(os.path.expanduser(location))
    scheme, rest = location.split("://", 1)
    return f"{scheme}://{rest.rstrip('/')}"


def join(location: str, *names: str) -> str:
    if not is_uri(location):
        return os.path.join(location, *names)
    return "/".join([location.rstrip("/"), *names])


def basename(location: str) -> str:
    return posixpath.basename(location.rstrip("/")) if is_uri(location) else os.path.basename(location.rstrip(os.sep))


def location_problem(location: str) -> str | None:
    """Why ``location`` cannot name checkpoint storage, from the string alone (no I/O): an
    unknown scheme, credentials or options in a URI, a URI without a bucket.  None if it can."""
    if not location.strip():
        return "empty; give a folder, e.g. ray_runs, or a bucket URI such as s3://bucket/runs"
    if not is_uri(location) or location.startswith("file://"):
        return None
    scheme, rest = location.split("://", 1)
    if scheme.lower() not in URI_SCHEMES:
        return (
            f"unknown URI scheme {scheme + '://'!r}; give a folder or a URI of one of "
            f"{', '.join(s + '://' for s in URI_SCHEMES)}"
        )
    netloc = rest.split("/", 1)[0]
    if "@" in netloc:  # s3://KEY:SECRET@bucket: never shown, stored or logged, so refused outright
        return (
            f"a URI with credentials ({scheme}://***@...) is not accepted; give {scheme}://bucket/prefix "
            "and the credentials in the environment (e.g. AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
        )
    if "?" in rest or "#" in rest:
        return (
            f"URI options ('?...') are not accepted ({scheme}://{netloc}/...); set the endpoint, region and "
            "credentials in the environment (e.g. AWS_ENDPOINT_URL, AWS_REGION)"
        )
    if not netloc:
        return f"no bucket in {location!r}; give {scheme}://bucket/prefix"
    return None


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` lives on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def tmp_name(name: str) -> str:
    """The temporary sibling a local folder is written into: ``.<name>.tmp-<host>-<pid>``."""
    return f".{name}.tmp-{socket.gethostname()}-{os.getpid()}"


# --------------------------------------------------------------------------- the interface


class Store:
    """File operations on locations of one kind.  ``renames``: whether a folder can be renamed
    into place atomically (a local disk), so a reader never sees one half-written."""

    renames: bool = False

    def kind(self, location: str) -> Kind | None:
        """``"file"``, ``"dir"`` or None when nothing is there."""
        raise NotImplementedError

    def size(self, location: str) -> int:
        raise NotImplementedError

    def children(self, location: str) -> list[tuple[str, Kind]]:
        """``(name, kind)`` of what is directly in the folder; empty when there is no folder."""
        raise NotImplementedError

    def files_under(self, location: str) -> list[str]:
        """Every file below the folder, as paths relative to it (``a/b``); empty when there is none."""
        raise NotImplementedError

    def open_read(self, location: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        raise NotImplementedError

    def open_write(self, location: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        """A new file, made durable when the block ends (a local file is fsynced)."""
        raise NotImplementedError

    def read_bytes(self, location: str) -> bytes:
        with self.open_read(location) as f:
            return f.read()

    def write_bytes(self, location: str, data: bytes) -> None:
        """Write a whole file atomically: a reader sees the old content or the new, never part."""
        raise NotImplementedError

    def remove(self, location: str) -> None:
        """Delete a file or a folder and all below it; nothing there is not an error."""
        raise NotImplementedError

    def stage(self, directory: str) -> contextlib.AbstractContextManager[str]:
        """Write a new folder ``directory`` (which must not exist): yields where its files go."""
        raise NotImplementedError

    def move(self, source: str, target: str) -> None:
        """Move the folder ``source`` to ``target`` (which must not exist)."""
        raise NotImplementedError


def store_for(location: str) -> Store:
    return ObjectStore() if is_uri(resolve(location)) else LOCAL


# --------------------------------------------------------------------------- a local disk


def fsync_path(path: str) -> None:
    """fsync a file or a directory by path (a directory's fsync makes its renames durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:  # a filesystem that cannot fsync directories
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


class LocalStore(Store):
    """A local (or mounted shared) filesystem: temporary sibling, fsync, rename."""

    renames = True

    def kind(self, location: str) -> Kind | None:
        if os.path.isdir(location):
            return "dir"
        return "file" if os.path.isfile(location) else None

    def size(self, location: str) -> int:
        return os.path.getsize(location)

    def children(self, location: str) -> list[tuple[str, Kind]]:
        try:
            entries = list(os.scandir(location))
        except OSError:
            return []
        return [(e.name, "dir" if e.is_dir() else "file") for e in entries]

    def files_under(self, location: str) -> list[str]:
        out = []
        for top, _, files in os.walk(location):
            out += [os.path.relpath(os.path.join(top, f), location) for f in files]
        return out

    @contextlib.contextmanager
    def open_read(self, location: str) -> Iterator[IO[bytes]]:
        with open(location, "rb") as f:
            yield f

    @contextlib.contextmanager
    def open_write(self, location: str) -> Iterator[IO[bytes]]:
        with open(location, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())

    def write_bytes(self, location: str, data: bytes) -> None:
        parent = os.path.dirname(os.path.abspath(location))
        os.makedirs(parent, exist_ok=True)
        tmp = f"{location}.tmp-{os.getpid()}"
        try:
            with self.open_write(tmp) as f:
                f.write(data)
            os.replace(tmp, location)
        except BaseException:  # a full disk: no half-written temporary file left beside it
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise

    def remove(self, location: str) -> None:
        if os.path.isdir(location) and not os.path.islink(location):
            shutil.rmtree(location, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.remove(location)

    @contextlib.contextmanager
    def stage(self, directory: str) -> Iterator[str]:
        """Temporary sibling ``.<name>.tmp-<host>-<pid>``; when the block ends its files (fsynced
        by :meth:`open_write`) and itself are fsynced, it is renamed into place and the parent is
        fsynced, so the folder appears whole and survives a power loss.  A block that raises
        leaves nothing behind."""
        parent = os.path.dirname(os.path.abspath(directory)) or "."
        os.makedirs(parent, exist_ok=True)
        tmp = os.path.join(parent, tmp_name(os.path.basename(directory)))
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        try:
            yield tmp
            fsync_path(tmp)
            os.replace(tmp, directory)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_path(parent)

    def move(self, source: str, target: str) -> None:
        """A rename: atomic, the folder is at one place or the other."""
        os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
        os.rename(source, target)
        fsync_path(os.path.dirname(os.path.abspath(target)))


LOCAL = LocalStore()


# --------------------------------------------------------------------------- an object store


def _env_key() -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)))


_FILESYSTEMS: dict[tuple[Any, ...], tuple[Any, str]] = {}


def filesystem(location: str) -> tuple[Any, str]:
    """The pyarrow filesystem of a URI and the path on it (``s3://b/k`` -> ``(S3FileSystem, "b/k")``).

    One filesystem per bucket and environment: opening one resolves its settings (and may ask
    the store for the bucket's region), which each file operation should not repeat."""
    from pyarrow.fs import FileSystem  # only object-store paths need pyarrow's filesystems

    scheme, rest = location.split("://", 1)
    bucket, _, key = rest.partition("/")
    cache_key = (scheme, bucket, _env_key())
    if cache_key not in _FILESYSTEMS:
        fs, root = FileSystem.from_uri(f"{scheme}://{bucket}")
        _FILESYSTEMS[cache_key] = (fs, root.rstrip("/"))
    fs, root = _FILESYSTEMS[cache_key]
    key = key.strip("/")
    if not root:  # a filesystem whose paths do not start with the bucket (hdfs://host:port/path)
        return fs, "/" + key
    return fs, f"{root}/{key}" if key else root


class ObjectStore(Store):
    """An object store through ``pyarrow.fs``: keys under a prefix, no rename.  Folders are only
    prefixes: one exists while a key below it does (or the store keeps a marker for it)."""

    renames = False

    def kind(self, location: str) -> Kind | None:
        from pyarrow.fs import FileType  # only object-store paths need pyarrow's filesystems

        fs, path = filesystem(location)
        t = fs.get_file_info(path).type
        return "file" if t == FileType.File else "dir" if t == FileType.Directory else None

    def size(self, location: str) -> int:
        fs, path = filesystem(location)
        info = fs.get_file_info(path)
        if info.size is None:
            raise FileNotFoundError(errno.ENOENT, "no such object", location)
        return int(info.size)

    def _list(self, location: str, recursive: bool) -> tuple[str, list[Any]]:
        from pyarrow.fs import FileSelector  # only object-store paths need pyarrow's filesystems

        fs, path = filesystem(location)
        return path, fs.get_file_info(FileSelector(path, allow_not_found=True, recursive=recursive))

    def children(self, location: str) -> list[tuple[str, Kind]]:
        from pyarrow.fs import FileType  # only object-store paths need pyarrow's filesystems

        _, infos = self._list(location, recursive=False)
        return [(posixpath.basename(i.path), "dir" if i.type == FileType.Directory else "file") for i in infos]

    def files_under(self, location: str) -> list[str]:
        from pyarrow.fs import FileType  # only object-store paths need pyarrow's filesystems

        path, infos = self._list(location, recursive=True)
        return [i.path[len(path) + 1 :] for i in infos if i.type == FileType.File]

    @contextlib.contextmanager
    def open_read(self, location: str) -> Iterator[IO[bytes]]:
        fs, path = filesystem(location)
        with fs.open_input_stream(path) as f:
            yield f

    @contextlib.contextmanager
    def open_write(self, location: str) -> Iterator[IO[bytes]]:
        fs, path = filesystem(location)
        with fs.open_output_stream(path) as f:  # uploaded (all parts) when it closes
            yield f

    def write_bytes(self, location: str, data: bytes) -> None:
        with self.open_write(location) as f:  # one PUT: readers see the old object or the new one
            f.write(data)

    def remove(self, location: str) -> None:
        from pyarrow.fs import FileType  # only object-store paths need pyarrow's filesystems

        fs, path = filesystem(location)
        t = fs.get_file_info(path).type
        if t == FileType.Directory:
            fs.delete_dir(path)
        elif t == FileType.File:
            fs.delete_file(path)

    @contextlib.contextmanager
    def stage(self, directory: str) -> Iterator[str]:
        """No rename: the files go where they belong, and whatever was under the prefix before
        is deleted first.  The writer marks the folder complete itself (a manifest written last);
        a block that raises deletes what it uploaded, as far as the store still answers."""
        self.remove(directory)
        try:
            yield directory
        except BaseException:
            with contextlib.suppress(OSError):
                self.remove(directory)
            raise

    def move(self, source: str, target: str) -> None:
        """No rename: every object is copied under ``target``, then ``source`` is deleted."""
        fs, src = filesystem(source)
        _, dst = filesystem(target)
        for rel in self.files_under(source):
            fs.copy_file(f"{src}/{rel}", f"{dst}/{rel}")
        self.remove(source)


# --------------------------------------------------------------------------- a full or read-only store

# Write errors that trying again cannot cure (a worker-group restart would only write again into
# the same full disk): what each asks the person to do.
NO_ROOM = {
    errno.ENOSPC: ("is full", "free space there"),
    errno.EDQUOT: ("is over its disk quota", "free space there or raise the quota"),
    errno.EROFS: ("is read-only", "make it writable"),
}
if hasattr(errno, "EFBIG"):
    NO_ROOM[errno.EFBIG] = ("refuses a file that large", "free space there or lift the file-size limit")


def no_room(e: BaseException) -> OSError | None:
    """The ``OSError`` with an errno of :data:`NO_ROOM` behind ``e`` (itself, or its cause or
    context: ``torch.save`` turns the file's ENOSPC into a RuntimeError of its own), or None."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in NO_ROOM:
            return cur
        cur = cur.__cause__ or cur.__context__
    return None


def free_bytes(location: str) -> int | None:
    """Bytes free (to this user) on the filesystem that holds ``location`` (its nearest existing
    folder); None for an object store or where it cannot be told."""
    if is_uri(resolve(location)):
        return None
    path = resolve(location)
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def human_bytes(n: int | None) -> str:
    if n is None:
        return "unknown"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


class StorageFull(Exception):
    """A write into ``path`` failed with an error a retry cannot cure (:data:`NO_ROOM`: the disk is
    full, over its quota or read-only).  Plain fields, so every rank can be told (``as_dict``)."""

    def __init__(self, path: str, code: int, free: int | None = None, what: str = "checkpoint") -> None:
        self.path, self.code, self.free, self.what = path, int(code), free, what
        super().__init__(self.message)

    @classmethod
    def from_error(cls, path: str, e: OSError, what: str = "checkpoint") -> StorageFull:
        return cls(path, e.errno or errno.ENOSPC, free_bytes(path), what)

    @property
    def reason(self) -> str:
        return os.strerror(self.code)

    @property
    def fix(self) -> str:
        return NO_ROOM.get(self.code, ("cannot be written", "free space there"))[1]

    @property
    def message(self) -> str:
        """``the checkpoint storage is full (No space left on device) writing PATH, 12.0 KiB free
        there``: the resume command is the driver's to add."""
        state = NO_ROOM.get(self.code, ("cannot be written",))[0]
        free = "" if self.free is None else f", {human_bytes(self.free)} free there"
        return f"the {self.what} storage {state} ({self.reason}) writing {self.path}{free}"

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "code": self.code, "free": self.free, "what": self.what}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StorageFull:
        return cls(d["path"], d["code"], d.get("free"), d.get("what", "checkpoint"))

    def __reduce__(self) -> tuple[Any, ...]:
        return (StorageFull, (self.path, self.code, self.free, self.what))


def discard_partial(directory: str) -> None:
    """Delete what a failed write of folder ``directory`` may have left: the temporary sibling on
    a local disk (:meth:`LocalStore.stage`), the uploaded part on an object store.  Deleting needs
    no free space; a store that does not answer keeps it (the run's writer prunes it later)."""
    with contextlib.suppress(OSError):
        if is_uri(resolve(directory)):
            ObjectStore().remove(directory)
        else:
            parent = os.path.dirname(os.path.abspath(directory))
            LOCAL.remove(os.path.join(parent, tmp_name(os.path.basename(directory))))


# --------------------------------------------------------------------------- reachability


def _hint(scheme: str) -> str:
    if scheme == "s3":
        return (
            "check the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or a profile), the endpoint "
            "(AWS_ENDPOINT_URL) and the region (AWS_REGION)"
        )
    if scheme in ("gs", "gcs"):
        return "check the credentials (GOOGLE_APPLICATION_CREDENTIALS) and the bucket name"
    return "check the credentials and the endpoint in the environment"


def _first_line(e: BaseException, limit: int = 200) -> str:
    text = one_line(e, None, name=False)
    return text if len(text) <= limit else text[:limit] + "..."


def reach_problem(location: str) -> str | None:
    """Why the object store at URI ``location`` cannot hold checkpoints (its bucket missing, the
    credentials refused, the endpoint unreachable, the prefix a file), reading only: one
    request for the bucket, one listing of the prefix.  None if it can; None for a local path."""
    location = resolve(location)
    if not is_uri(location):
        return None
    scheme = location.split("://", 1)[0].lower()
    bucket = location.split("://", 1)[1].split("/", 1)[0]
    from pyarrow.fs import FileSelector, FileType  # only object-store paths need pyarrow's filesystems

    try:
        fs, path = filesystem(location)
        root = path.split("/", 1)[0] if scheme in ("s3", "gs", "gcs") else None
        if root is not None and fs.get_file_info(root).type == FileType.NotFound:
            return f"bucket {bucket!r} does not exist; create it or give an existing bucket"
        if fs.get_file_info(path).type == FileType.File:
            return f"{location} is an object, not a prefix; give a prefix (folder) in the bucket"
        fs.get_file_info(FileSelector(path, allow_not_found=True))  # the right to list it
    except Exception as e:  # pyarrow raises OSError, ArrowInvalid, ValueError
        return f"cannot reach {location} ({_first_line(e)}); {_hint(scheme)}"
    return None


__all__ = [
    "LOCAL",
    "LocalStore",
    "NO_ROOM",
    "ObjectStore",
    "Store",
    "StorageFull",
    "URI_SCHEMES",
    "basename",
    "discard_partial",
    "filesystem",
    "free_bytes",
    "fsync_path",
    "human_bytes",
    "is_uri",
    "join",
    "location_problem",
    "no_room",
    "pid_alive",
    "reach_problem",
    "resolve",
    "store_for",
    "tmp_name",
]
