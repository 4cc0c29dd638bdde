"""The results CSV, read and appended in one place: the Python side of runtime/csv.hpp.

Shared by runners/sweep.py, runners/gpu_eval.py and plots/ (standard library only).

A row is whole exactly when its "\\n" is in the file (layer_run's rows are one line each):
whatever follows the last "\\n" is an unfinished last row (being written, or its writer was
killed). read() names it and never returns it as a row; append_row() cuts it away before
appending. Fields hold at most MAX_FIELD_BYTES bytes (runtime/csv.hpp's kMaxCsvFieldBytes, read
from runners/facts.json): the writers refuse a longer one and read() names it.

read() names every malformed line instead of skipping it: a half-written row left inside the
file by an older version, two rows glued into one, bytes that are not UTF-8, a runaway field.
Each physical line is parsed on its own, so one bad line never swallows the rows after it (a
quoted field, as other programs write it, may still span lines when the joined record has the
header's field count).

    header, rows, problems = read(path)
    rows:     [(line_number, [field, ...])]  with exactly len(header) fields each
    problems: [(line_number, "what is wrong")]  (line 1 is the header)

    check_appendable(path, header)   # what layer_run decides before appending to path
    append_row(path, header, row)    # as layer_run appends a row
    drop_unfinished_row(path)        # cuts away an unfinished last row
"""
import csv
import fcntl
import io
import json
import os
import stat
import sys

import user_files

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "facts.json")) as _facts_file:
    MAX_FIELD_BYTES = json.load(_facts_file)["csv_max_field_bytes"]
MAX_RECORD_LINES = 64     # how far a quoted field may run over newlines before the line is malformed
UNFINISHED = "an unfinished last row (being written, or its writer was killed)"
# Let csv hand over long fields whole: they are named below, not fatal to the whole file.
csv.field_size_limit(max(csv.field_size_limit(), 1 << 30))


class BadFile(Exception):
    """The file cannot be read at all (missing, unreadable, no usable header), or appended to.
    The message does not name the file: its caller does."""


def _parse(text):
    """([fields], None) or (None, why) for one record's text; 'open quote' when it ends inside quotes."""
    try:
        rows = list(csv.reader([text], strict=True))
    except csv.Error as e:
        if "unexpected end of data" in str(e):
            return None, "open quote"
        if "new-line character" in str(e):
            return None, "a line break (carriage return) inside an unquoted field"
        if "expected after" in str(e):
            return None, "text right after a closing quote (two rows glued together?)"
        return None, f"not CSV ({e})"
    return (rows[0] if rows else []), None


def _byte_length(value):
    return len(value.encode("utf-8", "surrogateescape"))


def _field_problem(fields):
    for i, v in enumerate(fields):
        if any("\udc80" <= ch <= "\udcff" for ch in v):
            bad = next(ch for ch in v if "\udc80" <= ch <= "\udcff")
            return f"bytes that are not UTF-8 (0x{ord(bad) - 0xdc00:02x} in field {i + 1})"
        if "\x00" in v:
            return f"NUL bytes in field {i + 1}"
        if len(v) > MAX_FIELD_BYTES // 4 and _byte_length(v) > MAX_FIELD_BYTES:  # 4: UTF-8's widest character
            return f"field {i + 1} is {_byte_length(v)} bytes long (at most {MAX_FIELD_BYTES})"
    return None


def _count_problem(n, expected):
    why = "two rows glued together?" if n > expected else "a half-written row?"
    return f"{n} fields where the header has {expected} ({why})"


def _read_bytes(path):
    try:
        return user_files.read_bytes(path, path)
    except user_files.UserFileError as e:
        raise BadFile(str(e).removeprefix(f"{path}: "))  # the caller names the file


def _header(line):
    """The column names of a header line (its line end taken off); BadFile when it is none."""
    if not line.strip():
        raise BadFile("empty (no header line)")
    header, why = _parse(line)
    if header is None:
        raise BadFile(f"line 1 (the header): {why}")
    why = _field_problem(header)
    if why:
        raise BadFile(f"line 1 (the header): {why}")
    if len(set(header)) != len(header) or any(not h for h in header):
        raise BadFile("line 1 (the header): empty or repeated column names")
    return header


def read(path):
    data = _read_bytes(path)
    whole = data.rfind(b"\n") + 1  # the whole rows end at the last line end
    if whole == 0:
        raise BadFile(f"no whole header line: {UNFINISHED}" if data.strip() else "empty (no header line)")
    lines = data[:whole].decode("utf-8", errors="surrogateescape").split("\n")
    lines.pop()  # the last row's line end
    lines = [l[:-1] if l.endswith("\r") else l for l in lines]
    header = _header(lines[0])
    rows, problems = [], []
    i = 1
    while i < len(lines):
        line_no = i + 1
        if not lines[i].strip():
            i += 1  # a blank line holds no data
            continue
        fields, why = _parse(lines[i])
        end = i
        if why == "open quote":
            # A quoted field with line ends in it: join lines while the record stays open.
            joined = lines[i]
            for j in range(i + 1, min(len(lines), i + MAX_RECORD_LINES)):
                joined += "\n" + lines[j]
                fields, why = _parse(joined)
                if why != "open quote":
                    end = j
                    break
            if why is not None or len(fields) != len(header):
                fields, why, end = None, "an opened quote is never closed (a half-written row?)", i
        if fields is not None and why is None:
            why = _field_problem(fields)
            if why is None and len(fields) != len(header):
                why = _count_problem(len(fields), len(header))
        if why:
            problems.append((line_no, why))
        else:
            rows.append((line_no, fields))
        i = end + 1
    if data[whole:].strip():
        problems.append((len(lines) + 1, UNFINISHED))
    return header, rows, problems


