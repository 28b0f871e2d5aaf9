"""Just enough of the CMake language to read vLLM's gates: commands with their lines, and `if()` nesting.

A gate in CMake is a `message(FATAL_ERROR ...)` under some `if()`; to cite it and to know when it applies we
need the command's line, the message text and every enclosing condition with its polarity. Evaluating CMake
is out of scope: conditions are split into terms (`A OP B`, or a bare word) that know whether a NOT covers them.
"""

from __future__ import annotations

from dataclasses import dataclass

# Binary tests of CMake's if(); everything binds tighter than NOT, which binds tighter than AND/OR.
BINARY_OPS = frozenset(
    {
        "STREQUAL",
        "STRLESS",
        "STRGREATER",
        "STRLESS_EQUAL",
        "STRGREATER_EQUAL",
        "MATCHES",
        "EQUAL",
        "LESS",
        "GREATER",
        "LESS_EQUAL",
        "GREATER_EQUAL",
        "VERSION_EQUAL",
        "VERSION_LESS",
        "VERSION_GREATER",
        "VERSION_LESS_EQUAL",
        "VERSION_GREATER_EQUAL",
        "IN_LIST",
        "IS_NEWER_THAN",
        "PATH_EQUAL",
    }
)
UNARY_OPS = frozenset({"DEFINED", "EXISTS", "COMMAND", "POLICY", "TARGET", "TEST", "IS_DIRECTORY", "IS_ABSOLUTE"})
LOGIC = frozenset({"AND", "OR", "NOT", "(", ")"})


@dataclass(frozen=True)
class Token:
    text: str
    quoted: bool


@dataclass(frozen=True)
class Command:
    name: str  # lower-cased: CMake command names are case-insensitive
    args: tuple[Token, ...]
    line: int

    def words(self) -> list[str]:
        return [a.text for a in self.args]


@dataclass(frozen=True)
class Term:
    """One test inside a condition: `left op right`, or a bare `left` when op is None."""

    left: str
    op: str | None
    right: str | None
    negated: bool

    def flipped(self) -> Term:
        return Term(self.left, self.op, self.right, not self.negated)


@dataclass(frozen=True)
class Branch:
    """The branch of one enclosing if() a command sits in."""

    condition: tuple[Term, ...]
    line: int
    # In elseif/else branches: the conditions of the earlier branches, which were false to get here.
    earlier: tuple[tuple[Term, ...], ...]

    def effective_terms(self) -> list[Term]:
        """Terms known to hold in this branch. Earlier branches count only when they were a single term,
        because negating `A AND B` does not negate each of A and B."""
        terms = list(self.condition)
        for cond in self.earlier:
            if len(cond) == 1:
                terms.append(cond[0].flipped())
        return terms


@dataclass(frozen=True)
class Located:
    command: Command
    branches: tuple[Branch, ...]  # outermost first

    def terms(self) -> list[Term]:
        return [t for b in self.branches for t in b.effective_terms()]


def tokenize(text: str) -> list[Command]:
    """Split a CMake file into commands. Comments (line and bracket) are dropped; quoted args keep their text."""
    commands: list[Command] = []
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif c == "#":
            i, line = _skip_comment(text, i, line)
        elif c.isalpha() or c == "_":
            start = i
            while i < n and (text[i].isalnum() or text[i] == "_"):
                i += 1
            name = text[start:i]
            j = i
            while j < n and text[j] in " \t":
                j += 1
            if j < n and text[j] == "(":
                cmd_line = line
                args, i, line = _read_args(text, j + 1, line)
                commands.append(Command(name.lower(), tuple(args), cmd_line))
        else:
            i += 1
    return commands


def _skip_comment(text: str, i: int, line: int) -> tuple[int, int]:
    if text.startswith("#[", i):
        j = i + 2
        eq = 0
        while j < len(text) and text[j] == "=":
            eq += 1
            j += 1
        if j < len(text) and text[j] == "[":
            close = "]" + "=" * eq + "]"
            end = text.find(close, j)
            end = len(text) if end < 0 else end + len(close)
            return end, line + text.count("\n", i, end)
    end = text.find("\n", i)
    return (len(text) if end < 0 else end), line


