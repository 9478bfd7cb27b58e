"""The one storage seam: every location a user gives is a local path or an object-store URI.

    loc = location("s3://bucket/runs/docs")       # or "runs/docs", "/abs/path", "file:///abs/path"
    loc.write("manifest.json", data)               # appears complete or not at all
    loc.create(".bertflow.lock", body)             # conditional create: False if it exists (If-None-Match: *)
    loc.replace_if(".bertflow.lock", body, etag)   # compare-and-swap (If-Match): False if it changed
    loc.list()                                     # every complete object below, as Meta(name, size, etag)

The code above this module is written for object-storage semantics, and POSIX gets the same guarantees
for free: there is no rename (a dataset or checkpoint exists when its manifest or marker, written last,
exists); an object appears only complete (a single PUT, or a completed multipart upload: a listing never
shows a partial upload); a lock is a conditional create with an owner and an expiry (contracts.lease).
Local files get the same contract from a temporary file, fsync and ``os.link``/``os.replace``.

The object stores are reached through ``obstore`` (the Rust ``object_store`` crate): conditional create
and If-Match writes (what a lock needs, and what pyarrow's S3 file system does not offer), multipart
uploads that appear only when complete, and credentials from the standard places (``AWS_*`` variables,
``AWS_ENDPOINT_URL`` for S3-compatible stores, container and instance credentials). bench/bench_storage.py
measures it against pyarrow's S3 file system and boto3 on the same data.

Imports nothing of the project but contracts.common, and no framework.
"""
from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional
from urllib.parse import urlparse

from contracts.common import UserError, fsync_dir

OBJECT_SCHEMES = ("s3", "gs", "az", "abfs", "memory")
SCRATCH_ENV = "BERTFLOW_SCRATCH"  # node-local scratch for files on their way to or from an object store


def scratch_root() -> Path:
    """Node-local scratch: $BERTFLOW_SCRATCH, else the system's temporary directory (made if missing)."""
    root = Path(os.environ.get(SCRATCH_ENV) or tempfile.gettempdir())
    root.mkdir(parents=True, exist_ok=True)
    return root


def is_uri(path: str | os.PathLike) -> bool:
    """True for an object-store URI (``s3://...``); ``file://`` and plain paths are local."""
    scheme = urlparse(str(path)).scheme
    return scheme in OBJECT_SCHEMES


@dataclass(frozen=True)
class Meta:
    """One complete object (or file) below a location: its name relative to it, size and version tag."""

    name: str
    size: int
    etag: str


class Location:
    """A directory-like place: a local directory or an object-store prefix (``location()`` builds one)."""

    uri: str

    def join(self, *parts: str) -> "Location":
        raise NotImplementedError

    def read(self, name: str) -> bytes:
        """The bytes of ``name``; FileNotFoundError if absent."""
        raise NotImplementedError

    def write(self, name: str, data: bytes) -> str:
        """Write ``name`` whole (it appears complete or not at all); returns its etag."""
        raise NotImplementedError

    def create(self, name: str, data: bytes) -> Optional[str]:
        """Write ``name`` only if absent (atomic against every other writer); its etag, or None if it existed."""
        raise NotImplementedError

    def replace_if(self, name: str, data: bytes, etag: str) -> Optional[str]:
        """Overwrite ``name`` only if it still has ``etag``; the new etag, or None if it changed or vanished."""
        raise NotImplementedError

    def head(self, name: str) -> Optional[Meta]:
        raise NotImplementedError

    def list(self, prefix: str = "") -> list[Meta]:
        """Every complete object below this location (names relative to it, sorted)."""
        raise NotImplementedError

    def delete(self, name: str) -> None:
        """Remove ``name`` if present (callers delete only names their own records vouch for)."""
        raise NotImplementedError

    def upload(self, name: str, local: str | os.PathLike) -> str:
        """Copy a local file to ``name`` (multipart for large files; appears only when complete)."""
        raise NotImplementedError

    def download(self, name: str, local: str | os.PathLike) -> None:
        """Copy ``name`` to a local file, atomically (a partial download never lies under ``local``)."""
        raise NotImplementedError

    def exists(self, name: str) -> bool:
        return self.head(name) is not None

    def check(self) -> None:
        """Refuse, in one line naming the location, one that cannot be reached (missing credentials, wrong
        endpoint, missing bucket, access denied) before any work starts."""

    def __str__(self) -> str:
        return self.uri


