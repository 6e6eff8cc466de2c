"""What the benchmarks share: their command line and how they report."""

import argparse
import statistics


def summary(samples):
    return {"median": statistics.median(samples), "min": min(samples),
            "max": max(samples), "samples": samples}


def mark(ok):
    return "PASS" if ok else "MISS"


def parse_args(argv, description, rounds_help, tmpdir_help):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=30,
                        help=f"{rounds_help} (default: 30).")
    parser.add_argument("--json", metavar="FILE", help="Also write the numbers to FILE.")
    parser.add_argument("--tmpdir", metavar="DIR", help=tmpdir_help)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args
