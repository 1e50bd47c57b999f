"""An export's bytes do not depend on the order its chunks are exported in (in order,
reversed, shuffled, one per process as Dask tasks make them): the store's source reader
gives, for any range of frames and whatever it read before, the frames of a straight decode,
each checked against the pts the store holds for it."""

import itertools
import json
import random
import shutil

import av
import make_sample
import numpy as np
import pytest
import zarr
from av.video.frame import PictureType
from conftest import tree_digest

from segpipe.errors import StoreMismatch
from segpipe.settings import Decoding, Encoding, Execution, Tracking
from segpipe.sources.video import SEEK_BACKOFF_S
from segpipe.stages.decode import decode
from segpipe.stages.encode import encode
from segpipe.stages.export.stage import Export, export
from segpipe.stages.track.stage import track
from segpipe.store.runstore import RunStore
from segpipe.store.source import SourceReader

FRAMES, C = 18, 4
# B-frame H.264 (libx264's default, 3 B-frames) with a keyframe every 4 frames, in the
# containers whose seeks differ: frame-exact in MP4, late in MPEG-TS and in AVI.
CONTAINERS = ("mp4", "ts", "avi")
GOP = {"g": "4"}


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    root = tmp_path_factory.mktemp("order")
    frames, masks = make_sample.make_clip(num_frames=FRAMES, width=64, height=48, seed=1)
    videos = {}
    for suffix in CONTAINERS:
        videos[suffix] = root / f"clip.{suffix}"
        make_sample.write_video(videos[suffix], frames, encoder_options=GOP)
    return root, videos, masks


@pytest.fixture(scope="module")
def stores(clip):
    root, videos, _ = clip
    for suffix, video in videos.items():
        decode(video, root / f"{suffix}.zarr", Decoding(C, 32), quiet=True)
    return {suffix: root / f"{suffix}.zarr" for suffix in videos}


def straight(video):
    """(pts, full-resolution RGB, picture type, keyframe) of every frame, decoded from frame
    0 on by plain PyAV."""
    with av.open(str(video)) as container:
        return [
            (f.pts, np.asarray(f.to_image()), PictureType(f.pict_type), f.key_frame)
            for f in container.decode(video=0)
        ]


def late_seeks(video, decoded, chunk_size: int = C) -> list[int]:
    """The chunk starts lo where the container's keyframe seek to frame lo-1's pts lands
    after that frame (the reader must back off)."""
    index = {pts: t for t, (pts, *_) in enumerate(decoded)}
    late = []
    for lo in range(chunk_size, len(decoded), chunk_size):
        with av.open(str(video)) as container:
            stream = container.streams.video[0]
            container.seek(decoded[lo - 1][0], stream=stream, backward=True, any_frame=False)
            first = next(container.decode(stream), None)
        if first is None or index[first.pts] > lo - 1:
            late.append(lo)
    return late


def test_the_sources_have_b_frames_and_seek_late_in_ts_and_avi(clip):
    """The premise: B-frames and several keyframes in every source, and seeks that land
    late in MPEG-TS and AVI (so reading a chunk alone must back off), frame-exact in MP4."""
    _, videos, _ = clip
    late = {}
    for suffix, video in videos.items():
        decoded = straight(video)
        assert len(decoded) == FRAMES
        assert PictureType.B in {kind for _, _, kind, _ in decoded}, suffix
        assert sum(key for *_, key in decoded) >= 3, suffix
        late[suffix] = late_seeks(video, decoded)
    assert late["mp4"] == []
    assert late["ts"] and late["avi"], late


def assert_straight(got, decoded, lo, what):
    assert len(got) == min(C, len(decoded) - lo), what
    for i, (pts, _, picture) in enumerate(got):
        assert pts == decoded[lo + i][0], (what, lo + i)
        assert np.array_equal(np.asarray(picture()), decoded[lo + i][1]), (what, lo + i)


@pytest.mark.parametrize("suffix", CONTAINERS)
def test_every_range_read_alone_is_the_straight_decode(clip, stores, suffix):
    """From every chunk start (and every frame, as `--frames` ranges start), a fresh reader
    (a seek) gives the full-resolution RGB and pts of a straight decode from frame 0, bit
    for bit; so does one reader reading the chunks in order, reversed and shuffled."""
    _, videos, _ = clip
    decoded = straight(videos[suffix])
    store = RunStore.open(stores[suffix])
    for lo in range(FRAMES):
        got = list(SourceReader(store, videos[suffix]).frames(lo, min(C, FRAMES - lo)))
        assert_straight(got, decoded, lo, "alone")
    starts = list(range(0, FRAMES, C))
    shuffled = random.Random(0).sample(starts, len(starts))
    for order in (starts, starts[::-1], shuffled):
        reader = SourceReader(store, videos[suffix])
        for lo in order:
            got = list(reader.frames(lo, min(C, FRAMES - lo)))
            assert_straight(got, decoded, lo, order)


