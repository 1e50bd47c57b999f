"""Hostile input, refused in one line with no traceback and nothing changed: JSON nested
5,000 deep, bodies and files past the limits (`segpipe.limits`), a symbolic link loop as the
store of every command, a FIFO as the video, a folder or a FIFO as the prompts file, a
read-only file system, a prompt frame past the end of a video (refused before decoding it),
and the studio's URL when it listens on every interface."""

from __future__ import annotations

import http.client
import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import IMAGE_SIZE, assert_user_error, segpipe, tree_digest
from test_studio import fetch
from test_studio_writes import POINT, made, one_line_error, read_only_copy  # noqa: F401

from segpipe import limits
from segpipe import prompts as prompt_file


@pytest.fixture
def store(made, tmp_path) -> Path:  # noqa: F811
    copy = tmp_path / "clip.zarr"
    shutil.copytree(made, copy)
    return copy


@pytest.fixture
def server(store):
    from segpipe.web.server import StudioServer

    server = StudioServer(store, port=0).start()
    yield server
    server.stop()


def deep(levels: int) -> bytes:
    return b'{"prompts": ' + b"[" * levels + b"]" * levels + b"}"


def test_deep_json_is_refused_in_one_line_by_the_cli_and_the_studio(store, server, tmp_path):
    """5,000 levels of nesting: a 47-line RecursionError traceback from the CLI and a 500
    from the studio before; now one line (exit 1; 400) from the one JSON reader, and so for
    33 levels (the limit is 32), and the store unchanged."""
    digest = tree_digest(store)
    for levels in (5_000, limits.MAX_DEPTH + 1):
        path = tmp_path / f"deep{levels}.json"
        path.write_bytes(deep(levels))
        proc = segpipe("track", "--store", store, "--prompts", path)
        assert_user_error(proc, "nests", f"at most {limits.MAX_DEPTH}")
        status = fetch(server.url + "api/prompts", "PUT", deep(levels))
        one_line_error(status, 400, "nests")
        one_line_error(fetch(server.url + "api/track", "POST", deep(levels)), 400, "nests")
    assert tree_digest(store) == digest


def test_bodies_and_files_past_the_limits_are_refused(store, server, tmp_path):
    """A body over 16 MiB is a 413 (said by its Content-Length, and when sent chunked without
    one, after 16 MiB are read); a sparse 1 GiB prompts file is refused by its size before a
    byte is read; more prompts or points than the limits, and NaN, in one line each; the
    store (its saved prompts too) unchanged."""
    digest = tree_digest(store)
    big = b'{"prompts": [' + b" " * (limits.MAX_JSON_BYTES) + b"]}"
    one_line_error(fetch(server.url + "api/prompts", "PUT", big), 413, "at most 16.0 MiB")
    host, port = server.url.split("/")[2].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    connection.request(
        "PUT",
        "/api/prompts",
        body=iter([big[i : i + 2**20] for i in range(0, len(big), 2**20)]),
        headers={"Content-Type": "application/json"},
        encode_chunked=True,
    )
    answer = connection.getresponse()
    assert answer.status == 413, answer.read()
    assert "over 16.0 MiB" in json.loads(answer.read())["error"]
    connection.close()

    sparse = tmp_path / "sparse.json"
    with open(sparse, "wb") as f:
        f.truncate(2**30)
    assert_user_error(segpipe("track", "--store", store, "--prompts", sparse), "1024.0 MiB")
    many = {"prompts": [POINT] * (limits.MAX_PROMPTS + 1)}
    points = {"prompts": [{**POINT, "points": [[1, 1]] * 1001, "labels": [1] * 1001}]}
    nan = b'{"prompts": [{"object": 1, "frame": 5, "points": [[NaN, 1]], "labels": [1]}]}'
    for body, words in ((many, "at most 65,536"), (points, "at most 1000"), (nan, "NaN")):
        path = tmp_path / "p.json"
        path.write_bytes(body if isinstance(body, bytes) else json.dumps(body).encode())
        assert_user_error(segpipe("track", "--store", store, "--prompts", path), words)
        got = fetch(server.url + "api/prompts", "PUT", body)
        one_line_error(got, 413 if body is many else 400, words)
    assert tree_digest(store) == digest


