"""`forge diagnose`: explain a failed build log from the command line."""

from __future__ import annotations

import argparse
from pathlib import Path

from builders.diagnose.diagnosis import CONFIDENCE_THRESHOLD, diagnose_log
from builders.diagnose.rules import load_rules

_EPILOG = f"""\
Each line that a rule in rules.yaml matches is scored
  confidence = weight x step x (0.5*severity + 0.3*position + 0.2*context)
from the rule's weight, how error-like the line is (warnings never decide), how close it is to the end of
the log and to the failing step's first error, and how many of the rule's supporting lines appear. The best
line wins; below {CONFIDENCE_THRESHOLD} the answer is 'unknown' and points at the first error instead.
Exit status is 0 whenever the log could be read, whatever the category (scripts read --json)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "diagnose",
        help="explain why a build failed, from its log",
        description="Find the decisive line of a failed build log and name its cause and remedy.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("logfile", metavar="LOGFILE", help="saved build log, or '-' to read standard input")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: category, line_number, line, cause, remedy, confidence, evidence, alternatives",
    )
    parser.add_argument(
        "--rules",
        type=Path,
        default=None,
        metavar="PATH",
        help="use this rule book instead of Forge's builders/diagnose/rules.yaml (to try a new rule)",
    )
    parser.set_defaults(func=run_diagnose)


def run_diagnose(args: argparse.Namespace) -> int:
    rules = load_rules(args.rules) if args.rules is not None else None
    diagnosis = diagnose_log(args.logfile, rules=rules)
    print(diagnosis.to_json() if args.json else diagnosis.render())
    return 0
