"""Checks the service's regular expressions for super-linear backtracking (ReDoS).

Run by `make lint`: `python tools/check_regexes.py` exits 1 and names each pattern at
fault. It reads every pattern of the packages `app`, `retrieval` and `storage`:

- the patterns each module holds once imported (module globals, and those inside
  lists, tuples, dicts and objects such as the fact rules' `Rule.regex`), which sees
  patterns built at import from joined lists and f-strings;
- the string literals passed to `re.compile`, `re.search`, `re.sub` and the others in
  the source (patterns compiled inside functions).

Each is judged three ways; any one fails it:

1. regexploit's analysis (`regexploit.redos.find`): a repeat that can be pumped with
   starriness above 2, i.e. cubic or exponential backtracking on some input.
2. An unbounded repeat whose body is a finite set of strings that is not uniquely
   decodable (Sardinas-Patterson): `(?:刚|刚刚)*` splits 刚 x n in Fibonacci(n) ways
   and backtracks through all of them on a failing match; or whose body can match a
   run of one character through a repeat of its own (`(?:(?:了|哈+)[,.]*)+`).
   regexploit reasons about characters, not strings, and misses the first; it gives
   up on the second where a long alternation surrounds it.
3. Three unbounded repeats over a shared character, in a row with only optional or
   zero-width items between (the implicit scan over start positions of an unanchored
   search counts as one): `(?:^|\\n)\\s*[<]?\\s*x` is cubic on a run of newlines.
   regexploit misses these too.

Quadratic patterns pass: the text they read is bounded where it matters (the fact
rules read at most `MAX_PIECE_CHARS` at once; see retrieval/facts/rules/engine.py).
"""

from __future__ import annotations

import ast
import importlib
import itertools
import re
import signal
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from re import _constants as sre_constants  # type: ignore[attr-defined]  # no stubs
    from re import _parser as sre_parse  # type: ignore[attr-defined]  # no stubs

    from regexploit.ast.sre import SreOpParser  # type: ignore[import-untyped]  # no stubs
    from regexploit.redos import find  # type: ignore[import-untyped]  # no stubs

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "retrieval", "storage")
RE_CALLS = {"compile", "search", "match", "fullmatch", "sub", "subn", "split", "findall"}
RE_CALLS |= {"finditer"}
# Characters the repeat-chain check probes character classes with.
PROBES = " \t\n\r\u3000aAzZ09_-#.,:;!?()[]<>'\"/\\我刚是哈的，。：！？、㐀鿿\x00"
MAX_STRINGS = 2000
REGEXPLOIT_BUDGET_S = 0.3


@dataclass(frozen=True)
class Found:
    where: str
    pattern: str
    flags: int


def _sources(root: Path) -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((root / package).rglob("*.py"))


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _literal_patterns(path: Path, root: Path) -> Iterator[Found]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "re"
            and node.func.attr in RE_CALLS
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            continue
        flags = 0
        for keyword in node.keywords:
            if keyword.arg == "flags" and isinstance(keyword.value, ast.Attribute):
                flags |= getattr(re, keyword.value.attr, 0)
        if node.func.attr == "compile" and len(node.args) > 1:
            flags |= _flags_of(node.args[1])
        yield Found(f"{path.relative_to(root)}:{node.lineno}", node.args[0].value, flags)


def _flags_of(node: ast.expr) -> int:
    if isinstance(node, ast.Attribute):
        return int(getattr(re, node.attr, 0))
    if isinstance(node, ast.BinOp):
        return _flags_of(node.left) | _flags_of(node.right)
    return 0


def _held(value: Any, where: str, depth: int = 0) -> Iterator[Found]:
    if isinstance(value, re.Pattern):
        if isinstance(value.pattern, str):
            yield Found(where, value.pattern, value.flags & ~re.UNICODE)
        return
    if depth > 3 or isinstance(value, (str, bytes, int, float, type)) or value is None:
        return
    if isinstance(value, dict):
        items: Any = value.values()
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = value
    elif hasattr(value, "__dataclass_fields__"):
        items = [getattr(value, name, None) for name in value.__dataclass_fields__]
    else:
        return
    for item in items:
        yield from _held(item, where, depth + 1)


