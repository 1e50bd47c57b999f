"""Video as users have it: portrait phone video, frame folders (SAM 2's own input), trimmed
files, two video streams, variable frame rates, odd sizes, a mid-stream size change."""

import json
import shutil
from fractions import Fraction

import av
import make_sample
import numpy as np
import pytest
import zarr
from conftest import IMAGE_SIZE, assert_user_error, segpipe
from oracle import oracle_tracking, same_bits
from PIL import Image

from segpipe.settings import Encoding, Execution, Tracking

S = 64


def encode(path, frames, rate=24, rotation=None, times=None, codec="libx264", time_base=None):
    """Write frames with PyAV; `rotation` as a display matrix, `times` as pts."""
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=Fraction(rate))
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p" if stream.width % 2 == stream.height % 2 == 0 else "yuv444p"
        if codec == "libx264":
            stream.options = {"crf": "18", "preset": "veryfast"}
        if rotation is not None:
            stream.set_display_rotation(rotation)
        if time_base is not None:
            stream.time_base = stream.codec_context.time_base = time_base
        for t, img in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            if times is not None:
                frame.pts, frame.time_base = times[t], time_base
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


def coded_frames(path, stream=0):
    with av.open(str(path)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=stream)]


def stored(store):
    return zarr.open_group(str(store), mode="r")


def resized(images):
    return np.stack([np.asarray(Image.fromarray(a).resize((S, S))) for a in images])


@pytest.fixture(scope="module")
def clip():
    frames, _ = make_sample.make_clip(num_frames=12, width=96, height=64)
    return frames