# ---------------------------------------------------------------- local directories

class LocalLocation(Location):
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.uri = str(root)

    def join(self, *parts: str) -> "LocalLocation":
        return LocalLocation(self.root.joinpath(*parts))

    def path(self, name: str = "") -> Path:
        return self.root / name if name else self.root

    def read(self, name: str) -> bytes:
        return self.path(name).read_bytes()

    def _staged(self, name: str, data: bytes) -> Path:
        """``data`` in a synced temporary file beside ``name`` (mode as a normal new file)."""
        final = self.path(name)
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".tmp-{final.name}.", dir=final.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o666 & ~_umask())
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return Path(tmp)

    def write(self, name: str, data: bytes) -> str:
        tmp = self._staged(name, data)
        os.replace(tmp, self.path(name))
        fsync_dir(self.path(name).parent)
        return _etag(self.path(name))

    def create(self, name: str, data: bytes) -> Optional[str]:
        tmp = self._staged(name, data)
        try:
            os.link(tmp, self.path(name))  # fails if the name exists: complete and exclusive at once
        except FileExistsError:
            return None
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(self.path(name).parent)
        return _etag(self.path(name))

    def replace_if(self, name: str, data: bytes, etag: str) -> Optional[str]:
        final = self.path(name)
        dir_fd = os.open(final.parent, os.O_RDONLY)
        try:
            fcntl.flock(dir_fd, fcntl.LOCK_EX)  # compare and swap under the directory's flock
            if not final.is_file() or _etag(final) != etag:
                return None
            return self.write(name, data)
        finally:
            os.close(dir_fd)

    def head(self, name: str) -> Optional[Meta]:
        p = self.path(name)
        try:
            st = p.stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return Meta(name, st.st_size, _etag(p, st)) if p.is_file() else None

    def list(self, prefix: str = "") -> list[Meta]:
        base = self.path(prefix)
        if not base.is_dir():
            return []
        out = []
        for dirpath, _, files in os.walk(base):
            for f in files:
                p = Path(dirpath, f)
                rel = str(p.relative_to(self.root))
                if p.is_file() and not p.name.startswith(".tmp-"):  # a temporary is never a finished object
                    out.append(Meta(rel, p.stat().st_size, _etag(p)))
        return sorted(out, key=lambda m: m.name)

    def delete(self, name: str) -> None:
        self.path(name).unlink(missing_ok=True)

    def upload(self, name: str, local: str | os.PathLike) -> str:
        final = self.path(name)
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".tmp-{final.name}.", dir=final.parent)
        os.close(fd)
        try:
            shutil.copyfile(local, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, final)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return _etag(final)

    def download(self, name: str, local: str | os.PathLike) -> None:
        LocalLocation(Path(local).parent).upload(Path(local).name, self.path(name))

    def check(self) -> None:
        p = self.root
        while not p.exists() and p != p.parent:
            p = p.parent
        if p.exists() and not p.is_dir():
            raise UserError(f"{self.uri}: {p} is a file, not a directory")


def _etag(p: Path, st: os.stat_result | None = None) -> str:
    st = st or p.stat()
    return f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"  # changes with every replace (new inode)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ---------------------------------------------------------------- object stores (obstore)

def _not_found() -> tuple[type, ...]:
    import obstore.exceptions

    return (FileNotFoundError, obstore.exceptions.NotFoundError)  # obstore raises either, by call