def _imported_patterns(path: Path, root: Path) -> Iterator[Found]:
    module = importlib.import_module(_module_name(path, root))
    for name, value in vars(module).items():
        yield from _held(value, f"{module.__name__}.{name}")


def patterns(root: Path = ROOT) -> list[Found]:
    """Every pattern of the packages under `root` (which must be importable)."""
    found: dict[tuple[str, int], Found] = {}
    for path in _sources(root):
        text = path.read_text(encoding="utf-8")
        if "re." not in text or path.name == "__main__.py":
            continue
        items = itertools.chain(_literal_patterns(path, root), _imported_patterns(path, root))
        for item in items:
            found.setdefault((item.pattern, item.flags), item)
    return list(found.values())


# --- 2. ambiguous strings under a repeat -------------------------------------------


def _strings(items: Any, flags: int) -> set[str] | None:
    """The finite set of strings `items` (a parsed sequence) matches, or None."""
    result = {""}
    for op, arg in items:
        options = _item_strings(op, arg, flags)
        if options is None:
            return None
        result = {a + b for a in result for b in options}
        if len(result) > MAX_STRINGS:
            return None
    return result


def _item_strings(op: Any, arg: Any, flags: int) -> set[str] | None:
    fold = bool(flags & re.IGNORECASE)
    if op is sre_constants.LITERAL:
        char = chr(arg)
        return {char.lower()} if fold else {char}
    if op is sre_constants.SUBPATTERN:
        return _strings(arg[-1], flags | arg[1])
    if op is sre_constants.BRANCH:
        union: set[str] = set()
        for branch in arg[1]:
            strings = _strings(branch, flags)
            if strings is None:
                return None
            union |= strings
        return union
    if op is sre_constants.IN and all(o is sre_constants.LITERAL for o, _ in arg):
        return {chr(a).lower() if fold else chr(a) for _, a in arg}
    if op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT):
        return _repeat_strings(arg, flags)
    return None


def _repeat_strings(arg: Any, flags: int) -> set[str] | None:
    """`的?`, `a{2}`: a repeat of at most four."""
    low, high, body = arg
    inner = _strings(body, flags) if high <= 4 else None
    if inner is None:
        return None
    union = set()
    for count in range(low, high + 1):
        for parts in itertools.product(sorted(inner), repeat=count):
            union.add("".join(parts))
    return union


def ambiguous(words: set[str]) -> bool:
    """Sardinas-Patterson: can some string be split into `words` in two ways?"""
    code = {w for w in words if w}

    def dangling(first: set[str], second: set[str]) -> set[str]:
        return {b[len(a) :] for a in first for b in second if b != a and b.startswith(a)}

    current = dangling(code, code)
    seen: set[frozenset[str]] = set()
    while current:
        if "" in current or current & code:
            return True
        key = frozenset(current)
        if key in seen:
            return False
        seen.add(key)
        current = dangling(code, current) | dangling(current, code)
    return False


def _nullable(items: Any) -> bool:
    return all(_item_nullable(op, arg) for op, arg in items)


def _item_nullable(op: Any, arg: Any) -> bool:
    if op in (sre_constants.AT, sre_constants.ASSERT, sre_constants.ASSERT_NOT):
        return True
    if op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT):
        return arg[0] == 0 or _nullable(arg[2])
    if op is sre_constants.SUBPATTERN:
        return _nullable(arg[-1])
    if op is sre_constants.BRANCH:
        return any(_nullable(branch) for branch in arg[1])
    return False


def _pumped(items: Any, flags: int) -> bool:
    """Can `items` match a run of one character by way of an unbounded repeat of it,
    everything else matching nothing (`哈+`, `(?:了|哈+)`, `哈+[,.]*`)?"""
    items = list(items)
    for position, (op, arg) in enumerate(items):
        rest = items[:position] + items[position + 1 :]
        if _nullable(rest) and _item_pumped(op, arg, flags):
            return True
    return False


def _item_pumped(op: Any, arg: Any, flags: int) -> bool:
    if op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT):
        low, high, body = arg
        if high == sre_constants.MAXREPEAT and low <= 1 and len(body) == 1:
            return _chars(body[0][0], body[0][1], flags) is not None
        return high == sre_constants.MAXREPEAT and _pumped(body, flags)
    if op is sre_constants.SUBPATTERN:
        return _pumped(arg[-1], flags | arg[1])
    if op is sre_constants.BRANCH:
        return any(_pumped(branch, flags) for branch in arg[1])
    return False