def test_the_prompt_limits_hold_before_memory_is_taken():
    """One prompt past the count is refused, never dropped (an id mask's ids each count: it
    once stopped reading at the limit and left later entries out without a word); an id mask
    whose masks would pass the pixel limit (300 ids at 4K, 2.5 G pixels) is refused from its
    ids, before a mask is made; a mask PNG of another size is refused from its header."""
    import base64
    import io

    import numpy as np
    from PIL import Image

    from segpipe.errors import BadInput

    box = {"object": 1, "frame": 0, "box": [0, 0, 1, 1]}
    prompt_file.load([box] * limits.MAX_PROMPTS, 1, 96, 72)
    with pytest.raises(limits.TooLarge, match="65,537 prompts"):
        prompt_file.load([box] * (limits.MAX_PROMPTS + 1), 1, 96, 72)
    ids = np.zeros((2160, 3840), np.uint16)
    ids.reshape(-1)[:300] = np.arange(1, 301)
    with pytest.raises(limits.TooLarge, match="at most 258 masks"):
        prompt_file.load([{"frame": 0, "id_mask": ids}], 1, 3840, 2160)
    out = io.BytesIO()
    Image.fromarray(np.zeros((40_000, 10), np.uint8)).save(out, "PNG")
    tall = prompt_file.DATA_URI + base64.b64encode(out.getvalue()).decode()
    with pytest.raises(BadInput, match="is 10x40000, the video is 96x72"):
        prompt_file.load([{"object": 1, "frame": 0, "mask": tall}], 1, 96, 72)


def test_a_symlink_loop_as_the_store_is_one_line_for_every_command(store, small, tmp_path):
    """`--store loop` (a link to itself) gave a 46-line RuntimeError traceback from decode
    and track: every command now says it in one line, and leaves no lock file."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    video, prompts = small / "clip.mp4", small / "prompts.json"
    for argv in (
        ["decode", video, "--store", loop],
        ["encode", "--store", loop, "--random-weights", 0],
        ["track", "--store", loop, "--prompts", prompts],
        ["export", "--store", loop, "--format", "davis", "--out", tmp_path / "out"],
        ["run", video, "--store", loop, "--random-weights", 0, "--image-size", IMAGE_SIZE],
        ["repair", "--store", loop],
        ["status", "--store", loop],
        ["studio", loop, "--port", 0],
        ["export", "--store", store, "--format", "davis", "--out", loop],
    ):
        proc = segpipe(*argv)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, (argv, proc.stderr)
        assert_user_error(proc)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip.zarr", "loop"]


def test_a_fifo_as_the_video_or_the_prompts_is_refused_before_it_is_opened(store, small, tmp_path):
    """A FIFO as the video hung `decode` for ever (and a kill left its lock): it is refused
    in one line before it is opened, by decode, run and the studio, with no lock or store
    left. A folder or a FIFO as the prompts file says so (it said "not found")."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    new = tmp_path / "new.zarr"
    for argv in (
        ["decode", fifo, "--store", new],
        ["run", fifo, "--store", new, "--random-weights", 0, "--prompts", small / "prompts.json"],
        ["studio", fifo, "--store", new, "--random-weights", 0, "--port", 0],
    ):
        proc = segpipe(*argv, timeout=120)
        assert_user_error(proc, "not a regular file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip.zarr", "fifo"]
    folder = tmp_path / "prompts"
    folder.mkdir()
    for path, words in ((folder, "is a folder"), (fifo, "not a regular file")):
        assert_user_error(segpipe("track", "--store", store, "--prompts", path), words)


def test_a_read_only_file_system_is_said_as_such(made, small, tmp_path):  # noqa: F811
    """A command on a store it cannot write said "run the same command again", which would
    fail again: it says the file system cannot be written."""
    with read_only_copy(made, tmp_path) as store:
        proc = segpipe("track", "--store", store, "--prompts", small / "prompts.json")
        assert_user_error(proc, "Read-only file system", "cannot write there")
        assert "again" not in proc.stderr, proc.stderr


def test_a_prompt_past_the_end_is_refused_before_decoding(small, tmp_path):
    """`run` with a prompt on frame 60,000 of a 24-frame video is refused against the frame
    count the container records, before anything is decoded (it was refused after the whole
    video was decoded); a frame within that count is checked again after decode, as before."""
    prompts = tmp_path / "late.json"
    prompts.write_text(json.dumps({"prompts": [{**POINT, "frame": 60_000}]}))
    store = tmp_path / "late.zarr"
    proc = segpipe("run", small / "clip.mp4", "--store", store, "--prompts", prompts)
    assert_user_error(proc, "frame 60000 is out of range", "0..23")
    assert not store.exists()


def test_listening_on_every_interface_prints_an_address_a_browser_opens(store):
    """`--host 0.0.0.0` printed http://0.0.0.0:PORT/?token=..., which a browser cannot
    open: the URL names this machine's address, and answers with the token."""
    from segpipe.web.server import StudioServer

    server = StudioServer(store, host="0.0.0.0", port=0).start()
    try:
        assert "0.0.0.0" not in server.url and "?token=" in server.url, server.url
        status, data, _ = fetch(server.url)
        assert status == 200, data
    finally:
        server.stop()
