#!/usr/bin/env python3
"""jsonschema_check.py — check JSON files against dspark's schemas (draft 2020-12).

Used by tests/shared/test_msg.c. Reads lines "SCHEMA<TAB>FILE<TAB>valid|invalid"
on stdin; a file that is not UTF-8 JSON counts as invalid. Prints one line per
file whose verdict differs from the expectation and exits 1 if there was any;
exits 2 if the validator itself is missing (python3-jsonschema).

Why python3-jsonschema: it is the reference implementation of JSON Schema for
Python, packaged in Debian main (bookworm: 4.10, draft 2020-12 supported) and
kept up to date there; check-jsonschema is not packaged in Debian 12.
"""
import json
import sys

try:
    from jsonschema import Draft202012Validator
except ImportError:
    print("jsonschema_check: python3-jsonschema is missing (deploy/install-deps.sh)", file=sys.stderr)
    sys.exit(2)


def reject_constant(name):
    raise ValueError("not JSON: " + name)  # NaN, Infinity: Python accepts them, JSON does not


def main():
    validators = {}
    failures = 0
    checked = 0
    for line in sys.stdin:
        line = line.rstrip("\n")
        if not line:
            continue
        schema_path, path, expect = line.split("\t")
        if schema_path not in validators:
            with open(schema_path, encoding="utf-8") as f:
                schema = json.load(f)
            Draft202012Validator.check_schema(schema)
            validators[schema_path] = Draft202012Validator(schema)
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.loads(f.read(), parse_constant=reject_constant)
            errors = sorted(validators[schema_path].iter_errors(doc), key=lambda e: list(e.path))
            verdict = "invalid" if errors else "valid"
            why = errors[0].message if errors else ""
        except (ValueError, UnicodeDecodeError) as e:
            verdict, why = "invalid", "unparseable: %s" % e
        checked += 1
        if verdict != expect:
            failures += 1
            print("%s: %s against %s, expected %s %s" % (path, verdict, schema_path, expect,
                                                          ("(" + why[:200] + ")") if why else ""))
    print("jsonschema_check: %d files, %d mismatches" % (checked, failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
