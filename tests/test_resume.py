"""Decode resumes without losing or shifting a frame, whatever the container's seeking, and
never takes an interruption for the end of the video."""

import shutil
import signal
import subprocess
import time
from pathlib import Path

import av
import make_sample
import numpy as np
import pytest
import zarr
from conftest import (
    assert_same_store,
    freeze,
    ledger_count,
    popen_segpipe,
    segpipe,
    spawn,
    wait_for,
)

from segpipe.settings import Decoding, Execution

ARGS = ("--chunk-size", 8, "--image-size", 64)
OPTIONS = dict(  # ARGS, as the API takes them
    decoding=Decoding(chunk_size=8, image_size=64), execution=Execution(progress=False)
)
FRAMES = 360
CHUNKS = FRAMES // 8

# Containers as users have them. Seeks are frame-exact in MP4 and MKV; in MPEG-TS they land
# a whole GOP late, in MPEG-4 AVI with B-frames a few frames late when the target lies just
# before a keyframe (with this GOP: resuming at chunks 17 and 34).
CONTAINERS = {
    "mp4": ("libx264", {"g": "48"}),
    "mkv": ("libx264", {"g": "48"}),
    "ts": ("libx264", {"g": "48"}),
    "avi": ("mpeg4", {"g": "46", "bf": "2"}),
    "h264": ("libx264", {"g": "48"}),  # a raw stream: no pts, resumed by counting frames
}
LATE = {"mp4": [], "mkv": [], "ts": list(range(1, CHUNKS)), "avi": [17, 34]}


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    out = tmp_path_factory.mktemp("containers")
    frames, _ = make_sample.make_clip(num_frames=FRAMES, width=320, height=240, seed=2)
    paths = {}
    for suffix, (codec, options) in CONTAINERS.items():
        paths[suffix] = out / f"clip.{suffix}"
        make_sample.write_video(paths[suffix], frames, codec=codec, encoder_options=options)
    return paths


def decode(video, store) -> None:
    """`segpipe decode VIDEO --store STORE` with ARGS, in this process: `segpipe.decode`, the
    call the command makes (what these tests need of the command, its kills and signals,
    they run as commands)."""
    import segpipe

    segpipe.decode(video, store, **OPTIONS)


@pytest.fixture(scope="module")
def references(videos, tmp_path_factory):
    out = tmp_path_factory.mktemp("refs")
    refs = {}
    for suffix, video in videos.items():
        refs[suffix] = out / f"{suffix}.zarr"
        decode(video, refs[suffix])
    return refs


def test_containers_really_seek_late(videos):
    """The premise: resuming at chunk k (seeking to frame 8k-1's pts), PyAV lands more than
    one frame late (frames would be lost) in MPEG-TS everywhere and in AVI at chunks 17, 34."""
    late = {}
    for suffix, video in videos.items():
        if suffix not in LATE:
            continue
        with av.open(str(video)) as c:
            pts = [f.pts for f in c.decode(video=0)]
        late[suffix] = []
        for k in range(1, CHUNKS):
            with av.open(str(video)) as c:
                s = c.streams.video[0]
                c.seek(pts[8 * k - 1], stream=s, backward=True, any_frame=False)
                first = next(c.decode(s), None)
            if first is None or first.pts > pts[8 * k]:
                late[suffix].append(k)
    assert late == LATE


def frozen_at(store, proc, target):
    """Stop the process the moment `target` decode chunks are done; the chunks done then."""
    assert wait_for(lambda: ledger_count(store, "decode") >= target, proc, timeout=120), (
        "decode ended before the kill"
    )
    freeze(proc)
    return ledger_count(store, "decode")


@pytest.mark.parametrize("suffix", list(CONTAINERS))
def test_kill_9_mid_decode_then_rerun_is_identical(videos, references, tmp_path, suffix):
    """The fault harness on decode: three SIGKILLs at different chunks, each landing while
    decoding, then a rerun: the store equals an uninterrupted decode, chunk files too."""
    store = tmp_path / "s.zarr"
    for target in (5, 17, 34):
        proc = popen_segpipe("decode", videos[suffix], "--store", store, *ARGS)
        done = frozen_at(store, proc, target)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert target <= done < CHUNKS, done  # the kill landed mid-decode
        assert "frame_count" not in zarr.open_group(str(store), mode="r").attrs
    segpipe("decode", videos[suffix], "--store", store, *ARGS, "--quiet", check=True)
    assert_same_store(references[suffix], store)


