"""Every file a user names (a plan, a results CSV, a config) is opened here.

The Python side of runtime/user_file.hpp: a path that is not a regular file (a folder, a
FIFO, a device, a socket) is refused before anything reads from it, so no script can block
forever on a FIFO nobody writes. Standard library only.

    data = read_bytes("--plan plan.json", path)      # bytes, or raises UserFileError
    check_file("--csv out.csv", path, must_exist=False)
"""
import errno
import os
import stat

MAX_USER_FILE_BYTES = 1 << 30  # as runtime/user_file.hpp: a bigger file is a wrong path, not input


class UserFileError(Exception):
    """One line naming the path's role and what is wrong with it."""


def _kind(mode):
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _why(e):
    return f"cannot read ({e.strerror or e})"


def check_file(what, path, must_exist=True):
    """Raises UserFileError when path exists and is not a regular file (or is missing and must_exist)."""
    if not path:
        raise UserFileError(f"{what}: an empty file name")
    try:
        st = os.stat(path)
    except OSError as e:
        if e.errno == errno.ENOENT and not must_exist:
            return
        raise UserFileError(f"{what}: {_why(e)}")
    if not stat.S_ISREG(st.st_mode):
        raise UserFileError(f"{what}: is {_kind(st.st_mode)}, not a file")


def read_bytes(what, path, max_bytes=MAX_USER_FILE_BYTES):
    """The whole regular file; UserFileError for anything else (never blocks on a FIFO)."""
    if not path:
        raise UserFileError(f"{what}: an empty file name")
    try:
        # O_NONBLOCK: a FIFO with no writer opens at once instead of waiting; fstat names it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise UserFileError(f"{what}: {_why(e)}")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UserFileError(f"{what}: is {_kind(st.st_mode)}, not a file")
        if st.st_size > max_bytes:
            raise UserFileError(f"{what}: is {st.st_size} bytes, more than the {max_bytes} bytes such a file can sensibly hold")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > max_bytes:
                raise UserFileError(f"{what}: grew past {max_bytes} bytes while being read")
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as e:
        raise UserFileError(f"{what}: {_why(e)}")
    finally:
        os.close(fd)


def read_text(what, path, max_bytes=MAX_USER_FILE_BYTES):
    """read_bytes decoded as UTF-8; bytes that are not UTF-8 are a UserFileError."""
    data = read_bytes(what, path, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserFileError(f"{what}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})")
