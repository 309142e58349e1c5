#!/usr/bin/env python3
"""Writes the key tables of docs/configuration.md from `train --help_markdown`, or with --check
says whether they are current (exit 1 and a diff when not).

    scripts/dev/config_reference.py [--check] [--train build/train]
"""
import argparse
import difflib
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"
BEGIN, END = "<!-- BEGIN train --help_markdown -->\n", "<!-- END train --help_markdown -->\n"


def with_tables(doc, tables):
    head, rest = doc.split(BEGIN, 1)
    return head + BEGIN + tables + END + rest.split(END, 1)[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--train", type=pathlib.Path, default=ROOT / "build" / "train")
    args = parser.parse_args()
    tables = subprocess.run([str(args.train), "--help_markdown"], capture_output=True, text=True,
                            check=True, timeout=60).stdout
    doc = DOC.read_text()
    updated = with_tables(doc, tables)
    if not args.check:
        DOC.write_text(updated)
        return 0
    if updated == doc:
        return 0
    sys.stdout.writelines(difflib.unified_diff(doc.splitlines(True), updated.splitlines(True),
                                               str(DOC), "train --help_markdown"))
    print(f"{DOC} is not what `train --help_markdown` prints: run scripts/dev/config_reference.py")
    return 1


if __name__ == "__main__":
    sys.exit(main())
