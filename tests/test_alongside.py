"""`segpipe run` tracks as the video decodes (`stages.alongside`): the passes start once the
chunks they need are decoded, to the frame count the container records, and the masks are
those of a run on a store decoded first, and SAM 2's. A kill with the decode in flight
resumes to the same store; a container that counts frames it does not show, or fewer
than it holds, is tracked again on the frames decoded."""

import re
import struct
import subprocess
import threading
import time
from fractions import Fraction

import make_sample
import pytest
import zarr
from conftest import (
    IMAGE_SIZE,
    assert_same_store,
    assert_user_error,
    freeze,
    ledger_records,
    run_args,
    run_in_process,
    segpipe,
    spawn,
    tree_digest,
    wait_for,
)
from oracle import assert_tracked_as_sam2, oracle_tracking

from segpipe.settings import from_options

LAST = 5  # the small clip's last chunk: 24 frames in chunks of 4


def export_files(store) -> dict:
    return tree_digest(store.with_name(store.name.removesuffix(".zarr") + ".export"))


def staged_run(small, store, video=None, **options):
    """`run` on a store decoded first (`segpipe.decode`): nothing decodes alongside."""
    import segpipe as api

    video = small / "clip.mp4" if video is None else video
    api.decode(
        video,
        store,
        decoding=api.Decoding(chunk_size=4, image_size=IMAGE_SIZE),
        execution=api.Execution(progress=False),
    )
    run_in_process(small, store, video, **options)
    return store


@pytest.fixture(scope="module")
def staged(small, tmp_path_factory):
    return staged_run(small, tmp_path_factory.mktemp("staged") / "run.zarr")


@pytest.mark.parametrize("keep", ["all", "masks"])
def test_the_tracking_starts_while_the_video_decodes(small, staged, tmp_path, keep):
    """Timestamps from a real run: decode is held before it writes the last chunk until the
    forward pass has committed chunk 2 (no other pass visits it: it could be exported).
    Were the video decoded before the tracking, nothing could be tracked while the commit
    is held, and the held commit would give up (the run fails). The first frame is tracked
    on the main thread, the chunk committed on another, after it. No chunk is exported
    before the video is decoded (the overlay's frame times are the whole video's); the
    results are those of a run on a store decoded first, and SAM 2's."""
    from segpipe.stages.export.as_tracked import ExportsAsTracked
    from segpipe.stages.export.stage import Export
    from segpipe.stages.track.tracker import Tracker
    from segpipe.store.runstore import RunStore

    commit, track_frame = RunStore.commit, Tracker.track_frame
    committed, export_chunk = ExportsAsTracked.committed, Export.chunk
    exportable = threading.Event()
    seen = {}

    def held_commit(self, stage, chunk, *args, **kwargs):
        commit(self, stage, chunk, *args, **kwargs)
        if stage == "decode":
            seen["decode", chunk] = (time.perf_counter(), threading.get_ident())
        if stage == "decode" and chunk == LAST - 1:  # (the last chunk not yet written)
            assert exportable.wait(120), "nothing was tracked before the whole video was decoded"

    def timed_frame(self, f, *args):
        out = track_frame(self, f, *args)
        seen.setdefault("first tracked", (time.perf_counter(), threading.get_ident()))
        return out

    def watched_commit(self, direction, k):
        committed(self, direction, k)
        if (direction, k) == ("forward", 2):
            exportable.set()

    def timed_export(self, k, *args, **kwargs):
        seen.setdefault("first exported", time.perf_counter())
        return export_chunk(self, k, *args, **kwargs)

    RunStore.commit, Tracker.track_frame = held_commit, timed_frame
    ExportsAsTracked.committed, Export.chunk = watched_commit, timed_export
    try:
        store = tmp_path / "run.zarr"
        run_in_process(small, store, keep=keep)
    finally:
        RunStore.commit, Tracker.track_frame = commit, track_frame
        ExportsAsTracked.committed, Export.chunk = committed, export_chunk
    first, tracker = seen["first tracked"]
    last, decoder = seen["decode", LAST]
    assert tracker == threading.main_thread().ident != decoder
    assert first < last < seen["first exported"]
    assert zarr.open_group(str(store), mode="r").attrs["frame_count"] == 24
    # (under --keep masks, no frames or features kept, nor their ledgers)
    skip = ("frames", "features", "ledger/") if keep == "masks" else ()
    assert_same_store(staged, store, skip=skip, skip_attrs=("output",))
    assert export_files(store) == export_files(staged)
    assert_tracked_as_sam2(store, oracle_tracking(staged, small / "prompts.json"))


