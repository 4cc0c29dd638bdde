"""Reads a results CSV line by line and names every malformed line instead of skipping it.

Shared by runners/sweep.py and plots/ (standard library only). layer_run appends one whole
row per write, but a file can still hold a half-written last line (a killed writer, a
truncated copy), two rows glued into one, bytes that are not UTF-8 or a runaway field. Each
physical line is parsed on its own, so one bad line never swallows the rows after it (a
quoted field may still span lines when the joined record has the header's field count).

    header, rows, problems = read(path)
    rows:     [(line_number, [field, ...])]  with exactly len(header) fields each
    problems: [(line_number, "what is wrong")]  (line 1 is the header)
"""
import csv

MAX_FIELD_CHARS = 131072  # layer_run's longest field (the command line) is far shorter
MAX_RECORD_LINES = 64     # how far a quoted field may run over newlines before the line is malformed
# Let csv hand over long fields whole: they are named below, not fatal to the whole file.
csv.field_size_limit(max(csv.field_size_limit(), 1 << 30))


class BadFile(Exception):
    """The file cannot be read at all (missing, unreadable, no usable header)."""


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


def _field_problem(fields):
    for i, v in enumerate(fields):
        if any("\udc80" <= ch <= "\udcff" for ch in v):
            bad = next(ch for ch in v if "\udc80" <= ch <= "\udcff")
            return f"bytes that are not UTF-8 (0x{ord(bad) - 0xdc00:02x} in field {i + 1})"
        if "\x00" in v:
            return f"NUL bytes in field {i + 1}"
        if len(v) > MAX_FIELD_CHARS:
            return f"field {i + 1} is {len(v)} characters long (at most {MAX_FIELD_CHARS})"
    return None


def _count_problem(n, expected):
    why = "two rows glued together?" if n > expected else "a half-written row?"
    return f"{n} fields where the header has {expected} ({why})"


def read(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise BadFile(f"cannot read: {e.strerror or e}")
    text = data.decode("utf-8", errors="surrogateescape")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the last row's line end
    lines = [l[:-1] if l.endswith("\r") else l for l in lines]
    if not lines or not lines[0].strip():
        raise BadFile("empty (no header line)")
    header, why = _parse(lines[0])
    if header is None:
        raise BadFile(f"line 1 (the header): {why}")
    why = _field_problem(header)
    if why:
        raise BadFile(f"line 1 (the header): {why}")
    if len(set(header)) != len(header) or any(not h for h in header):
        raise BadFile("line 1 (the header): empty or repeated column names")
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
    return header, rows, problems


def summarize(path, problems, limit=5):
    """Lines 'PATH:LINE: problem', at most limit of them plus one saying how many more."""
    out = [f"{path}:{line}: {why}" for line, why in problems[:limit]]
    if len(problems) > limit:
        rest = [str(line) for line, _ in problems[limit:]]
        shown = ", ".join(rest[:10]) + (", ..." if len(rest) > 10 else "")
        out.append(f"{path}: {len(rest)} more malformed lines ({shown})")
    return out
