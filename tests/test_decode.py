import signal

import av
import make_sample
import numpy as np
import pytest
import zarr
from conftest import (
    IMAGE_SIZE,
    assert_user_error,
    ledger_count,
    popen_segpipe,
    segpipe,
    tree_digest,
    tree_mtimes,
    wait_for,
)
from PIL import Image


def read_frames(path):
    with av.open(str(path)) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])


def test_lossless_clip_decodes_to_pil_resized_source(tmp_path):
    frames, _ = make_sample.make_clip(num_frames=11, width=96, height=64)
    video = tmp_path / "clip.mkv"
    make_sample.write_video(video, frames, codec="ffv1")
    assert np.array_equal(read_frames(video), frames)  # the source really is lossless
    segpipe(
        "decode",
        video,
        "--store",
        tmp_path / "s.zarr",
        "--chunk-size",
        4,
        "--image-size",
        64,
        check=True,
    )
    group = zarr.open_group(str(tmp_path / "s.zarr"), mode="r")
    expected = np.stack([np.asarray(Image.fromarray(f).resize((64, 64))) for f in frames])
    assert group.attrs["frame_count"] == 11
    assert group["frames"].shape == (11, 64, 64, 3) and group["frames"].chunks == (4, 64, 64, 3)
    assert np.array_equal(group["frames"][...], expected)
    assert np.allclose(np.diff(group["timestamps"][...]), 1 / 24, atol=1e-3)  # mkv: ms ticks


@pytest.fixture(scope="module")
def long_clip(tmp_path_factory):
    out = tmp_path_factory.mktemp("long")
    frames, _ = make_sample.make_clip(num_frames=400, width=320, height=240)
    make_sample.write_video(out / "long.mp4", frames)
    return out / "long.mp4"


def test_kill_mid_decode_then_resume_is_identical(tmp_path, long_clip):
    ref, store = tmp_path / "ref.zarr", tmp_path / "killed.zarr"
    args = ("--chunk-size", 8, "--image-size", IMAGE_SIZE)
    segpipe("decode", long_clip, "--store", ref, *args, check=True)
    proc = popen_segpipe("decode", long_clip, "--store", store, *args)
    assert wait_for(lambda: ledger_count(store, "decode") >= 5, proc), (
        "decode ended before the kill"
    )
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = ledger_count(store, "decode")
    assert killed_at < 50  # 400 frames / 8: killed part-way
    segpipe("decode", long_clip, "--store", store, *args, check=True)
    a, b = zarr.open_group(str(ref), mode="r"), zarr.open_group(str(store), mode="r")
    assert dict(a.attrs) == dict(b.attrs)
    for name in ("frames", "pts", "timestamps", "ledger/decode"):
        assert np.array_equal(a[name][...], b[name][...], equal_nan=name == "timestamps"), name

    before, mtimes = tree_digest(store), tree_mtimes(store)
    proc = segpipe("decode", long_clip, "--store", store, *args, check=True)
    assert "already complete" in proc.stderr
    assert tree_digest(store) == before and tree_mtimes(store) == mtimes  # wrote nothing


def test_crash_after_the_last_short_chunk_resumes_to_the_same_store(tmp_path, clip_dir):
    """The state a kill leaves between the final chunk's commit and the frame count."""
    ref, store = tmp_path / "ref.zarr", tmp_path / "s.zarr"
    args = ("--chunk-size", 7, "--image-size", 64)  # 40 frames: the last chunk holds 5
    segpipe("decode", clip_dir / "clip.mp4", "--store", ref, *args, check=True)
    segpipe("decode", clip_dir / "clip.mp4", "--store", store, *args, check=True)
    group = zarr.open_group(str(store), mode="r+")
    del group.attrs["frame_count"]
    segpipe("decode", clip_dir / "clip.mp4", "--store", store, *args, check=True)
    a, b = zarr.open_group(str(ref), mode="r"), zarr.open_group(str(store), mode="r")
    assert b.attrs["frame_count"] == 40 and dict(a.attrs) == dict(b.attrs)
    for name in ("frames", "pts", "timestamps"):
        assert np.array_equal(a[name][...], b[name][...]), name