def _ambiguous_repeats(items: Any, flags: int) -> Iterator[str]:
    for op, arg in items:
        if op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT):
            _, high, body = arg
            if high == sre_constants.MAXREPEAT:
                words = _strings(body, flags)
                if words is not None and ambiguous(words):
                    yield "ambiguous strings under a repeat: " + "|".join(sorted(words)[:12])
                elif _pumped(body, flags):
                    yield "a repeat of one character under a repeat (exponential): (x+)+"
            yield from _ambiguous_repeats(body, flags)
        elif op is sre_constants.SUBPATTERN:
            yield from _ambiguous_repeats(arg[-1], flags | arg[1])
        elif op is sre_constants.BRANCH:
            for branch in arg[1]:
                yield from _ambiguous_repeats(branch, flags)
        elif op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
            yield from _ambiguous_repeats(arg[1], flags)


# --- 3. chains of overlapping repeats -----------------------------------------------

ALL = frozenset(PROBES)


def _chars(op: Any, arg: Any, flags: int) -> frozenset[str] | None:
    """The probe characters one single-character item matches, or None."""
    if op is sre_constants.LITERAL:
        return frozenset(c for c in PROBES if _same_char(c, chr(arg), flags))
    if op is sre_constants.NOT_LITERAL:
        return frozenset(c for c in PROBES if not _same_char(c, chr(arg), flags))
    if op is sre_constants.ANY:
        return ALL if flags & re.DOTALL else ALL - {"\n"}
    if op is sre_constants.IN:
        return frozenset(c for c in PROBES if _in_class(c, arg, flags))
    return None


def _same_char(probe: str, char: str, flags: int) -> bool:
    return probe.lower() == char.lower() if flags & re.IGNORECASE else probe == char


CATEGORIES = {
    "CATEGORY_DIGIT": str.isdecimal,
    "CATEGORY_SPACE": str.isspace,
    "CATEGORY_WORD": lambda c: c.isalnum() or c == "_",
    "CATEGORY_LINEBREAK": lambda c: c == "\n",
}


def _in_class(probe: str, items: Any, flags: int) -> bool:
    negate = False
    hit = False
    for op, arg in items:
        if op is sre_constants.NEGATE:
            negate = True
        elif op is sre_constants.LITERAL:
            hit = hit or _same_char(probe, chr(arg), flags)
        elif op is sre_constants.RANGE:
            low, high = arg
            hit = (
                hit
                or low <= ord(probe) <= high
                or bool(flags & re.IGNORECASE and low <= ord(probe.swapcase()[:1] or probe) <= high)
            )
        elif op is sre_constants.CATEGORY:
            name = str(arg)
            test = CATEGORIES.get(name.replace("NOT_", ""))
            if test is not None:
                hit = hit or (test(probe) != name.startswith("CATEGORY_NOT_"))
    return hit != negate


def _transparent(op: Any, arg: Any) -> bool:
    """Zero-width, or optional: the backtracker can step over it for free."""
    if op is sre_constants.AT:
        return True
    if op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT):
        return arg[0] == 0 and arg[1] == 1
    if op is sre_constants.BRANCH:
        return any(not branch for branch in arg[1]) or all(
            len(branch) == 1 and branch[0][0] is sre_constants.AT for branch in arg[1]
        )
    return False


def _branch_chars(arg: Any, flags: int) -> frozenset[str] | None:
    """`(?:^|\\n)`: alternatives each zero-width or one character."""
    chars: set[str] = set()
    for branch in arg[1]:
        if len(branch) != 1:
            return None
        op, value = branch[0]
        if op is sre_constants.AT:
            continue
        one = _chars(op, value, flags)
        if one is None:
            return None
        chars |= one
    return frozenset(chars)


@dataclass(frozen=True)
class _Chain:
    """Unbounded repeats in a row so far, and the characters they all match."""

    chars: frozenset[str] | None
    count: int


_BROKEN = _Chain(None, 0)


def _repeat_chain(items: Any, flags: int, chain: _Chain) -> tuple[_Chain, str | None]:
    for op, arg in items:
        while op is sre_constants.SUBPATTERN and len(arg[-1]) == 1:
            op, arg = arg[-1][0]
        chain, problem = _step(op, arg, flags, chain)
        if problem is not None:
            return chain, problem
    return chain, None


