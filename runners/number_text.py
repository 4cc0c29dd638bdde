"""Numbers spelled as actbench's C++ tools write and read them, and nothing else.

Python's int() and float() also take '١٢٣' and '１２' (other scripts' digits), '1_000',
' 7 ', '+5', 'inf' and 'nan'; layer_run's parsers (std::from_chars, runners/run_args.cpp)
take none of them. Every number runners/sweep.py and plots/ read from a plan or a CSV goes
through here, so a value is spelled the way layer_run spells it or it is named as bad.
Standard library only.

    integer("16", 1, 2**63 - 1) -> 16     integer("１６", 1, 10) -> None
    real("1.5e-3") -> 0.0015              real("1_000") -> None
    float32_text(0.1) -> "0.1"            float32_text(0.1234567) -> "0.1234567"
"""
import math
import re
import struct

# ASCII digits only (a character class, not \\d, which matches every script's digits).
_INTEGER = re.compile(r"-?[0-9]+")
_REAL = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
INT64_MAX = 2 ** 63 - 1
FLOAT32_DIGITS = 9  # enough significant digits for any float32 to read back as itself


def integer(text, lo, hi):
    """The whole text as a decimal integer in [lo, hi], else None."""
    if not isinstance(text, str) or not _INTEGER.fullmatch(text):
        return None
    digits = text.lstrip("-").lstrip("0")
    if len(digits) > len(str(max(abs(lo), abs(hi)))):
        return None  # out of range, and too long for int() to be asked
    value = int(text)
    return value if lo <= value <= hi else None


def real(text):
    """The whole text as a finite number, else None."""
    if not isinstance(text, str) or not _REAL.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def to_float32(x):
    """x rounded to the nearest float32 (as layer_run's static_cast<float> does), -0 as 0."""
    return struct.unpack("f", struct.pack("f", x))[0] + 0.0


def float32_text(x):
    """The one spelling of a float32 value: the shortest '%.{p}g' (p = 1..9) that reads back
    (text -> double -> float32, as layer_run reads --dropout) as the same value. layer_run
    writes its float columns with the same rule (runners/result_row.cpp, float32_text)."""
    x = to_float32(x)
    for p in range(1, FLOAT32_DIGITS + 1):
        text = "%.*g" % (p, x)
        if to_float32(float(text)) == x:
            return text
    return text