def summarize(path, problems, limit=5):
    """Lines 'PATH:LINE: problem', at most limit of them plus one saying how many more."""
    out = [f"{path}:{line}: {why}" for line, why in problems[:limit]]
    if len(problems) > limit:
        rest = [str(line) for line, _ in problems[limit:]]
        shown = ", ".join(rest[:10]) + (", ..." if len(rest) > 10 else "")
        out.append(f"{path}: {len(rest)} more malformed lines ({shown})")
    return out


# ---- appending: the same decisions, in the same words, as runtime/csv.cpp ----

def _csv_line(fields):
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(fields)
    return buf.getvalue().encode("utf-8", "surrogateescape")


def _header_problem(first, header_line):
    """None when a file whose first line is `first` (b"\\n" included when it has one) can take
    rows under header_line: the same line, byte for byte, or one its writer was killed in the
    middle of (no line end yet, a prefix of ours: it is written again). Else why not."""
    if not first or first == header_line:
        return None
    if not first.endswith(b"\n") and header_line.startswith(first):
        return None
    if first.endswith(b"\r\n") and first[:-2] + b"\n" == header_line:
        return "has this header, but its line ends differ (\\r\\n where rows end in \\n); use a new file"
    return "has a different header (written by another version?); use a new file"


def check_appendable(path, header):
    """What CsvAppender::check decides before layer_run appends to path, in its words: False
    when path holds nothing to keep yet (missing, empty, or only an unfinished header line),
    True when its header line is this header's, byte for byte; BadFile when no row may be
    appended to it (not a regular file, not writable, another header or other line ends; a
    header line that is no header at all, e.g. not UTF-8, is named as read() names it)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        folder = os.path.dirname(path) or "."
        if not (os.path.isdir(folder) and os.access(folder, os.W_OK | os.X_OK)):
            raise BadFile(f"cannot be written: '{folder}' is not a writable directory")
        return False
    except OSError as e:
        raise BadFile(f"cannot read ({e.strerror or e})")
    if not stat.S_ISREG(st.st_mode):
        raise BadFile("is not a regular file")
    if not os.access(path, os.W_OK):
        raise BadFile("is not writable")
    header_line = _csv_line(header)
    with open(path, "rb") as f:
        first = f.readline(len(header_line) + 1)
    why = _header_problem(first, header_line)
    if why and first.endswith(b"\n"):
        _header(first.decode("utf-8", errors="surrogateescape").rstrip("\r\n"))  # an unreadable one: say why
    if why:
        raise BadFile(why)
    return first.endswith(b"\n")


def _check_field_length(name, value):
    n = _byte_length(value)
    if n > MAX_FIELD_BYTES:
        raise BadFile(f"CSV field '{name}' is {n} bytes long; a CSV field holds at most {MAX_FIELD_BYTES}")


def _first_line(fd, limit):
    """The file's first line, its b"\n" included, or its first `limit` bytes without one."""
    data = os.pread(fd, limit, 0)
    end = data.find(b"\n")
    return data if end < 0 else data[:end + 1]


def _whole_rows_end(fd):
    """Just after the file's last line end (0 without one)."""
    end = os.fstat(fd).st_size
    while end > 0:
        start = max(0, end - (1 << 16))
        last = os.pread(fd, end - start, start).rfind(b"\n")
        if last >= 0:
            return start + last + 1
        end = start
    return 0


def _cut_unfinished_row(fd, path):
    """Cuts what follows the last line end (held under the lock, no writer is mid-row: it was
    left by a killed one), saying so once. Returns where the file now ends."""
    whole, size = _whole_rows_end(fd), os.fstat(fd).st_size
    if whole < size:
        print(f"actbench: warning: CSV '{path}': removed an unfinished last row ({size - whole} bytes; its writer "
              f"stopped mid-row)", file=sys.stderr)
        os.ftruncate(fd, whole)
    return whole


def _append_all(fd, data):
    """Appends all of data (fd is O_APPEND) and syncs it; a write that fails part-way (a full
    disk) is taken back, and the OSError says so."""
    before = os.fstat(fd).st_size
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            if n == 0:
                raise OSError(5, os.strerror(5))  # EIO: a regular file that takes nothing
            view = view[n:]
        os.fsync(fd)
    except OSError as e:
        os.ftruncate(fd, before)
        raise OSError(e.errno, f"{e.strerror or e} (the file is left as it was)") from e


def append_row(path, header, row):
    """Appends row under an exclusive lock, as CsvAppender::append does: an unfinished last
    row is cut away first, the header goes first into a file without a whole line, and the row
    is written whole or not at all (OSError, the file as it was). BadFile for a field longer
    than MAX_FIELD_BYTES, or a file without a whole line that is not our header cut short.
    Unlike layer_run it takes fields with line breaks (other programs' CSVs, merged by
    gpu_eval) and leaves the header of a file with whole lines to its caller (check_appendable
    for layer_run's CSVs; gpu_eval compares parsed headers)."""
    for name, value in zip(header, row):
        _check_field_length(name, value)
    header_line = _csv_line(header)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if _whole_rows_end(fd) == 0:
            why = _header_problem(_first_line(fd, len(header_line) + 1), header_line)
            if why:
                raise BadFile(why)
        whole = _cut_unfinished_row(fd, path)
        _append_all(fd, (header_line if whole == 0 else b"") + _csv_line(row))
    finally:
        os.close(fd)


def drop_unfinished_row(path):
    """Cuts away an unfinished last row after the file's first whole line, so that it ends with
    a whole row. A file without a whole line is left to append_row, which knows the header."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
        fcntl.flock(fd, fcntl.LOCK_EX)
        if _whole_rows_end(fd) > 0:
            _cut_unfinished_row(fd, path)
    finally:
        os.close(fd)
