"""The demo package: its Python answer and its compiled one, so a test can tell which layer an edit reached."""

from demo._native import scale

GREETING = "hello"


def answer() -> str:
    return f"{GREETING} {scale(21)}"