class ObjectLocation(Location):
    def __init__(self, uri: str, store=None, prefix: str = ""):
        self.uri = uri.rstrip("/")
        self._store = store
        self.prefix = prefix.strip("/")

    @property
    def store(self):
        if self._store is None:
            self._store, self.prefix = _open_store(self.uri)
        return self._store

    def join(self, *parts: str) -> "ObjectLocation":
        rel = "/".join(p.strip("/") for p in parts if p)
        if self._store is None:
            return ObjectLocation(f"{self.uri}/{rel}")
        return ObjectLocation(f"{self.uri}/{rel}", self._store, f"{self.prefix}/{rel}".strip("/"))

    def key(self, name: str) -> str:
        self.store  # noqa: B018 - opening the store resolves the URI's prefix
        return f"{self.prefix}/{name}".strip("/") if name else self.prefix

    def read(self, name: str) -> bytes:
        import obstore

        with _errors(self, name):
            try:
                return bytes(obstore.get(self.store, self.key(name)).bytes())
            except _not_found():
                raise FileNotFoundError(errno.ENOENT, "no such object", f"{self.uri}/{name}") from None

    def write(self, name: str, data: bytes) -> str:
        import obstore

        with _errors(self, name):
            return obstore.put(self.store, self.key(name), data)["e_tag"] or ""

    def create(self, name: str, data: bytes) -> Optional[str]:
        import obstore

        with _errors(self, name):
            try:
                return obstore.put(self.store, self.key(name), data, mode="create")["e_tag"] or ""
            except obstore.exceptions.AlreadyExistsError:
                return None

    def replace_if(self, name: str, data: bytes, etag: str) -> Optional[str]:
        import obstore

        with _errors(self, name):
            try:
                return obstore.put(self.store, self.key(name), data, mode={"e_tag": etag})["e_tag"] or ""
            except (obstore.exceptions.PreconditionError, *_not_found()):
                return None

    def head(self, name: str) -> Optional[Meta]:
        import obstore

        with _errors(self, name):
            try:
                m = obstore.head(self.store, self.key(name))
            except _not_found():
                return None
        return Meta(name, int(m["size"]), m["e_tag"] or "")

    def list(self, prefix: str = "") -> list[Meta]:
        import obstore

        base = self.key(prefix)
        out = []
        with _errors(self, prefix):
            for chunk in obstore.list(self.store, prefix=f"{base}/" if base else None):
                for m in chunk:
                    rel = m["path"][len(self.prefix) + 1:] if self.prefix else m["path"]
                    out.append(Meta(rel, int(m["size"]), m["e_tag"] or ""))
        return sorted(out, key=lambda m: m.name)

    def delete(self, name: str) -> None:
        import obstore

        with _errors(self, name):
            try:
                obstore.delete(self.store, self.key(name))
            except _not_found():
                pass

    def upload(self, name: str, local: str | os.PathLike) -> str:
        import obstore

        with _errors(self, name):
            return obstore.put(self.store, self.key(name), Path(local), chunk_size=16 << 20)["e_tag"] or ""

    def download(self, name: str, local: str | os.PathLike) -> None:
        import obstore

        final = Path(local)
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".tmp-{final.name}.", dir=final.parent)
        try:
            with _errors(self, name), os.fdopen(fd, "wb") as f:
                try:
                    for chunk in obstore.get(self.store, self.key(name)).stream(min_chunk_size=8 << 20):
                        f.write(chunk)
                except _not_found():
                    raise FileNotFoundError(errno.ENOENT, "no such object", f"{self.uri}/{name}") from None
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def check(self) -> None:
        """A one-object listing (a HEAD would answer a missing bucket with a bare 404, like a missing key)."""
        import obstore

        with _errors(self, ""):
            try:
                next(iter(obstore.list(self.store, prefix=self.key("") or None, chunk_size=1)), None)
            except _not_found():
                raise UserError(f"{self.uri}: bucket not found") from None


_STATUS = re.compile(r"status code: (\d{3})\b")  # obstore: "Server returned non-2xx status code: 404 Not Found: ..."