@pytest.mark.parametrize("rotation", [90, 180, 270])
def test_portrait_video_is_stored_upright(clip, tmp_path, rotation):
    video = encode(tmp_path / "phone.mp4", clip, rotation=rotation)
    store = tmp_path / "s.zarr"
    proc = segpipe(
        "decode", video, "--store", store, "--image-size", S, "--chunk-size", 5, check=True
    )
    upright = [np.rot90(a, k=rotation // 90) for a in coded_frames(video)]
    group = stored(store)
    assert np.array_equal(group["frames"][...], resized(upright))
    video_attrs = group.attrs["video"]
    H, W = upright[0].shape[:2]
    assert (video_attrs["width"], video_attrs["height"], video_attrs["rotation"]) == (
        W,
        H,
        rotation,
    )
    assert "rotated" in proc.stderr and group.attrs["decode_warning"] is None


def test_a_rotated_video_tracks_and_exports_upright(clip, tmp_path):
    """Prompts, masks and every export live in the displayed (upright) frame."""
    video = encode(tmp_path / "phone.mp4", clip, rotation=90)  # coded 96x64, shown 64x96
    store = tmp_path / "s.zarr"
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps({"prompts": [{"object": 1, "frame": 2, "box": [5, 60, 40, 90]}]}))
    segpipe(
        "run",
        video,
        "--store",
        store,
        "--prompts",
        prompts,
        "--image-size",
        S,
        "--chunk-size",
        5,
        "--random-weights",
        0,
        "--export",
        "davis,overlay",
        "--quiet",
        check=True,
    )
    assert stored(store)["masks"].shape == (12, 1, 96, 64)
    folder = tmp_path / "s.export"
    assert Image.open(folder / "davis" / "00000.png").size == (64, 96)
    assert [f.shape for f in coded_frames(folder / "overlay.mp4")] == [(96, 64, 3)] * 12


def test_rotation_is_counter_clockwise_as_players_show_it(tmp_path):
    """A marker in the coded top-left corner, rotation 90 (counter-clockwise): a player
    shows it in the bottom-left corner."""
    frames = np.zeros((2, 64, 96, 3), np.uint8)
    frames[:, :16, :16] = 255
    video = encode(tmp_path / "m.mp4", frames, rotation=90)
    store = tmp_path / "s.zarr"
    segpipe("decode", video, "--store", store, "--image-size", S, check=True)
    img = stored(store)["frames"][0].mean(-1)
    assert img[-8:, :8].mean() > 200 and img[:8, :8].mean() < 50 and img[-8:, -8:].mean() < 50


def trimmed_copy(src, dst, drop):
    """A stream-copy cut as editors make it: the GOP's first `drop` frames stay in the file
    as packets with negative times, and the MP4 edit list hides them."""
    with av.open(str(src)) as inp, av.open(str(dst), "w") as out:
        istream = inp.streams.video[0]
        ostream = out.add_stream_from_template(istream)
        offset = None
        for packet in inp.demux(istream):
            if packet.dts is None:
                continue
            if offset is None:
                offset = drop * int(1 / (istream.average_rate * istream.time_base))
            packet.pts -= offset
            packet.dts -= offset
            packet.stream = ostream
            out.mux(packet)
    return dst


def test_an_edit_list_trim_gives_no_false_truncation_warning(clip, tmp_path):
    src = encode(tmp_path / "src.mp4", np.concatenate([clip, clip]))
    cut = trimmed_copy(src, tmp_path / "cut.mp4", drop=5)
    shown = len(coded_frames(cut))
    with av.open(str(cut)) as c:
        assert c.streams.video[0].frames > shown  # the container still counts the cut frames
    store = tmp_path / "s.zarr"
    proc = segpipe("decode", cut, "--store", store, "--image-size", S, check=True)
    assert stored(store).attrs["frame_count"] == shown
    assert "truncated" not in proc.stderr and stored(store).attrs["decode_warning"] is None


def test_mkv_truncation_is_noticed_from_its_duration(tmp_path):
    frames, _ = make_sample.make_clip(num_frames=120, width=96, height=64)
    whole = tmp_path / "whole.mkv"
    make_sample.write_video(whole, frames)
    store = tmp_path / "whole.zarr"
    proc = segpipe("decode", whole, "--store", store, "--image-size", S, check=True)
    assert "truncated" not in proc.stderr and stored(store).attrs["frame_count"] == 120
    data = whole.read_bytes()
    cut = tmp_path / "cut.mkv"
    cut.write_bytes(data[: len(data) // 2])  # the duration is in the header, at the front
    proc = segpipe("decode", cut, "--store", tmp_path / "cut.zarr", "--image-size", S, check=True)
    assert "truncated" in proc.stderr


def test_two_video_streams_say_which_and_choose(clip, tmp_path):
    video = tmp_path / "two.mkv"
    small = clip[:, ::2, ::2].copy()
    with av.open(str(video), "w") as out:
        streams = []
        for frames in (clip, small):
            s = out.add_stream("libx264", rate=24)
            s.width, s.height, s.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
            streams.append((s, frames))
        for t in range(len(clip)):
            for s, frames in streams:
                for packet in s.encode(av.VideoFrame.from_ndarray(frames[t], format="rgb24")):
                    out.mux(packet)
        for s, _ in streams:
            for packet in s.encode():
                out.mux(packet)
    proc = segpipe("decode", video, "--store", tmp_path / "a.zarr", "--image-size", S, check=True)
    assert "2 video streams" in proc.stderr and "using #0" in proc.stderr
    assert stored(tmp_path / "a.zarr").attrs["video"]["width"] == 96
    segpipe(
        "decode",
        video,
        "--store",
        tmp_path / "b.zarr",
        "--image-size",
        S,
        "--stream",
        1,
        check=True,
    )
    group = stored(tmp_path / "b.zarr")
    assert (group.attrs["video"]["width"], group.attrs["video"]["stream"]) == (48, 1)
    assert np.array_equal(group["frames"][...], resized(coded_frames(video, 1)))
    assert_user_error(
        segpipe("decode", video, "--store", tmp_path / "c.zarr", "--stream", 5), "--stream 5"
    )


@pytest.fixture(scope="module")
def overlay_store(tmp_path_factory):
    """A tracked store of a variable-frame-rate, odd-sized clip (161x121)."""
    from segpipe.stages.encode import encode as encode_stage
    from segpipe.stages.track.stage import track

    root = tmp_path_factory.mktemp("vfr")
    frames, masks = make_sample.make_clip(num_frames=10, width=161, height=121)
    times = [0, 40, 120, 160, 300, 340, 380, 500, 540, 700]  # ms
    video = encode(root / "vfr.mp4", frames, times=times, time_base=Fraction(1, 1000))
    make_sample.write_prompts(root, masks, frames=(1, 2, 3))
    store = root / "s.zarr"
    segpipe("decode", video, "--store", store, "--image-size", S, "--chunk-size", 4, check=True)
    encode_stage(store, Encoding(random_weights=0), Execution(progress=False))
    track(store, root / "prompts.json", execution=Execution(progress=False))
    return store, video, times


def test_vfr_timing_is_kept_in_store_overlay_and_vis_json(overlay_store, tmp_path):
    store, video, times = overlay_store
    assert np.allclose(stored(store)["timestamps"][...], np.array(times) / 1000)
    out = tmp_path / "o.mp4"
    segpipe("export", "--store", store, "--format", "overlay", "--out", out, check=True)
    with av.open(str(out)) as c:
        s = c.streams.video[0]
        assert (s.codec_context.name, s.format.name, s.width, s.height) == (
            "h264",
            "yuv420p",
            162,
            122,
        )
        got = [float(f.pts * s.time_base) for f in c.decode(s)]
    assert np.allclose(got, np.array(times) / 1000, atol=1e-3), got
    assert stored(store).attrs["exports"]["overlay"]["size"] == [162, 122]
    part = tmp_path / "part.mp4"  # a range starting inside a chunk keeps its timing too
    segpipe(
        "export",
        "--store",
        store,
        "--format",
        "overlay",
        "--out",
        part,
        "--frames",
        "2:9",
        check=True,
    )
    with av.open(str(part)) as c:
        s = c.streams.video[0]
        got = [float(f.pts * s.time_base) for f in c.decode(s)]
    assert np.allclose(got, (np.array(times[2:9]) - times[2]) / 1000, atol=1e-3), got
    js = tmp_path / "m.json"
    segpipe("export", "--store", store, "--format", "vis-json", "--out", js, check=True)
    assert np.allclose(
        json.loads(js.read_text())["videos"][0]["timestamps"], np.array(times) / 1000
    )


def test_vfr_mkv_and_longer_audio_give_no_false_warning(tmp_path):
    frames, _ = make_sample.make_clip(num_frames=30, width=64, height=48)
    times = [int(t * t * 4) for t in range(30)]  # ms, ever slower: 0 .. 3.4 s
    vfr = encode(tmp_path / "vfr.mkv", frames, times=times, time_base=Fraction(1, 1000))
    proc = segpipe("decode", vfr, "--store", tmp_path / "a.zarr", "--image-size", S, check=True)
    assert "truncated" not in proc.stderr and stored(tmp_path / "a.zarr").attrs["frame_count"] == 30
    with_audio = tmp_path / "audio.mkv"
    with av.open(str(with_audio), "w") as out:
        v = out.add_stream("libx264", rate=24)
        v.width, v.height, v.pix_fmt = 64, 48, "yuv420p"
        a = out.add_stream("pcm_s16le", rate=8000)
        a.layout = "mono"
        for img in frames[:24]:  # 1 s of video
            for packet in v.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(packet)
        for packet in v.encode():
            out.mux(packet)
        for i in range(30):  # 3 s of audio
            chunk = av.AudioFrame.from_ndarray(
                np.zeros((1, 800), np.int16), format="s16", layout="mono"
            )
            chunk.sample_rate, chunk.pts = 8000, i * 800
            for packet in a.encode(chunk):
                out.mux(packet)
        for packet in a.encode():
            out.mux(packet)
    proc = segpipe(
        "decode", with_audio, "--store", tmp_path / "b.zarr", "--image-size", S, check=True
    )
    assert "truncated" not in proc.stderr and stored(tmp_path / "b.zarr").attrs["frame_count"] == 24


def test_repeated_timestamps_resume_and_repair_by_content(tmp_path):
    """Two MPEG-TS pieces joined: the pts run 7500.. twice. Resuming (and repairing) where a
    stored pts also names a frame of the other piece must still find the right frame."""
    a, _ = make_sample.make_clip(num_frames=12, width=64, height=48)
    b, _ = make_sample.make_clip(num_frames=12, width=64, height=48, seed=5)
    one, two = encode(tmp_path / "a.ts", a), encode(tmp_path / "b.ts", b)
    video = tmp_path / "ab.ts"
    video.write_bytes(one.read_bytes() + two.read_bytes())
    ref = tmp_path / "ref.zarr"
    segpipe("decode", video, "--store", ref, "--image-size", S, "--chunk-size", 4, check=True)
    group = stored(ref)
    assert group.attrs["frame_count"] == 24 and len(set(group["pts"][...])) == 12
    for k in (1, 2, 3, 4):  # chunk 4 starts the second piece; 1..3 resume inside the first
        store = shutil.copytree(ref, tmp_path / f"s{k}.zarr")
        g = zarr.open_group(str(store), mode="r+")
        del g.attrs["frame_count"], g.attrs["decode_warning"]
        for name in ("frames", "pts", "timestamps"):
            g[name].resize((4 * k, *g[name].shape[1:]))
        g["ledger/decode"].resize((k,))
        segpipe("decode", video, "--store", store, "--image-size", S, "--chunk-size", 4, check=True)
        assert np.array_equal(stored(store)["frames"][...], group["frames"][...]), k
    store = shutil.copytree(ref, tmp_path / "repair.zarr")
    for k in (1, 4):
        (store / "frames" / "c" / str(k) / "0" / "0" / "0").unlink()
    segpipe("repair", "--store", store, check=True)
    assert np.array_equal(stored(store)["frames"][...], group["frames"][...])


def test_a_mid_stream_size_change_decodes_and_overlays(tmp_path):
    """Two MPEG-TS pieces of different sizes, concatenated: one stream whose size changes."""
    a, _ = make_sample.make_clip(num_frames=6, width=96, height=64)
    b, _ = make_sample.make_clip(num_frames=6, width=64, height=48, seed=2)
    one, two = encode(tmp_path / "a.ts", a), encode(tmp_path / "b.ts", b)
    video = tmp_path / "ab.ts"
    video.write_bytes(one.read_bytes() + two.read_bytes())
    sizes = {x.shape for x in coded_frames(video)}
    assert len(sizes) == 2
    store = tmp_path / "s.zarr"
    segpipe("decode", video, "--store", store, "--image-size", S, check=True)
    assert np.array_equal(stored(store)["frames"][...], resized(coded_frames(video)))
    assert stored(store).attrs["video"]["width"] == 96
    from segpipe.stages.encode import encode as encode_stage
    from segpipe.stages.track.stage import track

    encode_stage(store, Encoding(random_weights=0), Execution(progress=False))
    track(
        store,
        [{"object": 1, "frame": 1, "box": [10, 10, 40, 30]}],
        execution=Execution(progress=False),
    )
    out = tmp_path / "o.mp4"
    segpipe("export", "--store", store, "--format", "overlay", "--out", out, check=True)
    assert [f.shape for f in coded_frames(out)] == [(64, 96, 3)] * 12


# -- frame folders -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jpeg_folder(tmp_path_factory):
    """A JPEG folder as DAVIS ships one (numbered names, not zero-padded to one width here
    on purpose: SAM 2 orders by the number) and prompts for it."""
    root = tmp_path_factory.mktemp("jpegs")
    frames, masks = make_sample.make_clip(num_frames=14, width=120, height=90, seed=4)
    folder = root / "video"
    folder.mkdir()
    for t, img in enumerate(frames):
        Image.fromarray(img).save(folder / f"{t * 5}.jpg", quality=90)
    (folder / "notes.txt").write_text("not a frame")
    Image.fromarray(frames[0]).save(folder / "99.png")  # SAM 2 reads JPEGs only: ignored
    make_sample.write_prompts(root, masks, frames=(4, 6, 8))
    return folder, root / "prompts.json"


@pytest.fixture(scope="module")
def folder_oracle(jpeg_folder):
    """SAM 2 on the JPEG folder itself (`oracle_tracking` with `video_dir`): it reads the
    frames from the folder and only the model, image size, frame count and video size from
    the store, so it is computed once per those and shared by the chunk sizes."""
    folder, prompts = jpeg_folder
    cache = {}

    def get(store):
        attrs = stored(store).attrs
        key = json.dumps(
            [attrs["model"], attrs["decoding"], attrs["frame_count"], attrs["video"]],
            sort_keys=True,
        )
        if key not in cache:
            cache[key] = oracle_tracking(store, prompts, video_dir=folder)
        return cache[key]

    return get


@pytest.mark.parametrize("chunk_size", [3, 16])
def test_a_jpeg_folder_tracks_bit_identically_to_sam2(
    jpeg_folder, folder_oracle, tmp_path, predictor, chunk_size
):
    """`run` on a frame folder, both directions, and each direction alone (tracked again on
    a copy, in this process), bit for bit SAM 2's on the folder."""
    from segpipe.stages.track.stage import track

    folder, prompts = jpeg_folder
    store = tmp_path / "s.zarr"
    segpipe(
        "run",
        folder,
        "--store",
        store,
        "--prompts",
        prompts,
        "--chunk-size",
        chunk_size,
        "--image-size",
        IMAGE_SIZE,
        "--random-weights",
        0,
        "--direction",
        "both",
        "--export",
        "none",
        "--quiet",
        check=True,
    )
    expected = folder_oracle(store)
    group = stored(store)
    assert group.attrs["video"]["kind"] == "frames" and group.attrs["frame_count"] == 14
    for direction in ("forward", "reverse"):
        if direction == "reverse" or chunk_size == 3:
            track_store = shutil.copytree(store, tmp_path / f"{direction}.zarr")
            track(
                track_store,
                None,
                Tracking(direction),
                execution=Execution(progress=False),
                predictor=predictor,
            )
            got = stored(track_store)
            assert np.array_equal(got["masks"][...], expected.masks[direction]), direction
            assert same_bits(got["object_scores"][...], expected.scores[direction]), direction
    assert np.array_equal(group["masks"][...], expected.masks["both"])
    assert same_bits(group["object_scores"][...], expected.scores["both"])


def test_a_folder_overlay_is_a_video_at_its_fps(jpeg_folder, tmp_path):
    folder, prompts = jpeg_folder
    store = tmp_path / "s.zarr"
    segpipe(
        "run",
        folder,
        "--store",
        store,
        "--prompts",
        prompts,
        "--image-size",
        S,
        "--random-weights",
        0,
        "--fps",
        10,
        "--export",
        "overlay",
        "--quiet",
        check=True,
    )
    out = tmp_path / "s.export" / "overlay.mp4"
    with av.open(str(out)) as c:
        s = c.streams.video[0]
        times = [float(f.pts * s.time_base) for f in c.decode(s)]
    assert len(times) == 14 and np.allclose(np.diff(times), 0.1, atol=1e-3)
    davis = tmp_path / "davis"  # named like the source frames, as vos_inference names them
    segpipe("export", "--store", store, "--format", "davis", "--out", davis, check=True)
    assert sorted(p.name for p in davis.iterdir()) == sorted(f"{t * 5}.png" for t in range(14))
    jpegs = tmp_path / "jpegs"
    segpipe("export", "--store", store, "--format", "frames", "--out", jpegs, check=True)
    assert sorted(p.name for p in jpegs.iterdir()) == sorted(f"{t * 5}.jpg" for t in range(14))
    assert Image.open(jpegs / "15.jpg").size == (120, 90)
    renamed = shutil.copytree(folder, tmp_path / "renamed")  # two frames swap names
    (renamed / "0.jpg").rename(renamed / "tmp.jpg")
    (renamed / "5.jpg").rename(renamed / "0.jpg")
    (renamed / "tmp.jpg").rename(renamed / "5.jpg")
    shutil.rmtree(folder.parent / "moved", ignore_errors=True)
    folder.rename(folder.parent / "moved")
    renamed.rename(folder)
    try:
        assert_user_error(segpipe("decode", folder, "--store", store), "another video")
    finally:
        folder.rename(renamed)
        (folder.parent / "moved").rename(folder)


def test_a_png_only_folder_is_read(tmp_path):
    frames, _ = make_sample.make_clip(num_frames=5, width=40, height=30)
    folder = tmp_path / "pngs"
    folder.mkdir()
    for t, img in enumerate(frames):
        Image.fromarray(img).save(folder / f"{t}.png")
    store = tmp_path / "s.zarr"
    segpipe("decode", folder, "--store", store, "--image-size", 32, check=True)
    assert np.array_equal(
        stored(store)["frames"][...],
        np.stack([np.asarray(Image.fromarray(f).resize((32, 32))) for f in frames]),
    )


@pytest.mark.parametrize(
    "case,words",
    [
        ("empty", ["no frames in folder"]),
        ("non_numeric", ["frame_a.jpg", "not named by its number"]),
        ("mixed_sizes", ["3.jpg", "must share one size"]),
        ("unreadable", ["2.jpg", "unreadable image"]),
    ],
)
def test_bad_frame_folders_are_refused_naming_the_file(tmp_path, case, words):
    folder = tmp_path / "frames"
    folder.mkdir()
    img = np.zeros((20, 30, 3), np.uint8)
    if case != "empty":
        for t in range(4):
            Image.fromarray(img).save(folder / f"{t}.jpg")
    if case == "non_numeric":
        Image.fromarray(img).save(folder / "frame_a.jpg")
    elif case == "mixed_sizes":
        Image.fromarray(np.zeros((10, 30, 3), np.uint8)).save(folder / "3.jpg")
    elif case == "unreadable":
        (folder / "2.jpg").write_bytes(b"not a jpeg at all")
    store = tmp_path / "s.zarr"
    assert_user_error(segpipe("decode", folder, "--store", store, "--image-size", S), *words)
    assert not store.exists()