@pytest.mark.parametrize("suffix", ["ts", "avi", "h264"])
def test_every_resume_point_gives_the_same_frames(videos, references, tmp_path, suffix):
    """Resume at every chunk boundary (the state a crash after chunk k leaves)."""
    ref = zarr.open_group(str(references[suffix]), mode="r")
    for k in (1, 6, 12, 17, 18, 24, 34, 44):
        store = shutil.copytree(references[suffix], tmp_path / f"s{k}.zarr")
        group = zarr.open_group(str(store), mode="r+")
        del group.attrs["frame_count"]
        for name in ("frames", "pts", "timestamps"):
            group[name].resize((k * 8, *group[name].shape[1:]))
        group["ledger/decode"].resize((k,))
        decode(videos[suffix], store)
        got = zarr.open_group(str(store), mode="r")
        assert got.attrs["frame_count"] == FRAMES, k
        for name in ("frames", "pts"):
            assert np.array_equal(got[name][...], ref[name][...]), (k, name)


def test_a_short_chunk_without_the_frame_count_is_decoded_again(videos, references, tmp_path):
    """What the old code left after an interrupt taken for the end of the video: chunk 5
    holds 3 frames and is marked done, the frame count is not recorded. The rerun must not
    append the rest behind it."""
    store = shutil.copytree(references["mp4"], tmp_path / "s.zarr")
    group = zarr.open_group(str(store), mode="r+")
    del group.attrs["frame_count"], group.attrs["decode_warning"]  # both come after the chunks
    for name in ("frames", "pts", "timestamps"):
        group[name].resize((5 * 8 + 3, *group[name].shape[1:]))
    group["ledger/decode"].resize((6,))
    decode(videos["mp4"], store)
    assert_same_store(references["mp4"], store)


def test_double_ctrl_c_mid_decode_is_not_the_end_of_the_video(videos, references, tmp_path):
    """The second Ctrl-C abandons the chunk in flight: exit 130, the frame count stays
    unrecorded, and the rerun completes to the uninterrupted store."""
    store = tmp_path / "s.zarr"
    proc = spawn(
        ["decode", videos["ts"], "--store", store, *ARGS],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert wait_for(lambda: ledger_count(store, "decode") >= 3, proc, timeout=120)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.002)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "run the same command again" in err and "Traceback" not in err
    group = zarr.open_group(str(store), mode="r")
    assert "frame_count" not in group.attrs and ledger_count(store, "decode") < CHUNKS
    segpipe("decode", videos["ts"], "--store", store, *ARGS, "--quiet", check=True)
    assert_same_store(references["ts"], store)


def test_damage_met_while_resuming_a_decode_is_repaired(videos, references, tmp_path):
    """An unfinished decode whose last stored chunk is damaged: decode refuses (it reads that
    chunk's last pts to resume), repair redoes it and the decode goes on."""
    store = shutil.copytree(references["ts"], tmp_path / "s.zarr")
    group = zarr.open_group(str(store), mode="r+")
    del group.attrs["frame_count"], group.attrs["decode_warning"]
    for name in ("frames", "pts", "timestamps"):
        group[name].resize((10 * 8, *group[name].shape[1:]))
    group["ledger/decode"].resize((10,))
    Path(store, "pts", "c", "9").unlink()
    proc = segpipe("decode", videos["ts"], "--store", store, *ARGS)
    assert proc.returncode == 1 and "'pts' chunk 9 is missing" in proc.stderr, proc.stderr
    segpipe("repair", "--store", store, check=True)
    assert_same_store(references["ts"], store)


def test_repair_redecodes_a_chunk_of_a_late_seeking_container(videos, references, tmp_path):
    store = shutil.copytree(references["ts"], tmp_path / "s.zarr")
    Path(store, "frames", "c", "19", "0", "0", "0").unlink()
    proc = segpipe("repair", "--store", store, check=True)
    assert "'frames' chunk 19" in proc.stderr
    assert_same_store(references["ts"], store)