def _unbounded_chars(op: Any, arg: Any, flags: int) -> frozenset[str] | None:
    """The characters of `x*`, `[^,]+?`: an unbounded repeat of one character."""
    if op not in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT):
        return None
    _, high, body = arg
    if high != sre_constants.MAXREPEAT or len(body) != 1:
        return None
    body_op, body_arg = body[0]
    return _chars(body_op, body_arg, flags)


def _step(op: Any, arg: Any, flags: int, chain: _Chain) -> tuple[_Chain, str | None]:
    chars = _unbounded_chars(op, arg, flags)
    if chars is not None:
        shared = chain.chars & chars if chain.chars is not None else frozenset()
        chain = _Chain(shared, chain.count + 1) if shared else _Chain(chars, 1)
        if chain.count >= 3:
            shown = "".join(sorted(shared)).encode("unicode_escape").decode()
            return chain, f"three overlapping repeats in a row (cubic) over [{shown}]"
        return chain, None
    if _transparent(op, arg):
        return chain, None
    one = _branch_chars(arg, flags) if op is sre_constants.BRANCH else _chars(op, arg, flags)
    if one is not None and chain.chars is not None and chain.chars & one:
        # One character the repeats also match (`\n` in `(?:^|\n)`) keeps the chain.
        return _Chain(chain.chars & one, chain.count), None
    if op is sre_constants.SUBPATTERN:
        return _repeat_chain(arg[-1], flags | arg[1], chain)
    if op is sre_constants.BRANCH:
        # Each alternative continues the chain; after the group it starts again.
        for branch in arg[1]:
            _, problem = _repeat_chain(branch, flags, chain)
            if problem is not None:
                return _BROKEN, problem
    return _BROKEN, None


def _start(items: Any, flags: int) -> _Chain:
    """An unanchored search tries every start: one more repeat over every character."""
    first = items[0] if items else None
    if first == (sre_constants.AT, sre_constants.AT_BEGINNING_STRING) or (
        first == (sre_constants.AT, sre_constants.AT_BEGINNING) and not flags & re.MULTILINE
    ):
        return _BROKEN
    return _Chain(ALL, 1)


class _OutOfTime(Exception):
    pass


def _out_of_time(signum: int, frame: object) -> None:
    raise _OutOfTime


def _regexploit(item: Found) -> list[str] | None:
    """regexploit's findings, or None where it runs out of time: it expands every
    alternation of a sequence, and the English rules' word lists multiply out."""
    # CPU time, not wall time: the same patterns finish on a loaded machine.
    previous = signal.signal(signal.SIGVTALRM, _out_of_time)
    signal.setitimer(signal.ITIMER_VIRTUAL, REGEXPLOIT_BUDGET_S)
    try:
        found = find(SreOpParser().parse_sre(item.pattern, item.flags))
    except _OutOfTime:
        return None
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, previous)
    return [
        f"regexploit: starriness {r.starriness}, e.g. {r.example()}"
        for r in found
        if r.starriness > 2
    ]


def problems(item: Found) -> list[str] | None:
    """What is wrong with the pattern; None where regexploit could not finish (the
    other two checks found nothing)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parsed = sre_parse.parse(item.pattern, item.flags)
        found = _regexploit(item)
    flags = item.flags | parsed.state.flags
    own = list(dict.fromkeys(_ambiguous_repeats(parsed.data, flags)))
    _, chain = _repeat_chain(parsed.data, flags, _start(parsed.data, flags))
    if chain is not None:
        own.append(chain)
    if found is None:
        return own or None
    return found + own


def main() -> int:
    # Another checkout to check may be named on the command line.
    root = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT
    sys.path.insert(0, str(root))
    found = patterns(root)
    failures = 0
    partial = []
    for item in found:
        result = problems(item)
        if result is None:
            partial.append(item.where)
            continue
        for problem in result:
            failures += 1
            print(f"{item.where}: {problem}\n    {item.pattern[:160]}")
    print(
        f"{len(found)} patterns checked, {failures} problems; {len(partial)} too large for"
        f" regexploit within {REGEXPLOIT_BUDGET_S} CPU s (checks 2 and 3 only):"
        f" {', '.join(sorted(set(partial)))}"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
