"""Hostile input: damaged and fake videos, malformed prompt files. Every case ends in a clear
error or a correct partial result: never a hang, a traceback or a half-written store."""

import json
import random

import make_sample
import numpy as np
import pytest
import zarr
from conftest import assert_user_error, segpipe, tree_digest

from segpipe import prompts as prompt_file
from segpipe.errors import SegpipeError

CASE_SECONDS = 60


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    frames, _ = make_sample.make_clip(num_frames=30, width=96, height=64, seed=2)
    make_sample.write_video(root / "clip.mp4", frames)
    make_sample.write_video(root / "clip.mkv", frames, codec="ffv1")
    return root


def hostile_videos(sources, out, n, rng):
    """Bytes flipped, cut at random offsets, and files that are not videos at all."""
    cases = []
    originals = [sources / "clip.mp4", sources / "clip.mkv"]
    for i in range(n):
        src = rng.choice(originals)
        data = bytearray(src.read_bytes())
        kind = ["flip", "cut", "flip+cut", "fake"][i % 4]
        if "flip" in kind:
            for _ in range(rng.randint(1, 40)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        if "cut" in kind:
            data = data[: rng.randrange(1, len(data))]
        if kind == "fake":
            data = rng.choice(
                [
                    b"\x89PNG\r\n\x1a\n" + bytes(rng.randrange(256) for _ in range(500)),
                    b'{"not": "a video"}',
                    bytes(rng.randrange(256) for _ in range(4096)),
                    b"",
                    b"ftypisom" * 100,
                ]
            )
        path = out / f"case{i:03d}{src.suffix}"
        path.write_bytes(bytes(data))
        cases.append((kind, path))
    return cases


def test_hostile_videos(sources, tmp_path, request):
    rng = random.Random(11)
    n = request.config.getoption("--fuzz-cases")
    outcomes = {"error": 0, "partial": 0}
    for kind, video in hostile_videos(sources, tmp_path, n, rng):
        store = tmp_path / f"{video.stem}.zarr"
        proc = segpipe(
            "decode",
            video,
            "--store",
            store,
            "--chunk-size",
            8,
            "--image-size",
            64,
            timeout=CASE_SECONDS,
        )
        assert "Traceback" not in proc.stderr, (kind, proc.stderr)
        if proc.returncode == 0:
            group = zarr.open_group(str(store), mode="r")
            T = group.attrs["frame_count"]
            assert T >= 1 and group["frames"].shape[0] == T and group["pts"].shape[0] == T
            assert np.all(zarr.open_group(str(store), mode="r")["ledger/decode"][...] == 1)
            assert len(group["ledger/decode"][...]) == -(-T // 8)
            outcomes["partial"] += 1
        else:
            assert_user_error(proc)
            assert not store.exists() or tree_digest(store) == {}, kind
            outcomes["error"] += 1
    print(f"hostile videos: {n} cases, {outcomes}")


def mutate(text: str, rng: random.Random) -> str:
    ops = rng.randint(1, 4)
    for _ in range(ops):
        i = rng.randrange(len(text) + 1)
        op = rng.choice(["delete", "insert", "replace"])
        junk = rng.choice(
            [
                '"',
                "{",
                "}",
                "[",
                "]",
                ",",
                ":",
                "-1",
                "1e9",
                "null",
                "true",
                '"mask"',
                '"x"',
                "0",
                "2.5",
                " ",
                "NaN",
            ]
        )
        if op == "delete":
            text = text[:i] + text[i + rng.randint(1, 5) :]
        elif op == "insert":
            text = text[:i] + junk + text[i:]
        else:
            text = text[:i] + junk + text[i + 1 :]
    return text


def structural_mutations(doc: dict, rng: random.Random) -> dict:
    doc = json.loads(json.dumps(doc))
    entry = rng.choice(doc["prompts"])
    key = rng.choice(list(entry))
    entry[key] = rng.choice(
        [
            None,
            -3,
            10**9,
            "x",
            [],
            [[1]],
            [1, 2],
            {"a": 1},
            1.5,
            True,
            [[float("inf"), 2]],
            [0, 0, 0, 0],
        ]
    )
    return doc


def test_malformed_prompt_files(tmp_path):
    rng = random.Random(5)
    frames, masks = make_sample.make_clip(num_frames=12, width=64, height=48)
    good_path = make_sample.write_prompts(tmp_path, masks, frames=(1, 3, 5))
    good = json.loads(good_path.read_text())
    results = {"refused": 0, "accepted": 0}
    for i in range(400):
        path = tmp_path / f"p{i}.json"
        if i % 2:
            path.write_text(mutate(good_path.read_text(), rng))
        else:
            path.write_text(json.dumps(structural_mutations(good, rng)))
        try:
            prompts = prompt_file.load(path, 12, 64, 48)
        except SegpipeError as e:
            assert "\n" not in e.message
            results["refused"] += 1
            continue
        for p in prompts:  # whatever is accepted is a usable prompt
            assert 0 <= p.frame < 12
            assert (p.points is None) == (p.labels is None)
            assert p.points is not None or p.box is not None or p.mask is not None
        results["accepted"] += 1
    assert results["refused"] > 200
    print(f"malformed prompt files: 400 cases, {results}")


def test_malformed_prompts_through_the_cli(tmp_path, sources):
    import segpipe as api

    store = tmp_path / "s.zarr"
    # decoded and encoded in this process (what `segpipe run` without prompts calls); the
    # refused commands run as commands
    api.run(
        sources / "clip.mp4",
        store,
        decoding=api.Decoding(chunk_size=8, image_size=64),
        encoding=api.Encoding(random_weights=0),
        execution=api.Execution(progress=False),
    )
    before = tree_digest(store)
    for text in [
        '{"prompts": [{"object": 1, "frame": 2, "points": [[1, 2]], "labels": [1]]',
        "[]",
        '{"prompts": [{"object": "a", "frame": 0, "box": [0, 0, 5, 5]}]}',
        "",
    ]:
        path = tmp_path / "bad.json"
        path.write_text(text)
        assert_user_error(segpipe("track", "--store", store, "--prompts", path))
        assert tree_digest(store) == before
