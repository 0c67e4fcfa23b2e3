"""How every checkpoint writer (merge's file; reshard's, from-hf's and to-hf's folders)
puts its output on disk, as `compile` puts a tree (msgen.base.tree): all of it or
none of it, and nothing it does not own.

- Exclusive: the writer holds `fcntl.flock` on `.<name>.msgen-lock` beside the output
  for as long as it runs; a second writer of the same output is refused at once. The
  kernel releases the lock when its holder dies, even by `kill -9`: the file a killed
  writer leaves is no lock, and the next writer takes it (and removes it when done).
- Staged: the new output is built in `.<name>.msgen-new-XXXXXXXX` beside it (the same
  file system) and switched in by renaming: the old folder set aside as
  `.<name>.msgen-old`, the new one renamed into place, the old one removed. A writer
  killed at any point leaves the old output or the new one, and scratch that the next
  writer of that output removes before it starts (only these names, only for its own
  output); a kill between the two renames leaves the old output set aside, and it comes
  back.
- Replacing (`--force`): the entries of the form the writer writes go, all of them (a
  rank folder wholly: the run's steps, log and strategy file; every safetensors shard
  and the index); other entries are carried into the new folder by hard link, so
  nothing of the user's is lost. A rank folder holding a file neither train.py nor msgen
  writes is refused by name (it is the user's: `step_best.ckpt`).
- Never through a link: an output that is a symbolic link is refused; a link inside the
  old output is removed as a link (its target is never read or written).
- Never over its input: an output inside the folder it reads (or holding it) is refused.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import stat
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from msgen.base.files import interrupts_deferred, new_file_mode
from msgen.base.status import UsageError
from msgen.diagnostics import printable

LOCK = ".msgen-lock"
NEW = ".msgen-new-"
OLD = ".msgen-old"
_RANDOM = re.compile(r"[a-z0-9_]{8}")  # tempfile.mkdtemp's random part
# What train.py and msgen write in a rank folder (train.py's templates: run_folder,
# checkpoint, provenance, build; msgen.ckpt.runs): removed with the rank folder.
RANK_FILES = re.compile(
    r"step_[0-9]+\.ckpt|model\.ckpt|strategy\.json|log\.csv|run\.json(\.partial)?"
    r"|rehearsal\.json|profile|\.model\.ckpt\.msgen-new",
    re.ASCII,
)


@dataclass(frozen=True)
class Forms:
    """What a writer owns in its output folder: the top-level names it replaces."""

    command: str  # "ckpt reshard", for its messages
    names: re.Pattern


RUN_FORMS = re.compile(r"rank_[0-9]+|model\.ckpt|source\.json", re.ASCII)
HF_FORMS = re.compile(
    r"model\.safetensors|model-[0-9]+-of-[0-9]+\.safetensors|model\.safetensors\.index\.json"
    r"|config\.json",
    re.ASCII,
)


@dataclass(frozen=True)
class Claim:
    """The held output: build the new one at `staged` (a folder, or merge's file),
    with `work` for anything else; both vanish unless switched in."""

    output: Path
    staged: Path
    work: Path


def _shown(path: Path) -> str:
    return printable(str(path))


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def refuse_overlap(output: Path, inputs: dict[str, Path]) -> None:
    """An output inside an input, or holding one (each by its real path): refused."""
    out = output.resolve()
    for option, source in inputs.items():
        real = source.resolve()
        if out == real:
            raise UsageError(f"-o {_shown(output)} is {option} itself: name another output")
        if _inside(out, real):
            raise UsageError(
                f"-o {_shown(output)} is inside {option} {_shown(source)}: "
                "writing there would change what is read; name another output"
            )
        if _inside(real, out):
            raise UsageError(
                f"-o {_shown(output)} holds {option} {_shown(source)}: "
                "replacing it would destroy what is read; name another output"
            )


@contextmanager
def _lock(output: Path):
    path = output.with_name(f".{output.name}{LOCK}")
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UsageError(
                f"-o {_shown(output)} is being written by another msgen (it holds "
                f"{_shown(path)}): wait for it to finish, or name another output"
            ) from None
        try:
            same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # its holder removed it as we opened it: lock the new one
    try:
        yield
    finally:
        try:
            os.unlink(path)  # while held: a writer that opened this file retries, as above
        except FileNotFoundError:
            pass
        os.close(fd)


def _scratch(output: Path) -> list[Path]:
    """This output's scratch beside it: staged folders of killed writers."""
    prefix = f".{output.name}{NEW}"
    return [
        p
        for p in output.parent.iterdir()
        if p.name.startswith(prefix) and _RANDOM.fullmatch(p.name[len(prefix) :])
    ]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _recover(output: Path) -> None:
    """Undo what a killed writer of `output` left: the old output it had set aside
    comes back (or goes, when the new one is in place), its scratch goes."""
    old = output.with_name(f".{output.name}{OLD}")
    if os.path.lexists(old):
        if os.path.lexists(output):
            _remove(old)
        else:
            os.replace(old, output)
    for path in _scratch(output):
        _remove(path)


def _foreign(output: Path, forms: Forms) -> list[Path]:
    """The top-level entries of the old output folder that are not the writer's; a
    rank folder holding a file that is not a run's is refused, naming it."""
    kept = []
    for entry in sorted(output.iterdir()):
        if not forms.names.fullmatch(entry.name):
            kept.append(entry)
        elif entry.is_dir() and not entry.is_symlink() and entry.name.startswith("rank_"):
            theirs = sorted(p.name for p in entry.iterdir() if not RANK_FILES.fullmatch(p.name))
            if theirs:
                raise UsageError(
                    f"-o {_shown(output)}: {_shown(entry / theirs[0])} is not a file train.py "
                    f"or msgen writes, and {forms.command} --force would remove it with "
                    f"{entry.name}: move it away, or name another output"
                )
    return kept


def _carry(entries: list[Path], into: Path) -> None:
    """The user's entries, hard-linked into the new folder (copied where the file
    system will not link); links stay links."""

    def link(src, dst):
        try:
            os.link(src, dst, follow_symlinks=False)
        except OSError:
            shutil.copy2(src, dst, follow_symlinks=False)

    for entry in entries:
        target = into / entry.name
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, target, symlinks=True, copy_function=link)
        else:
            link(entry, target)


