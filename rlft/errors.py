"""Errors that end a run on purpose, with a message for the person running it (importable without torch)."""

from __future__ import annotations

import contextlib
import errno
from pathlib import Path


class TrainingHalted(RuntimeError):
    """The run stopped itself (non-finite values in a row, a stop signal, a failed write); the message says why and
    where to resume from. ``exit_code`` is what ``rlft`` exits with: 3, or 128 + the signal's number for a signal."""

    def __init__(self, message: str, exit_code: int = 3):
        super().__init__(message)
        self.exit_code = exit_code


class WriteFailed(TrainingHalted):
    """A file or directory of the run could not be written: a full disk (``ENOSPC``), a quota (``EDQUOT``), a
    read-only file system (``EROFS``), no permission (``EACCES``), a file size limit (``EFBIG``), or any other
    failed write. ``path`` names what failed; what was written before it is left as it was (checkpoints and
    directories are written whole into a temporary sibling, flushed to the disk and renamed, so a failed one
    leaves nothing)."""

    def __init__(self, path: str | Path, cause: BaseException, advice: str = ""):
        self.path, self.cause, self.advice = Path(path), cause, advice
        super().__init__(f"could not write {path}: {describe(cause)}" + (f". {advice}" if advice else ""))

    def advised(self, advice: str) -> "WriteFailed":
        """The same failure, with what to do about it (where to resume from) appended once."""
        return self if self.advice else WriteFailed(self.path, self.cause, advice)


def describe(e: BaseException) -> str:
    """A failed write's reason in one line: ``No space left on device [ENOSPC]``, or the library's first line
    (torch.save and safetensors do not raise OSError for a full disk)."""
    if isinstance(e, OSError) and e.errno:
        return f"{e.strerror or ''} [{errno.errorcode.get(e.errno, e.errno)}]".strip()
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"


@contextlib.contextmanager
def writing(path: str | Path, catch: type[BaseException] | tuple = OSError):
    """Turn an error of ``catch`` raised inside into :class:`WriteFailed` naming ``path``. Model and checkpoint
    writers pass ``catch=Exception``: torch.save reports a full disk as a RuntimeError, safetensors as its own
    error class."""
    try:
        yield
    except WriteFailed:
        raise
    except catch as e:
        raise WriteFailed(path, e) from e


def utf8_text(data: bytes, where: str, error: type[Exception], *, bom: bool = False) -> str:
    """``data`` decoded as UTF-8 (``bom``: a leading byte-order mark dropped); text that is not UTF-8 raises
    ``error`` naming ``where`` and the line of the first bad byte."""
    try:
        return data.decode("utf-8-sig" if bom else "utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise error(f"{where}: line {line}: not UTF-8 text ({e.reason} at byte {e.start})") from None