def test_truncated_video_decodes_what_exists(tmp_path, long_clip):
    data = long_clip.read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: len(data) * 6 // 10])  # faststart: the index is at the front
    proc = segpipe("decode", cut, "--store", tmp_path / "s.zarr", "--image-size", 64, check=True)
    group = zarr.open_group(str(tmp_path / "s.zarr"), mode="r")
    T = group.attrs["frame_count"]
    assert 0 < T < 400 and group["frames"].shape[0] == T
    assert "truncated" in proc.stderr and "truncated" in group.attrs["decode_warning"]
    full = read_frames(long_clip)[:T]
    first = np.asarray(Image.fromarray(full[0]).resize((64, 64)))
    assert np.array_equal(group["frames"][0], first)


# -- bad input: one-line error, non-zero exit, no traceback, the existing store unchanged ---


@pytest.fixture
def good_store(tmp_path, clip_dir):
    store = tmp_path / "good.zarr"
    segpipe(
        "decode",
        clip_dir / "clip.mp4",
        "--store",
        store,
        "--chunk-size",
        8,
        "--image-size",
        64,
        check=True,
    )
    return store


def zero_frame_video(path):
    """An AVI with a video stream header and no frames."""
    out = av.open(str(path), "w")
    stream = out.add_stream("mpeg4", rate=24)
    stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
    out.start_encoding()
    out.close()
    return path


@pytest.mark.parametrize(
    "case",
    ["missing", "not_a_video", "zero_frames", "chunk_size_0", "other_video", "other_chunk_size"],
)
def test_bad_input_leaves_store_intact(tmp_path, clip_dir, good_store, case):
    video, args = clip_dir / "clip.mp4", []
    words = ()
    if case == "missing":
        video, words = tmp_path / "nope.mp4", ("not found", "nope.mp4")
    elif case == "not_a_video":
        video = tmp_path / "notes.mp4"
        video.write_text("these are not frames\n" * 50)
        words = ("not a readable video",)
    elif case == "zero_frames":
        video, words = zero_frame_video(tmp_path / "empty.avi"), ("no decodable frames",)
    elif case == "chunk_size_0":
        args, words = ["--chunk-size", 0], ("--chunk-size",)
    elif case == "other_video":
        frames, _ = make_sample.make_clip(num_frames=5, width=64, height=48, seed=3)
        video = tmp_path / "other.mp4"
        make_sample.write_video(video, frames)
        words = ("another video",)
    elif case == "other_chunk_size":
        args, words = ["--chunk-size", 16], ("chunk_size",)
    before = tree_digest(good_store)
    proc = segpipe("decode", video, "--store", good_store, *args)
    assert_user_error(proc, *words)
    assert tree_digest(good_store) == before
    # the same input against a fresh store path creates nothing (except for a video that is fine)
    if case not in ("other_video", "other_chunk_size"):
        fresh = tmp_path / "fresh.zarr"
        assert_user_error(segpipe("decode", video, "--store", fresh, *args), *words)
        assert not fresh.exists()


def test_store_path_that_is_a_file(tmp_path, clip_dir):
    plain = tmp_path / "plain.txt"
    plain.write_text("keep me")
    proc = segpipe("decode", clip_dir / "clip.mp4", "--store", plain)
    assert_user_error(proc, "is a file")
    assert plain.read_text() == "keep me"


def test_status_reports_chunks_and_bytes(good_store):
    import json

    proc = segpipe("status", "--store", good_store, "--json", check=True)
    report = json.loads(proc.stdout)
    assert report["stages"]["decode"] == {"done": 5, "total": 5}
    assert report["bytes"]["frames"] > 0
    text = segpipe("status", "--store", good_store, check=True).stdout
    assert "decode" in text and "5 / 5" in text


@pytest.mark.parametrize("command", ["decode", "encode", "track", "run", "status"])
def test_every_command_has_help_with_an_example(command):
    proc = segpipe(command, "--help", check=True)
    assert "Example" in proc.stdout and "segpipe " + command in proc.stdout