def _read_args(text: str, i: int, line: int) -> tuple[list[Token], int, int]:
    args: list[Token] = []
    depth = 1
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif c in " \t\r":
            i += 1
        elif c == "#":
            i, line = _skip_comment(text, i, line)
        elif c == '"':
            j = i + 1
            buf: list[str] = []
            while j < n and text[j] != '"':
                if text[j] == "\\" and j + 1 < n:
                    if text[j + 1] == "\n":
                        line += 1  # a backslash-newline continues the string without a newline
                    else:
                        buf.append(text[j + 1])
                    j += 2
                    continue
                if text[j] == "\n":
                    line += 1
                buf.append(text[j])
                j += 1
            args.append(Token("".join(buf), True))
            i = j + 1
        elif c == "(":
            depth += 1
            args.append(Token("(", False))
            i += 1
        elif c == ")":
            depth -= 1
            i += 1
            if depth == 0:
                return args, i, line
            args.append(Token(")", False))
        else:
            j = i
            while j < n and text[j] not in ' \t\r\n()"#':
                j += 1
            args.append(Token(text[i:j], False))
            i = j
    return args, i, line


def condition_terms(tokens: tuple[Token, ...] | list[Token]) -> tuple[Term, ...]:
    """The tests in an if() condition, each marked negated when an odd number of NOTs cover it."""
    words = [t.text for t in tokens]
    keywords = [None if t.quoted else t.text.upper() for t in tokens]
    covered = [0] * len(words)
    for j, kw in enumerate(keywords):
        if kw == "NOT" and j + 1 < len(words):
            end = _term_end(keywords, j + 1)
            for k in range(j + 1, end + 1):
                covered[k] += 1
    terms: list[Term] = []
    j = 0
    while j < len(words):
        kw = keywords[j]
        if kw in LOGIC:
            j += 1
            continue
        if kw in UNARY_OPS and j + 1 < len(words):
            terms.append(Term(words[j + 1], kw, None, covered[j] % 2 == 1))
            j += 2
            continue
        if j + 2 < len(words) and keywords[j + 1] in BINARY_OPS:
            terms.append(Term(words[j], keywords[j + 1], words[j + 2], covered[j] % 2 == 1))
            j += 3
            continue
        terms.append(Term(words[j], None, None, covered[j] % 2 == 1))
        j += 1
    return tuple(terms)


def _term_end(keywords: list[str | None], start: int) -> int:
    """Index of the last token of the term starting at `start` (what a NOT there would cover)."""
    kw = keywords[start]
    if kw == "(":
        depth = 0
        for k in range(start, len(keywords)):
            if keywords[k] == "(":
                depth += 1
            elif keywords[k] == ")":
                depth -= 1
                if depth == 0:
                    return k
        return len(keywords) - 1
    if kw == "NOT" and start + 1 < len(keywords):
        return _term_end(keywords, start + 1)
    if kw in UNARY_OPS:
        return min(start + 1, len(keywords) - 1)
    if start + 2 < len(keywords) and keywords[start + 1] in BINARY_OPS:
        return start + 2
    return start


def locate(commands: list[Command]) -> list[Located]:
    """Every command that is not itself if/elseif/else/endif, with the if() branches enclosing it."""
    stack: list[Branch] = []
    out: list[Located] = []
    for cmd in commands:
        if cmd.name == "if":
            stack.append(Branch(condition_terms(cmd.args), cmd.line, ()))
        elif cmd.name == "elseif" and stack:
            prev = stack.pop()
            stack.append(Branch(condition_terms(cmd.args), cmd.line, (*prev.earlier, prev.condition)))
        elif cmd.name == "else" and stack:
            prev = stack.pop()
            stack.append(Branch((), cmd.line, (*prev.earlier, prev.condition)))
        elif cmd.name == "endif" and stack:
            stack.pop()
        else:
            out.append(Located(cmd, tuple(stack)))
    return out
