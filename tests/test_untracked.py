"""One-pass tracking leaves frames no pass reaches: they are written as untracked, export as
empty, and repair mends them; damage in the chunk a pass writes only in part is repaired."""

import json
import shutil

import numpy as np
import pytest
import zarr
from conftest import IMAGE_SIZE, assert_same_store, segpipe
from PIL import Image

from segpipe.settings import Encoding, Execution, Tracking
from segpipe.stages.encode import encode
from segpipe.stages.track.stage import track
from segpipe.store.runstore import RunStore

C = 4
START = 9  # the earliest prompt of clip_dir's prompts: chunk 2 holds frames 8..11


@pytest.fixture(scope="module")
def encoded(tmp_path_factory, clip_dir, predictor):
    """The clip decoded (`segpipe.decode`, what `segpipe decode` calls) and encoded in
    chunks of C, in this process. Read-only: tests copy it."""
    import segpipe as api

    store = tmp_path_factory.mktemp("untracked") / "enc.zarr"
    api.decode(
        clip_dir / "clip.mp4",
        store,
        decoding=api.Decoding(chunk_size=C, image_size=IMAGE_SIZE),
        execution=api.Execution(progress=False),
    )
    encode(store, Encoding(random_weights=0), Execution(progress=False), predictor=predictor)
    return store


@pytest.fixture(scope="module")
def tracked(encoded, clip_dir, predictor, tmp_path_factory):
    """One tracked store per direction, never changed by the tests (they copy)."""
    out = {}
    for direction in ("forward", "reverse", "both"):
        store = shutil.copytree(encoded, tmp_path_factory.mktemp(direction) / "s.zarr")
        track(
            store,
            clip_dir / "prompts.json",
            Tracking(direction),
            execution=Execution(progress=False),
            predictor=predictor,
        )
        out[direction] = store
    return out


def chunk_file(store, name, k, obj=0):
    """Chunk k's file of object slot `obj` (one file per object)."""
    ndim = zarr.open_group(str(store), mode="r")[name].ndim
    return store.joinpath(name, "c", str(k), *[str(obj)] * (ndim > 1), *["0"] * (ndim - 2))


@pytest.mark.parametrize(
    "direction,untracked", [("forward", range(0, START)), ("reverse", range(START + 1, 40))]
)
def test_frames_no_pass_reaches_export_as_untracked(tracked, tmp_path, direction, untracked):
    store = shutil.copytree(tracked[direction], tmp_path / "s.zarr")  # exports change a store
    for name in ("masks", "object_scores", "object_areas", "tracked"):
        for k in range(10):
            for obj in range(3):  # a file per object
                assert chunk_file(store, name, k, obj).is_file(), (name, k, obj)
    reader = RunStore.open(store)
    tracked_frames = reader.read("tracked")  # per object
    assert not tracked_frames[list(untracked)].any() and tracked_frames[START].all()
    assert np.isnan(reader.read("object_scores")[list(untracked)]).all()
    assert not reader.read("object_areas")[list(untracked)].any()

    out = tmp_path / "davis"
    segpipe("export", "--store", store, "--format", "davis", "--out", out, check=True)
    for t in untracked:
        assert not np.asarray(Image.open(out / f"{t:05d}.png")).any(), t
    js = tmp_path / "masks.json"
    segpipe("export", "--store", store, "--format", "vis-json", "--out", js, check=True)
    for ann in json.loads(js.read_text())["annotations"]:
        assert all(ann["segmentations"][t] is None for t in untracked)
    assert "no damage found" in segpipe("repair", "--store", store, check=True).stderr


def test_a_damaged_untracked_chunk_is_repaired(tracked, tmp_path):
    store = shutil.copytree(tracked["forward"], tmp_path / "s.zarr")
    chunk_file(store, "masks", 0, obj=2).unlink()  # one object's file of the chunk
    data = bytearray(chunk_file(store, "object_scores", 1).read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk_file(store, "object_scores", 1).write_bytes(bytes(data))
    proc = segpipe("repair", "--store", store, check=True)
    assert "'masks' chunk 0" in proc.stderr and "'object_scores' chunk 1" in proc.stderr
    assert_same_store(tracked["forward"], store)
    assert "no damage found" in segpipe("repair", "--store", store, check=True).stderr


@pytest.mark.parametrize(
    "direction,name",
    [("forward", "masks"), ("reverse", "masks"), ("both", "masks"), ("both", "object_scores")],
)
def test_damage_in_the_start_chunk_is_repaired(tracked, tmp_path, direction, name):
    """Chunk 2 holds frames 8..11: passes write only part of it (reverse 8..9, forward 9..11),
    so the redo reads it first: the damaged file must be gone before. Masks: one object's
    file of the chunk is damaged."""
    reference = tracked[direction]
    store = shutil.copytree(reference, tmp_path / "s.zarr")
    path = chunk_file(store, name, START // C, obj=1 if name == "masks" else 0)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    proc = segpipe("repair", "--store", store)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{name!r} chunk {START // C}" in proc.stderr
    assert_same_store(reference, store)
    assert zarr.open_group(str(store), mode="r")["masks"].chunks[1] == 1
