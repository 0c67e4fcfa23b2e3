"""How msgen puts a file on disk: staged beside its target, then renamed over it,
so no reader and no interrupt ever sees half a file; and only ever in place of a
regular file (never a device, a FIFO or a folder). And how it takes one in: only a
regular file, and only up to a limit."""

from __future__ import annotations

import errno
import os
import signal
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path

from msgen.base.status import UsageError
from msgen.diagnostics import format_bytes

STAGED = ".msgen-new"  # the suffix of a staged file; a run that dies leaves it behind


class NotAFile(OSError):
    """The path exists and is not a regular file: msgen will not replace it."""


def new_file_mode(executable: bool = False) -> int:
    """The mode `open()` gives a new file under the current umask (and `chmod +x`'s
    for scripts)."""
    mask = os.umask(0)
    os.umask(mask)
    return (0o777 if executable else 0o666) & ~mask


def stage(path: Path, text: str, mode: int) -> Path:
    """Write `text` to a new file beside `path`; the caller renames it into place."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=STAGED)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.chmod(tmp, mode)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def write_file(path: Path, text: str) -> None:
    """Replace the regular file `path` (or create it) atomically. A symlink is
    followed to its target, which keeps the link; an existing file keeps its mode."""
    target = path.resolve() if path.is_symlink() else path
    try:
        st = target.stat()
    except FileNotFoundError:
        mode = new_file_mode()
    else:
        if not stat.S_ISREG(st.st_mode):
            raise NotAFile(f"{path} is not a regular file")
        mode = stat.S_IMODE(st.st_mode)
    tmp = stage(target, text, mode)
    try:
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def interrupts_deferred(signals=(signal.SIGINT,)):
    """Ctrl-C (or any of `signals`) while files are switched into place takes effect
    after they are."""
    caught = []
    try:
        previous = {s: signal.signal(s, lambda *a: caught.append(a)) for s in signals}
    except ValueError:  # not the main thread: signals go elsewhere anyway
        yield
        return
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if caught and callable(previous[caught[0][0]]):
            previous[caught[0][0]](*caught[0])


def write_output(option: str, name: str, spec: Path, text: str) -> None:
    """A command's `option FILE`: FILE written as write_file does, never the spec the
    command read; a failure is a usage error naming the file."""
    path = Path(name)
    if path.exists() and spec.exists() and path.samefile(spec):
        raise UsageError(f"{option} {name} is the spec itself; name another file")
    try:
        write_file(path, text)
    except OSError as exc:
        raise UsageError(f"cannot write {name}: {exc.strerror or exc}") from exc


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; OSError for anything
    else (a FIFO is not waited on, a device not read from, a huge file not loaded)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {format_bytes(limit)}")
    return data