def check_output(output: Path, force: bool, folder: bool) -> None:
    """What may be replaced at all: not a link; a folder for a folder, a file for a
    file; a non-empty one only with --force."""
    if output.is_symlink():
        raise UsageError(f"-o {_shown(output)} is a symbolic link (msgen never writes through one)")
    if not output.exists():
        return
    if folder and not output.is_dir():
        raise UsageError(f"-o {_shown(output)} is not a folder")
    if not folder and not output.is_file():
        what = "a folder" if output.is_dir() else "not a regular file"
        raise UsageError(f"-o {_shown(output)} is {what}; it writes one checkpoint file")
    if force:
        return
    if not folder:
        raise UsageError(f"-o {_shown(output)} exists; add --force to replace it")
    if any(output.iterdir()):
        raise UsageError(f"-o {_shown(output)} is not empty; add --force to replace it")


@contextmanager
def claim(output: Path, inputs: dict[str, Path], force: bool, forms: Forms | None):
    """Hold `output` for one writer and yield a Claim; on a normal exit the staged
    output is switched in. `forms` None: the output is one file (merge's)."""
    folder = forms is not None
    place = Path(os.path.abspath(output))  # a name to stage beside, even for `-o .`
    if not place.name:
        raise UsageError(f"-o {_shown(output)}: msgen does not replace the root folder")
    place.parent.mkdir(parents=True, exist_ok=True)
    with _lock(place):
        _recover(place)
        check_output(output, force, folder)
        refuse_overlap(output, inputs)
        kept = _foreign(output, forms) if folder and output.is_dir() else []
        scratch = Path(tempfile.mkdtemp(prefix=f".{place.name}{NEW}", dir=place.parent))
        try:
            staged = scratch / "output"
            if folder:
                staged.mkdir()
                if output.is_dir():  # a replaced folder keeps its mode (shared, private)
                    os.chmod(staged, stat.S_IMODE(output.stat().st_mode))
            (scratch / "work").mkdir()
            yield Claim(output, staged, scratch / "work")
            if folder:
                _carry(kept, staged)
            _switch(staged, place, folder)
        finally:
            _remove(scratch)


def _switch(staged: Path, output: Path, folder: bool) -> None:
    with interrupts_deferred():
        if not folder:  # a replaced file keeps its mode, as msgen's write_file does
            mode = stat.S_IMODE(output.stat().st_mode) if output.exists() else new_file_mode()
            os.chmod(staged, mode)
            os.replace(staged, output)
            return
        old = output.with_name(f".{output.name}{OLD}")
        if output.exists():
            os.replace(output, old)
        os.replace(staged, output)
    if os.path.lexists(old):
        _remove(old)
