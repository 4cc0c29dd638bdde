#!/usr/bin/env python3
"""Prints layer_run CSVs as a table: measured activation bytes against Table 2, and times.

    python3 tools/summarize.py FILE.csv [FILE.csv ...]
Standard library only.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runners"))
import results_csv  # noqa: E402  (whole rows only: never an unfinished last row)


def gib(v):
    return "%.3f" % (int(v) / 2 ** 30) if v else "-"


def main(paths):
    cols = ["backend", "model", "tp", "config", "attention", "act_GiB", "formula_GiB", "match", "fwd_ms", "bwd_ms", "status"]
    rows = []
    for path in paths:
        try:
            header, file_rows, problems = results_csv.read(path)
        except results_csv.BadFile as e:
            sys.exit("summarize.py: error: %s: %s" % (path, e))
        for line in results_csv.summarize(path, problems):
            print("summarize.py: warning: %s" % line, file=sys.stderr)
        for _, fields in file_rows:
            r = dict(zip(header, fields))
            match = "-"
            if r["act_bytes"]:
                match = "yes" if float(r["act_bytes"]) == float(r["act_bytes_formula"]) else "NO"
            rows.append([r["backend"], r["model"], r["tp"], r["config"], r.get("attention") or "unfused",
                         gib(r["act_bytes"]),
                         gib(float(r["act_bytes_formula"])), match, r["fwd_ms"] or "-", r["bwd_ms"] or "-",
                         r["status"]])
    widths = [max(len(str(x)) for x in col) for col in zip(cols, *rows)]
    for line in [cols] + rows:
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
