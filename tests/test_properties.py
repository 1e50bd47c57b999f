"""Keep finding them: property-based tests (hypothesis) that throw generated hostile values
(deep and large JSON, NaN, huge integers, wrong types, unicode, odd paths) at the prompts
parser, the JSON reader, every studio endpoint and the CLI's file arguments, and require a
one-line refusal (`SegpipeError`; in the studio a 4xx with one line) or a success, never
anything else, and the store unchanged by every refusal. Each test has a fixed example
budget and a fixed seed (`derandomize`), so `make test` spends the same bounded time on
the same cases every run."""

from __future__ import annotations

import json
import math
import shutil

import pytest
from conftest import tree_digest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_studio import fetch
from test_studio_writes import made  # noqa: F401 - a fixture

from segpipe import limits
from segpipe import prompts as prompt_file
from segpipe.errors import SegpipeError

BUDGET = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# what JSON can hold, and then some: huge and negative integers, NaN and infinities, any
# unicode, nesting
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from([0, 1, -1, 2**31, 2**63, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["", "data:image/png;base64,", "data:image/png;base64,!!", "../../etc"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=30,
)
keys = st.sampled_from(sorted(prompt_file.ENTRY_KEYS) + ["", "objects", "Frame"])
entries = st.dictionaries(keys, values, max_size=6)
coordinates = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-10, 200),
    st.sampled_from([10**400, -(10**400), 2**1024, True]),
)
ids = st.one_of(st.integers(0, 300), values, st.sampled_from([-1, 2**31, 2**63, 10**400]))
frames = st.one_of(st.integers(0, 23), values, st.sampled_from([-1, 24, 60_000, 10**400]))
near_valid = st.one_of(  # one prompt of each kind, nearly right, with hostile values
    st.fixed_dictionaries(
        {
            "object": ids,
            "frame": frames,
            "points": st.one_of(
                st.lists(st.lists(coordinates, min_size=1, max_size=3), min_size=1, max_size=4),
                values,
            ),
            "labels": st.one_of(st.lists(st.integers(-1, 2), max_size=4), values),
        }
    ),
    st.fixed_dictionaries(
        {"object": ids, "frame": frames, "box": st.lists(coordinates, min_size=3, max_size=5)}
    ),
    st.fixed_dictionaries({"object": ids, "frame": frames, "mask": values}),
    st.fixed_dictionaries({"frame": frames, "id_mask": values}),
    st.fixed_dictionaries(
        {"object": ids, "frame": frames},
        optional={k: values for k in ("points", "labels", "box", "mask", "id_mask")},
    ),
)
documents = st.one_of(
    values,
    st.fixed_dictionaries(
        {
            "prompts": st.one_of(
                values,
                st.lists(near_valid, min_size=1, max_size=3),
                st.lists(st.one_of(entries, near_valid), max_size=4),
            )
        }
    ),
)


def json_bytes(doc) -> bytes:
    """`doc` as a JSON file holds it (NaN and Infinity as Python writes them: not JSON)."""
    return json.dumps(doc).encode()


FOUND = [  # what earlier probes found, kept as examples every run tries first
    [{"object": 1, "frame": 0, "points": [[10**400, 1]], "labels": [1]}],
    [{"object": 1, "frame": 0, "box": [0, 0, 10**400, 1]}],
    [{"object": 1, "frame": 10**400, "points": [[1, 1]], "labels": [1]}],
    [{"object": 10**400, "frame": 0, "box": [0, 0, 1, 1]}],
    [{"object": 1, "frame": 0, "points": [[1, 1]] * 2000, "labels": [1] * 2000}],
]


@settings(max_examples=300, **BUDGET)
@given(doc=st.one_of(st.lists(near_valid, min_size=1, max_size=3), documents))
@example(doc=FOUND[0])
@example(doc=FOUND[1])
@example(doc=FOUND[2])
@example(doc=FOUND[3])
@example(doc=FOUND[4])
def test_the_prompts_parser_refuses_in_one_line_or_accepts(doc):
    """`prompts.load` on generated entries (and the `FOUND` ones): prompts every one of
    which is in range, or one `SegpipeError` line of at most 400 characters."""
    source = doc.get("prompts") if isinstance(doc, dict) else doc
    try:
        loaded = prompt_file.load(source, 24, 96, 72)
    except SegpipeError as e:
        assert "\n" not in e.message and len(e.message) < 400, e.message
        return
    for p in loaded:
        assert 0 <= p.frame < 24 and 0 <= p.object_id <= limits.MAX_OBJECT_ID
        for x, y in p.points or ():
            assert 0 <= x <= 96 and 0 <= y <= 72 and math.isfinite(x) and math.isfinite(y)