def test_a_seek_onto_a_picture_without_its_references_is_never_trusted(tmp_path):
    """MPEG-4 Part 2 in MPEG-TS with one keyframe: the reader's seeks (`SEEK_BACKOFF_S`: to
    frame lo-1 itself, then 2 s before it) land on P-frames whose references were never
    decoded, and FFmpeg's MPEG-4 decoder outputs them anyway, drawn on grey, with pts at or
    before frame lo-1's, so frame lo-1 comes out wrong. The reader refuses such a landing
    (the first frame must be a keyframe, and frame lo-1 must be the stored picture; either
    check alone suffices here) and still gives, from every start, a straight decode's
    frames."""
    frames, _ = make_sample.make_clip(num_frames=48, width=64, height=48, seed=1)
    video = tmp_path / "clip.ts"
    # one encoder thread: mpeg4's slice threads follow the CPUs, and so would its bytes
    options = {"g": "100", "threads": "1"}
    make_sample.write_video(video, frames, fps=12, codec="mpeg4", encoder_options=options)
    decoded = straight(video)
    assert sum(key for *_, key in decoded) == 1
    torn = {back: [] for back in SEEK_BACKOFF_S[:2]}  # starts whose seek draws frame lo-1 wrong
    for back in torn:
        for lo in range(C, len(decoded), C):
            with av.open(str(video)) as container:  # the reader's seek (`_seek_frames`)
                stream = container.streams.video[0]
                before = decoded[lo - 1][0]
                target = max(0, before - int(back / stream.time_base))
                container.seek(target, stream=stream, backward=True, any_frame=False)
                seen = list(itertools.takewhile(lambda f: f.pts <= before, container.decode()))
            if seen and not seen[0].key_frame and seen[-1].pts == before:
                if not np.array_equal(np.asarray(seen[-1].to_image()), decoded[lo - 1][1]):
                    torn[back].append(lo)
    assert all(torn.values()), f"the premise: seeks that land on torn pictures ({torn})"
    decode(video, tmp_path / "s.zarr", Decoding(C, 32), quiet=True)
    store = RunStore.open(tmp_path / "s.zarr")
    for lo in range(C, len(decoded), C):
        got = list(SourceReader(store, video).frames(lo, min(C, len(decoded) - lo)))
        assert_straight(got, decoded, lo, "alone")


def test_a_frame_whose_pts_is_not_the_stored_one_is_refused(clip, stores, tmp_path):
    """The reader checks every frame's pts against the store's, whether it seeks or reads
    on: a store whose pts for frame 9 differ from what the source gives is refused in one
    line naming the frame."""
    _, videos, _ = clip
    store_path = shutil.copytree(stores["ts"], tmp_path / "s.zarr")
    pts = zarr.open_array(str(store_path / "pts"), mode="r+")
    pts[9] = int(pts[9]) + 1
    store = RunStore.open(store_path)
    with pytest.raises(StoreMismatch, match="frame 9 of"):
        list(SourceReader(store, videos["ts"]).frames(8, C))  # a seek to frame 7
    reader = SourceReader(store, videos["ts"])
    for lo in (0, 4):
        list(reader.frames(lo, C))
    with pytest.raises(StoreMismatch, match="frame 9 of"):
        list(reader.frames(8, C))  # read on


@pytest.fixture(scope="module")
def tracked(clip, stores, tmp_path_factory):
    """The MPEG-TS store tracked (one object, both directions, random weights)."""
    _, _, masks = clip
    root = tmp_path_factory.mktemp("tracked")
    store = shutil.copytree(stores["ts"], root / "s.zarr")
    prompts = root / "prompts.json"
    box = make_sample.bbox(masks[8, 0])
    prompts.write_text(json.dumps({"prompts": [{"object": 1, "frame": 8, "box": box}]}))
    encode(store, Encoding(random_weights=0), Execution(progress=False))
    track(store, prompts, Tracking("both"), execution=Execution(progress=False))
    return store


def exported(tracked, folder, fmt, order):
    """The export of a copy of `tracked` with its chunks exported in `order`: None for the
    export command (one process, in order), "reversed" (one process), "tasks" (shuffled,
    each chunk by its own Export, as Dask tasks make them)."""
    store = shutil.copytree(tracked, folder / "s.zarr")
    out = folder / {"overlay": "overlay.mp4", "frames": "frames"}[fmt]
    if order is None:
        export(store, fmt, out, quiet=True)
    else:
        job = Export(RunStore.open(store), fmt, out)
        chunks = job.chunks[::-1] if order == "reversed" else job.chunks
        if order == "tasks":
            chunks = random.Random(1).sample(chunks, len(chunks))
        for k in chunks:
            (job if order == "reversed" else Export(job.store, fmt, out, recorded=True)).chunk(k)
        job.run(quiet=True)  # the finish
    return tree_digest(out) if out.is_dir() else out.read_bytes()


@pytest.mark.parametrize("fmt", ["overlay", "frames"])
def test_an_export_is_the_same_bytes_in_any_chunk_order(tracked, tmp_path, fmt):
    """The overlay (MP4, and its JPEG frames) of a store made from a B-frame MPEG-TS source
    has the same bytes with its chunks exported in order, reversed, or shuffled one per
    Export (each a seek that lands late and backs off)."""
    outs = {
        order: exported(tracked, tmp_path / str(order), fmt, order)
        for order in (None, "reversed", "tasks")
    }
    assert outs[None]
    assert outs["reversed"] == outs[None]
    assert outs["tasks"] == outs[None]
