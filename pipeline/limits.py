"""What segpipe reads at most from what it is given, and the one JSON reader that holds to
it: a prompts file (`--prompts`, the studio's saved draft) and every studio request body go
through `read_json`, so nothing given can nest deep enough to exhaust Python's stack, or be
large enough to exhaust the memory, before it is refused in one line (docs/guarantees.md,
"Limits").
"""

from __future__ import annotations

import json
from pathlib import Path

from segpipe.errors import BadInput
from segpipe.fsutil import regular_file

MAX_JSON_BYTES = 16 * 2**20  # a prompts file, a studio request body
MAX_DEPTH = 32  # nesting of JSON arrays and objects (a prompts file nests 4 deep)
MAX_PROMPTS = 65_536  # prompts after id masks are split (an id mask holds up to 65,535 ids)
MAX_POINTS = 1_000  # points of one prompt
MAX_OBJECT_ID = 2**31 - 1  # an object id: what every export format can hold
MAX_MASK_PIXELS = 2**31  # mask prompts in all (about 1,000 masks at 1080p, 260 at 4K)


class TooLarge(BadInput):
    """Something given is larger than segpipe reads (the studio answers 413)."""


def human(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n} bytes"


def read_json(data: bytes | str, what: str):
    """`data` parsed as JSON, or a one-line `BadInput` naming `what` ("prompts file X", "the
    request body"): more than `MAX_JSON_BYTES` (`TooLarge`), nesting deeper than
    `MAX_DEPTH`, invalid JSON or UTF-8 (a lone surrogate too), NaN or Infinity (not JSON, nor
    a number past a float's range), integers too long."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if len(data) > MAX_JSON_BYTES:
        raise TooLarge(
            f"{what} is {human(len(data))}: segpipe reads at most {human(MAX_JSON_BYTES)}"
        )
    try:
        text = data.decode("utf-8")  # strictly: no lone surrogates, no other encoding
        doc = json.loads(text, parse_constant=_not_json, parse_float=_finite)
    except RecursionError:  # the C parser's own guard, far below the stack's end
        raise BadInput(f"{what} nests too deep: segpipe reads at most {MAX_DEPTH} levels") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, integers too long
        said = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise BadInput(f"{what} is not valid JSON: {said}") from None
    depth = _depth(doc)
    if depth > MAX_DEPTH:
        raise BadInput(f"{what} nests {depth} levels deep: segpipe reads at most {MAX_DEPTH}")
    return doc


def read_json_file(path: Path, what: str):
    """A JSON file's contents (`read_json`), refused in one line when it is not there, not a
    regular file (a folder, a FIFO: never opened), or larger than `MAX_JSON_BYTES` (said
    before a byte is read)."""
    st = regular_file(path, what, "a JSON file")
    if st.st_size > MAX_JSON_BYTES:
        raise TooLarge(
            f"{what} {path} is {human(st.st_size)}: segpipe reads at most {human(MAX_JSON_BYTES)}"
        )
    try:
        with path.open("rb") as f:
            data = f.read(MAX_JSON_BYTES + 1)
    except OSError as e:
        raise BadInput(f"{what} {path} cannot be read: {e.strerror}") from None
    return read_json(data, f"{what} {path}")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text} is out of a float's range")
    return value


def _not_json(constant: str):
    raise ValueError(f"{constant} is not a JSON number")


def _depth(doc) -> int:
    """The deepest nesting of arrays and objects in a parsed document, walked without
    recursion (what reads it next may recurse)."""
    deepest, todo = 0, [(doc, 1)]
    while todo:
        node, depth = todo.pop()
        if isinstance(node, dict):
            node = node.values()
        elif not isinstance(node, list):
            continue
        deepest = max(deepest, depth)
        todo.extend((child, depth + 1) for child in node if isinstance(child, (dict, list)))
    return deepest