def _open_store(uri: str):
    """(store at the bucket root, the URI's prefix): configuration from the standard AWS_* / GOOGLE_* /
    AZURE_* variables; ``AWS_ENDPOINT_URL`` names an S3-compatible store, plain http allowed for it.
    ``BERTFLOW_STORE_RETRY_S`` bounds how long a failing request is retried (obstore's default: 3 min)
    before the job stops with one line naming the object."""
    from obstore.store import from_url

    u = urlparse(uri)
    client = {"allow_http": True} if os.environ.get("AWS_ENDPOINT_URL", "").startswith("http://") else None
    kwargs = {}
    retry_s = os.environ.get("BERTFLOW_STORE_RETRY_S")
    if retry_s:
        from datetime import timedelta

        try:
            seconds = float(retry_s)
            if not 0 < seconds < 86400:
                raise ValueError
        except ValueError:
            raise UserError(f"BERTFLOW_STORE_RETRY_S={retry_s!r}: expected seconds between 0 and 86400") from None
        kwargs["retry_config"] = {"retry_timeout": timedelta(seconds=seconds)}
    if u.scheme == "s3":
        kwargs["credential_provider"] = _s3_credentials(uri)
    try:
        store = from_url(f"{u.scheme}://{u.netloc}", client_options=client, **kwargs)
    except Exception as err:  # noqa: BLE001 - obstore raises several types for a bad URL or config
        raise UserError(f"{uri}: cannot open the object store: {_first_line(err)}") from None
    return store, u.path.strip("/")


def _s3_credentials(uri: str):
    """None (obstore reads AWS_* variables, web identity, container credentials), or a boto3 session's
    provider for a named profile. Where none of those is set and the instance metadata service is switched
    off (``AWS_EC2_METADATA_DISABLED=true``), one line now instead of a failed request later."""
    env = os.environ
    if env.get("AWS_ACCESS_KEY_ID") or env.get("AWS_WEB_IDENTITY_TOKEN_FILE") or any(
            k.startswith("AWS_CONTAINER_CREDENTIALS") for k in env):
        return None
    profile_files = [Path(env.get("AWS_SHARED_CREDENTIALS_FILE", Path.home() / ".aws" / "credentials")),
                     Path(env.get("AWS_CONFIG_FILE", Path.home() / ".aws" / "config"))]
    if env.get("AWS_PROFILE") or any(f.is_file() for f in profile_files):
        try:
            import boto3
            from obstore.auth.boto3 import Boto3CredentialProvider
        except ImportError:
            raise UserError(f"{uri}: AWS profiles need boto3 (pip install boto3), or set AWS_ACCESS_KEY_ID and "
                            "AWS_SECRET_ACCESS_KEY") from None
        return Boto3CredentialProvider(boto3.Session())
    if env.get("AWS_EC2_METADATA_DISABLED", "").lower() == "true":
        raise UserError(f"{uri}: no credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)")
    return None


class _errors:
    """Turn the store's failures into one line naming the URI: credentials, endpoint, bucket, access."""

    def __init__(self, loc: ObjectLocation, name: str):
        self.where = f"{loc.uri}/{name}".rstrip("/")

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
        if err is None or isinstance(err, (FileNotFoundError, UserError)):
            return False
        import obstore.exceptions as ox

        text = _first_line(err)
        # Told by the status and the store's error code, never by words or digits anywhere in the line: it
        # also holds the URL (a port such as 40321), the elapsed time and the server's random request id.
        status = _STATUS.search(text)
        code = int(status.group(1)) if status else None
        # the client's own words: before any response, without the URL (a bucket or key may be any word)
        said = re.sub(r"\S+://\S+", "", text.split(" - Server returned", 1)[0]).lower()
        if isinstance(err, (ox.PermissionDeniedError, ox.UnauthenticatedError)) or code in (401, 403):
            why = "access denied (check the credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the profile)"
        elif "<Code>NoSuchBucket</Code>" in text or code == 404:  # a missing object is NotFoundError
            why = "bucket not found"
        elif code is None and any(w in said for w in ("connect", "dns error", "error sending request")):
            why = f"cannot reach the store's endpoint ({os.environ.get('AWS_ENDPOINT_URL') or 'the default'})"
        elif isinstance(err, ox.BaseError):
            why = text
        else:
            return False
        raise UserError(f"{self.where}: {why}") from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def location(path: str | os.PathLike) -> Location:
    """The Location of a user's path or URI (``file://`` and plain paths are local)."""
    text = str(path)
    if is_uri(text):
        return ObjectLocation(text)
    if text.startswith("file://"):
        text = urlparse(text).path
    return LocalLocation(text)

