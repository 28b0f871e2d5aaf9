"""Explain a failed build from its log: the decisive line, a known cause and what to do about it."""

from __future__ import annotations

from builders.diagnose.diagnosis import (
    CONFIDENCE_THRESHOLD,
    Alternative,
    Diagnosis,
    diagnose_file,
    diagnose_text,
)
from builders.diagnose.rules import UNKNOWN, Rule, RuleBook, load_rules, parse_rules

__all__ = [
    "CONFIDENCE_THRESHOLD",
    "UNKNOWN",
    "Alternative",
    "Diagnosis",
    "Rule",
    "RuleBook",
    "diagnose_file",
    "diagnose_text",
    "load_rules",
    "parse_rules",
]