@settings(max_examples=300, **BUDGET)
@given(
    data=st.one_of(
        st.binary(max_size=200),
        st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
        documents.map(json_bytes),
        st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n),
        st.integers(1, 3000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
        st.integers(4000, 6000).map(lambda n: b"9" * n),
    )
)
def test_the_json_reader_refuses_in_one_line_or_reads(data):
    """`limits.read_json` on generated bytes: a document no deeper than the limit, or one
    `SegpipeError` line, never a RecursionError or a ValueError."""
    try:
        doc = limits.read_json(data, "the body")
    except SegpipeError as e:
        assert "\n" not in e.message, e.message
        return
    assert nesting(doc) <= limits.MAX_DEPTH


def nesting(doc) -> int:
    """How deep arrays and objects nest in `doc`, counted here (not by the code tested)."""
    if isinstance(doc, dict):
        return 1 + max(map(nesting, doc.values()), default=0)
    if isinstance(doc, list):
        return 1 + max(map(nesting, doc), default=0)
    return 0


@pytest.fixture(scope="module")
def server(made, tmp_path_factory):  # noqa: F811
    from segpipe.web.server import StudioServer

    store = tmp_path_factory.mktemp("properties") / "clip.zarr"
    shutil.copytree(made, store)
    server = StudioServer(store, port=0).start()
    server.store = store
    yield server
    server.stop()


ENDPOINTS = [
    ("PUT", "api/prompts"),
    ("POST", "api/preview"),
    ("POST", "api/track"),
    ("POST", "api/export"),
    ("POST", "api/cancel"),
]


def answered(server, method: str, path: str, body: bytes | None) -> int:
    """The studio's answer: a 2xx, or a 4xx with one line; never a 5xx."""
    status, data, _ = fetch(server.url + path, method, body)
    assert status < 500, (method, path, body[:200] if body else body, data[:300])
    if status >= 400:
        error = json.loads(data)["error"]
        assert "\n" not in error and "Traceback" not in error, error
    return status


@settings(max_examples=120, **BUDGET)
@given(
    endpoint=st.sampled_from(ENDPOINTS),
    body=st.one_of(
        documents.map(json_bytes),
        st.binary(max_size=100),
        st.integers(40, 3000).map(lambda n: b"[" * n + b"]" * n),
    ),
)
def test_every_studio_endpoint_answers_a_4xx_in_one_line_and_changes_nothing(
    server, endpoint, body
):
    """Generated bodies at every endpoint that takes one, on a store with no prompts: a
    refusal (4xx, one line) leaves the store as it was; prompts it accepts are taken
    back."""
    method, path = endpoint
    before = tree_digest(server.store)
    status = answered(server, method, path, body)
    if status >= 400:
        assert tree_digest(server.store) == before
    if path == "api/prompts" and status == 200:
        assert answered(server, "PUT", path, b'{"prompts": []}') == 200
    assert json.loads(fetch(server.url + "api/progress")[1])["state"] != "running"


@settings(max_examples=60, **BUDGET)
@given(
    path=st.sampled_from(["api/frames/{}.jpg", "api/masks/{}.png", "api/scores?frame={}"]),
    n=st.one_of(st.integers(), st.text(max_size=12), st.sampled_from(["-1", "1e9", "%00"])),
)
def test_reads_of_any_frame_answer_without_a_5xx(server, path, n):
    """Frame numbers out of range, negative, huge or not numbers at the reading endpoints."""
    from urllib.parse import quote

    status, data, _ = fetch(server.url + path.format(quote(str(n), safe="")))
    assert status < 500, (path, n, data[:300])


@settings(max_examples=60, **BUDGET)
@given(
    content=st.one_of(documents.map(json_bytes), st.binary(max_size=100)),
    name=st.text(
        alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="/\0"),
        min_size=1,
        max_size=30,
    ),
)
def test_the_cli_reads_any_prompts_file_in_one_line(made, tmp_path_factory, content, name):  # noqa: F811
    """The CLI's `--prompts FILE` (any name, any content; read and checked, and where they
    are prompts, refused for the empty window given) and `--store` (a path that is no store,
    or is nothing), in process as the command runs them: a `SegpipeError` or click's own
    usage error, each one line; the store unchanged."""
    import click

    from segpipe.cli import cli

    folder = tmp_path_factory.mktemp("cli")
    try:
        path = folder / name
        path.write_bytes(content)
    except OSError:  # a name this file system refuses (too long): the path stays unmade
        path = folder / "unmade" / name
    before = tree_digest(made)
    for argv in (
        # a window of no frame: prompts the file holds are read and checked, then refused
        ["track", "--store", made, "--prompts", path, "--frames", "3:3", "--quiet"],
        ["status", "--store", path],
        ["encode", "--store", path, "--random-weights", "0", "--quiet"],
    ):
        try:
            cli.main([*map(str, argv)], prog_name="segpipe", standalone_mode=False)
        except SegpipeError as e:
            assert "\n" not in e.message, e.message
        except click.ClickException as e:
            assert "\n" not in e.format_message(), e.format_message()
        else:
            pytest.fail(f"segpipe {argv} accepted {content[:100]!r}")
    assert tree_digest(made) == before