HELD = """
import sys
sys.path.insert(0, "tests")
import kill_points

kill_points.wait_before_write("/ledger/decode/", 5, sys.argv[1])  # (chunk 4's record)
kill_points.cli(sys.argv[2:])
"""


def test_kill_9_while_the_video_decodes_alongside_then_rerun(small, staged, tmp_path):
    """decode's record of chunk 4 is held (its frames written) while the forward pass, from
    chunk 1, tracks what is decoded: a kill -9 once it has committed a chunk lands with
    both at work, and no frame count recorded. The rerun resumes both and ends as a run on
    a store decoded first."""
    store = tmp_path / "run.zarr"
    proc = spawn(
        [tmp_path / "never", *run_args(small, store)],
        code=HELD,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        mid = wait_for(lambda: 1 in ledger_records(store, "track_forward"), proc, timeout=300)
        freeze(proc)
        decoded = set(ledger_records(store, "decode"))
        forward = set(ledger_records(store, "track_forward"))
    finally:
        proc.kill()
        proc.wait()
    assert mid, "the forward pass committed nothing while decode's chunk 4 was held"
    assert decoded == {0, 1, 2, 3} and (store / "frames" / "c" / "4").is_dir()
    assert forward <= {1, 2, 3}, forward
    assert "frame_count" not in zarr.open_group(str(store), mode="r").attrs
    # tracked, not decoded: status shows the passes' totals unknown, export and repair say
    # what to do, and nothing changes
    before = tree_digest(store)
    status = segpipe("status", "--store", store, check=True).stdout
    assert re.search(r"track_forward +\d+ / \?", status), status
    export = segpipe("export", "--store", store, "--format", "davis", "--out", tmp_path / "d")
    assert_user_error(export, "not fully decoded")
    repair = segpipe("repair", "--store", store)
    assert_user_error(repair, "decoded and tracked at once", "run `segpipe run` again")
    assert tree_digest(store) == before
    run_in_process(small, store)
    assert_same_store(staged, store)
    assert export_files(store) == export_files(staged)


def test_a_container_counting_frames_it_does_not_show_is_tracked_on_those_decoded(small, tmp_path):
    """An editor's cut: the MP4 still counts the 5 frames its edit list hides, 24 where 19
    decode. The tracking starts on the 24 and meets the short chunk; the run then tracks
    again on the 19, and ends as a run on a store decoded first."""
    from test_sources import encode, trimmed_copy

    frames, _ = make_sample.make_clip(num_frames=24, width=96, height=72, seed=1)
    cut = trimmed_copy(encode(tmp_path / "src.mp4", frames), tmp_path / "cut.mp4", drop=5)
    (tmp_path / "staged").mkdir()
    reference = staged_run(small, tmp_path / "staged" / "run.zarr", cut)
    assert zarr.open_group(str(reference), mode="r").attrs["frame_count"] == 19
    (tmp_path / "alongside").mkdir()  # (each store in a folder of its own, as they compare)
    store = tmp_path / "alongside" / "run.zarr"
    args = run_args(small, store)
    proc = segpipe(args[0], cut, *args[2:], check=True)
    assert "decodes to 19 frames, not the 24 the container records" in proc.stderr
    assert_same_store(reference, store)
    assert export_files(store) == export_files(reference)


def avi_claiming(path, frames, claimed: int):
    """An MJPEG AVI of `frames` whose headers count `claimed` of them (its index holds them
    all): a video that decodes past the count its container records."""
    import av

    with av.open(str(path), "w") as out:
        stream = out.add_stream("mjpeg", rate=Fraction(24))
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuvj420p"
        for img in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    data = bytearray(path.read_bytes())
    # the stream header's length follows its type, handler, flags, priority and language,
    # initial frames, scale, rate and start; the main header's total frames follows its
    # microseconds per frame, bytes per second, padding and flags
    strh, avih = data.find(b"strh") + 8, data.find(b"avih") + 8
    data[strh + 32 : strh + 36] = data[avih + 16 : avih + 20] = struct.pack("<I", claimed)
    path.write_bytes(data)
    with av.open(str(path)) as c:
        assert c.streams.video[0].frames == claimed
        assert sum(1 for _ in c.decode(video=0)) == len(frames)
    return path


@pytest.mark.parametrize("claimed", [22, 20])
def test_a_container_counting_fewer_frames_than_it_holds(tmp_path, claimed):
    """An AVI whose headers count 22 (or 20) of its 24 frames: the tracking starts on the
    count. 22: chunk 5, 2 frames by the count, decodes to 4, which stops the tracking; 20:
    the tracking ends, and then the decode, past the count. Either way the run tracks
    again on the 24, and ends as a run on a store decoded first."""
    import segpipe as api

    frames, masks = make_sample.make_clip(num_frames=24, width=96, height=72, seed=1)
    video = avi_claiming(tmp_path / "clip.avi", frames, claimed)
    prompts = make_sample.write_prompts(tmp_path, masks, frames=(5, 8, 11))
    (tmp_path / "staged").mkdir()  # (each store in a folder of its own, as they compare)
    reference = tmp_path / "staged" / "run.zarr"
    api.decode(
        video,
        reference,
        decoding=api.Decoding(chunk_size=4, image_size=IMAGE_SIZE),
        execution=api.Execution(progress=False),
    )
    api.run(video, reference, prompts, **from_options(SETTINGS))
    assert zarr.open_group(str(reference), mode="r").attrs["frame_count"] == 24
    (tmp_path / "alongside").mkdir()
    store = tmp_path / "alongside" / "run.zarr"
    proc = segpipe(*cli_run(video, store, prompts), check=True)
    assert f"decode: alongside the tracking ({claimed} frames, as the container rec" in proc.stderr
    said = f"decodes to 24 frames, not the {claimed} the container records: tracking again on 24"
    assert said in proc.stderr, proc.stderr
    assert_same_store(reference, store)
    assert export_files(store) == export_files(reference)


def test_a_prompt_past_the_frames_a_container_counts(tmp_path, monkeypatch):
    """The same AVI (22 of 24 frames counted), object 3 prompted on frame 23. `segpipe run`
    refuses it at once, nothing written (the container's claims are all it has then);
    decoded first, the store's 24 frames admit it. Where the first check lets such a
    prompt through (a duration claiming more frames than the count: here the check is
    left out), the run decodes the video before the tracking, to the same store; a
    prompt past the frames decoded too is then refused, the video decoded, nothing
    else made."""
    import segpipe as api
    from segpipe import runner
    from segpipe.errors import BadInput

    frames, masks = make_sample.make_clip(num_frames=24, width=96, height=72, seed=1)
    video = avi_claiming(tmp_path / "clip.avi", frames, 22)
    prompts = make_sample.write_prompts(tmp_path, masks, frames=(5, 8, 23))
    (tmp_path / "refused").mkdir()
    refused = segpipe(*cli_run(video, tmp_path / "refused" / "run.zarr", prompts))
    assert_user_error(refused, "frame 23 is out of range")
    assert list((tmp_path / "refused").iterdir()) == []
    (tmp_path / "staged").mkdir()  # (each store in a folder of its own, as they compare)
    reference = tmp_path / "staged" / "run.zarr"
    api.decode(
        video,
        reference,
        decoding=api.Decoding(chunk_size=4, image_size=IMAGE_SIZE),
        execution=api.Execution(progress=False),
    )
    api.run(video, reference, prompts, **from_options(SETTINGS))
    (tmp_path / "alongside").mkdir()
    store = tmp_path / "alongside" / "run.zarr"
    monkeypatch.setattr(runner, "check_prompts", lambda *args, **kwargs: None)
    api.run(video, store, prompts, **from_options(SETTINGS))
    assert_same_store(reference, store)
    assert export_files(store) == export_files(reference)

    (tmp_path / "beyond").mkdir()
    beyond = tmp_path / "beyond" / "run.zarr"
    prompts = make_sample.write_prompts(tmp_path / "beyond", masks, frames=(5, 8, 23))
    text = prompts.read_text().replace('"frame": 23', '"frame": 30')
    prompts.write_text(text)
    with pytest.raises(BadInput, match="frame 30 is out of range: the video has frames 0..23"):
        api.run(video, beyond, prompts, **from_options(SETTINGS))
    attrs = zarr.open_group(str(beyond), mode="r").attrs
    assert attrs["frame_count"] == 24 and "model" not in attrs and "track" not in attrs


# settings by name (`segpipe.settings.from_options`)
SETTINGS = dict(chunk_size=4, image_size=IMAGE_SIZE, random_weights=0, progress=False)


def cli_run(video, store, prompts) -> tuple:
    return ("run", video, "--store", store, "--prompts", prompts, "--chunk-size", 4,
            "--image-size", IMAGE_SIZE, "--random-weights", 0)  # fmt: skip
