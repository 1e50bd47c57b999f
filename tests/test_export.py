import json
import random
import shutil
import signal

import av
import numpy as np
import pytest
import zarr
from conftest import (
    IMAGE_SIZE,
    assert_user_error,
    freeze,
    ledger_count,
    popen_segpipe,
    segpipe,
    tree_digest,
    tree_mtimes,
    wait_for,
)
from PIL import Image

from segpipe.settings import Encoding, Execution, Tracking
from segpipe.stages.encode import encode
from segpipe.stages.export.stage import FORMATS, export
from segpipe.stages.export.writers import compose, davis_palette
from segpipe.stages.track.stage import track
from segpipe.store import masks as maskio


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, clip_dir, predictor):
    """A tracked store no export has touched. Read-only: tests copy it."""
    import segpipe as api

    store = tmp_path_factory.mktemp("export") / "s.zarr"
    # decoded by `segpipe.decode` (what `segpipe decode` calls), all in this process
    api.decode(
        clip_dir / "clip.mp4",
        store,
        decoding=api.Decoding(chunk_size=2, image_size=IMAGE_SIZE),
        execution=api.Execution(progress=False),
    )
    encode(store, Encoding(random_weights=0), Execution(progress=False), predictor=predictor)
    track(
        store,
        clip_dir / "prompts.json",
        Tracking("both"),
        execution=Execution(progress=False),
        predictor=predictor,
    )
    return store


@pytest.fixture(scope="module")
def tracked(pristine, tmp_path_factory):
    """A copy of `pristine` that the tests below export from (each to its own folder)."""
    return shutil.copytree(pristine, tmp_path_factory.mktemp("shared") / "s.zarr")


@pytest.fixture(scope="module")
def gt_store(tracked, clip_dir, tmp_path_factory):
    """The tracked store with its masks replaced by the clip's ground truth: random weights
    give blobs, and the overlay check wants objects with a clear inside and outside."""
    store = shutil.copytree(tracked, tmp_path_factory.mktemp("gt") / "gt.zarr")
    zarr.open_group(str(store), mode="r+")["masks"][...] = np.load(clip_dir / "masks.npy")
    return store


def stored(store):
    group = zarr.open_group(str(store), mode="r")
    return group["masks"][...], group["masks"].attrs["object_ids"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_masks_in_one_frame_batches_export_the_same_files(tracked, tmp_path, monkeypatch, fmt):
    """Exports read masks in batches bounded in bytes, not whole chunks: with a budget of one
    frame's masks (a chunk read packed, then unpacked a frame a batch) every format writes the
    same bytes."""
    assert zarr.open_group(str(tracked), mode="r")["masks"].chunks == (2, 1, 120, 160)
    name = {"davis": "d", "vis-json": "v.json", "overlay": "o.mp4", "frames": "f", "cvat": "a.xml"}
    name = name[fmt]
    outs = {"ref": tmp_path / f"ref_{name}"}
    segpipe(
        "export", "--store", tracked, "--format", fmt, "--out", outs["ref"], "--quiet", check=True
    )
    monkeypatch.setattr(maskio, "BATCH_BYTES", 3 * 120 * 160)  # 3 objects: one frame
    outs["small"] = export(tracked, fmt, tmp_path / f"small_{name}", quiet=True)
    digests = {k: tree_digest(v) if v.is_dir() else v.read_bytes() for k, v in outs.items()}
    assert digests["ref"] and digests["small"] == digests["ref"]


def test_overlay_drawn_in_strips_is_the_whole_frame_drawing(monkeypatch):
    """The overlay blends and outlines a few rows at a time (bounded RAM at 4K): pixel for
    pixel what drawing the whole frame at once gives (the drawing before strips, below),
    outlines and id labels across strip borders included."""
    from PIL import ImageDraw

    from segpipe.stages.export.writers import OverlayWriter, _erode

    class Writer(OverlayWriter):
        def __init__(self, ids):
            self.ids = ids
            palette = davis_palette()
            self.colours = {i: np.array(palette[3 * i : 3 * i + 3], np.float32) for i in ids}

    def whole(w, rgb, masks):
        img = rgb.astype(np.float32)
        for slot, obj in enumerate(w.ids):
            m = masks[slot]
            if m.any():
                img[m] = (1 - w.ALPHA) * img[m] + w.ALPHA * w.colours[obj]
        for slot, obj in enumerate(w.ids):
            m = masks[slot]
            if m.any():
                img[m & ~_erode(m)] = w.colours[obj]
        out = Image.fromarray(img.round().clip(0, 255).astype(np.uint8))
        draw = ImageDraw.Draw(out)
        for slot, obj in enumerate(w.ids):
            ys, xs = np.nonzero(masks[slot])
            if len(xs):
                draw.text(
                    (int(xs.mean()), int(ys.mean())),
                    str(obj),
                    fill=(255, 255, 255),
                    stroke_width=1,
                    stroke_fill=(0, 0, 0),
                    anchor="mm",
                )
        return np.asarray(out)

    rng = np.random.default_rng(3)
    rgb = rng.integers(0, 256, (61, 83, 3), dtype=np.uint8)
    yy, xx = np.mgrid[0:61, 0:83]
    masks = np.stack(
        [
            (yy - 20) ** 2 + (xx - 30) ** 2 < 300,
            rng.random((61, 83)) < 0.5,
            np.zeros((61, 83), bool),
            (yy > 7) & (yy < 50) & (xx > 40),
        ]
    )
    w = Writer([4, 1, 9, 2])
    expected = whole(w, rgb, masks)
    for rows in (1, 2, 7, 256):
        monkeypatch.setattr(OverlayWriter, "STRIP_ROWS", rows)
        assert np.array_equal(w.draw(rgb, masks), expected), rows


def test_overlaps_go_to_the_lowest_id():
    masks = np.zeros((3, 2, 2), bool)
    masks[:, 0, 0] = True  # all three objects claim this pixel
    masks[0, 1, 1] = masks[2, 1, 1] = True
    assert compose(masks, [5, 2, 9]).tolist() == [[2, 0], [0, 5]]


def test_davis_pngs_equal_composed_masks(tracked, tmp_path):
    out = tmp_path / "davis"
    segpipe("export", "--store", tracked, "--format", "davis", "--out", out, check=True)
    masks, ids = stored(tracked)
    files = sorted(out.iterdir())
    assert [f.name for f in files] == [f"{t:05d}.png" for t in range(len(masks))]
    for t, f in enumerate(files):
        img = Image.open(f)
        assert img.mode == "P" and img.getpalette()[: 3 * 256] == davis_palette()
        assert np.array_equal(np.asarray(img), compose(masks[t], ids))
    assert davis_palette()[:12] == [0, 0, 0, 128, 0, 0, 0, 128, 0, 128, 128, 0]


def test_vis_json_round_trips_through_pycocotools(tracked, tmp_path):
    from pycocotools import mask as mask_util

    out = tmp_path / "masks.json"
    segpipe("export", "--store", tracked, "--format", "vis-json", "--out", out, check=True)
    doc = json.loads(out.read_text())
    masks, ids = stored(tracked)
    T, O, H, W = masks.shape
    assert doc["videos"][0] | {"file_names": None, "timestamps": None} == {
        "id": 1,
        "width": W,
        "height": H,
        "length": T,
        "file_names": None,
        "timestamps": None,
    }
    assert np.allclose(doc["videos"][0]["timestamps"], np.arange(T) / 24, atol=1e-3)
    assert [a["object_id"] for a in doc["annotations"]] == ids
    for slot, ann in enumerate(doc["annotations"]):
        assert len(ann["segmentations"]) == T
        for t, rle in enumerate(ann["segmentations"]):
            if rle is None:
                assert not masks[t, slot].any() and ann["areas"][t] is None
            else:
                assert np.array_equal(mask_util.decode(rle).astype(bool), masks[t, slot])
                assert ann["areas"][t] == masks[t, slot].sum()


def cvat_masks(path, H: int, W: int) -> dict:
    """CVAT for video 1.1 XML read as its documentation and CVAT's importer read it, written
    apart from segpipe's writer: each track's masks by frame, decoded from the RLE over
    their box (runs of 0s and 1s alternating, starting with 0s, row by row)."""
    import xml.etree.ElementTree as ET

    root = ET.parse(path).getroot()
    assert root.tag == "annotations" and root.find("version").text == "1.1"
    task = root.find("meta/task")
    assert task.find("mode").text == "interpolation"
    size = task.find("original_size")
    assert (int(size.find("width").text), int(size.find("height").text)) == (W, H)
    labels = {e.find("name").text: e.find("type").text for e in task.find("labels")}
    tracks = {}
    for n, element in enumerate(root.findall("track")):
        assert element.get("id") == str(n) and labels[element.get("label")] == "mask"
        frames = {}
        for m in element:
            assert m.tag == "mask" and m.get("keyframe") == "1"
            left, top = int(m.get("left")), int(m.get("top"))
            w, h = int(m.get("width")), int(m.get("height"))
            counts = [int(c) for c in m.get("rle").split(",")]
            assert sum(counts) == w * h
            flat = np.zeros(w * h, bool)
            at = 0
            for i, c in enumerate(counts):
                flat[at : at + c] = i % 2 == 1
                at += c
            full = np.zeros((H, W), bool)
            if m.get("outside") == "0":
                full[top : top + h, left : left + w] = flat.reshape(h, w)
                assert full.any()
            else:
                assert m.get("outside") == "1"
            frames[int(m.get("frame"))] = full
        tracks[element.get("label")] = frames
    return tracks


def test_cvat_xml_decodes_to_the_store_masks(gt_store, tmp_path):
    """`--format cvat`: one mask track per object, every frame a keyframe, each mask's RLE
    over its box decoding to the store's mask, `outside` exactly where the object is absent
    (here object 2 on frames 3..5, and everything outside a frame range)."""
    store = shutil.copytree(gt_store, tmp_path / "s.zarr")
    with zarr.config.set({"array.write_empty_chunks": True}):  # the store keeps every chunk
        masks = zarr.open_group(str(store), mode="r+")["masks"]
        cut = masks[3:6]
        cut[:, 1] = False
        masks[3:6] = cut
    out = tmp_path / "annotations.xml"
    segpipe("export", "--store", store, "--format", "cvat", "--out", out, "--quiet", check=True)
    stored_masks, ids = stored(store)
    T, O, H, W = stored_masks.shape
    tracks = cvat_masks(out, H, W)
    assert list(tracks) == [f"object {i}" for i in ids]
    for slot, i in enumerate(ids):
        frames = tracks[f"object {i}"]
        assert sorted(frames) == list(range(T))
        for t in range(T):
            assert np.array_equal(frames[t], stored_masks[t, slot]), (i, t)
    assert not tracks["object 2"][4].any() and stored_masks[:, 1].any()
    part = tmp_path / "part.xml"
    segpipe(
        "export",
        "--store",
        store,
        "--format",
        "cvat",
        "--out",
        part,
        "--frames",
        "10:20",
        "--objects",
        "3",
        "--quiet",
        check=True,
    )
    frames = cvat_masks(part, H, W)["object 3"]
    assert sorted(frames) == list(range(10, 20))
    assert all(np.array_equal(frames[t], stored_masks[t, 2]) for t in frames)


def source_frames(path):
    with av.open(str(path)) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])


def test_overlay_video_matches_source_and_masks(gt_store, tmp_path, clip_dir):
    out = tmp_path / "overlay.mp4"
    segpipe("export", "--store", gt_store, "--format", "overlay", "--out", out, check=True)
    with av.open(str(out)) as c, av.open(str(clip_dir / "clip.mp4")) as s:
        vo, vs = c.streams.video[0], s.streams.video[0]
        assert (vo.codec_context.name, vo.width, vo.height) == ("h264", vs.width, vs.height)
        assert vo.average_rate == vs.average_rate
    overlay, source = source_frames(out), source_frames(clip_dir / "clip.mp4")
    assert overlay.shape == source.shape
    masks, ids = stored(gt_store)
    colours = np.array(davis_palette(), np.float32).reshape(256, 3)
    checked_in = checked_out = 0
    for t in range(0, len(masks), 5):
        any_obj = masks[t].any(0)
        # far outside every object: the source pixel, within codec tolerance
        near = any_obj.copy()
        for _ in range(12):
            near[1:] |= near[:-1]
            near[:-1] |= near[1:]
            near[:, 1:] |= near[:, :-1]
            near[:, :-1] |= near[:, 1:]
        ys, xs = np.nonzero(~near)
        if len(ys):
            y, x = ys[len(ys) // 2], xs[len(xs) // 2]
            assert np.abs(overlay[t, y, x].astype(int) - source[t, y, x]).max() <= 12
            checked_out += 1
        # deep inside exactly one object, away from its id label: its colour blended in
        for slot, obj in enumerate(ids):
            only = masks[t, slot] & (masks[t].sum(0) == 1)
            inner = only.copy()
            for _ in range(4):
                inner[1:] &= inner[:-1]
                inner[:-1] &= inner[1:]
                inner[:, 1:] &= inner[:, :-1]
                inner[:, :-1] &= inner[:, 1:]
            ys, xs = np.nonzero(inner)
            if not len(ys):
                continue
            cy, cx = np.nonzero(masks[t, slot])
            far = np.hypot(ys - cy.mean(), xs - cx.mean()) > 7  # clear of the id label
            if not far.any():
                continue
            y, x = ys[far][0], xs[far][0]
            expected = 0.5 * source[t, y, x] + 0.5 * colours[obj]
            assert np.abs(overlay[t, y, x] - expected).max() <= 16
            checked_in += 1
    assert checked_in >= 10 and checked_out >= 5


def test_kill_mid_export_then_resume_gives_identical_files(pristine, tmp_path):
    """The kill lands while export is writing chunks (some done, not all), on a store copy
    whose export ledgers start empty; the reference export runs on another copy."""
    rng = random.Random(7)
    ref_store = shutil.copytree(pristine, tmp_path / "stores" / "ref.zarr")
    store = shutil.copytree(pristine, tmp_path / "stores" / "killed.zarr")
    outs = tmp_path / "out"
    outs.mkdir()
    total = -(-zarr.open_group(str(pristine), mode="r").attrs["frame_count"] // 2)  # chunks of 2
    for fmt, name in (
        ("overlay", "o.mp4"),
        ("davis", "d"),
        ("vis-json", "v.json"),
        ("frames", "f"),
    ):
        stage = f"export_{fmt}"
        assert ledger_count(store, stage) == 0
        ref = outs / f"ref_{name}"
        segpipe(
            "export", "--store", ref_store, "--format", fmt, "--out", ref, "--quiet", check=True
        )
        out = outs / name
        proc = popen_segpipe("export", "--store", store, "--format", fmt, "--out", out)
        target = rng.randint(1, total // 2)
        reached = wait_for(lambda: ledger_count(store, stage) >= target, proc)
        freeze(proc)  # frozen where it is: the kill lands at this moment
        done = ledger_count(store, stage)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        print(f"{fmt}: killed with {done} of {total} chunks done")
        assert reached and 0 < done < total, (fmt, target, done, total)
        assert ledger_count(store, stage) == done
        done_files = {
            k: v for k, v in tree_mtimes(store / "ledger" / stage).items() if k.startswith("c/")
        }
        assert len(done_files) == done
        segpipe("export", "--store", store, "--format", fmt, "--out", out, "--quiet", check=True)
        # resumed, not started over: the chunks done before the kill were not redone
        after = tree_mtimes(store / "ledger" / stage)
        assert {k: after.get(k) for k in done_files} == done_files
        if out.is_dir():
            assert tree_digest(out) == tree_digest(ref)
        else:
            assert out.read_bytes() == ref.read_bytes()
        assert not out.with_name(f".{out.name}.parts").exists()
        before = tree_digest(outs), tree_digest(store)  # (the lock file beside it changes)
        proc = segpipe("export", "--store", store, "--format", fmt, "--out", out, check=True)
        assert "already complete" in proc.stderr
        assert (tree_digest(outs), tree_digest(store)) == before


def test_subsets(tracked, tmp_path):
    masks, ids = stored(tracked)
    out = tmp_path / "sub"
    segpipe(
        "export",
        "--store",
        tracked,
        "--format",
        "davis",
        "--out",
        out,
        "--frames",
        "5:9",
        "--objects",
        str(ids[1]),
        check=True,
    )
    assert sorted(f.name for f in out.iterdir()) == [f"{t:05d}.png" for t in range(5, 9)]
    assert np.array_equal(
        np.asarray(Image.open(out / "00006.png")), compose(masks[6][[1]], [ids[1]])
    )
    js = tmp_path / "sub.json"
    segpipe(
        "export",
        "--store",
        tracked,
        "--format",
        "vis-json",
        "--out",
        js,
        "--frames",
        "30:",
        check=True,
    )
    doc = json.loads(js.read_text())
    assert doc["videos"][0]["length"] == 10 and len(doc["annotations"][0]["segmentations"]) == 10


@pytest.mark.parametrize(
    "args,words",
    [
        (["--frames", "30:10"], ["--frames"]),
        (["--frames", "0:999"], ["--frames"]),
        (["--frames", "abc"], ["--frames"]),
        (["--objects", "42"], ["unknown object id 42"]),
    ],
)
def test_bad_subsets(tracked, tmp_path, args, words):
    before = tree_digest(tracked)
    proc = segpipe(
        "export", "--store", tracked, "--format", "davis", "--out", tmp_path / "x", *args
    )
    assert_user_error(proc, *words)
    assert tree_digest(tracked) == before and not (tmp_path / "x").exists()


def test_run_exports_all_three_next_to_the_store(tmp_path, clip_dir):
    store = tmp_path / "run.zarr"
    segpipe(
        "run",
        clip_dir / "clip.mp4",
        "--store",
        store,
        "--prompts",
        clip_dir / "prompts.json",
        "--image-size",
        IMAGE_SIZE,
        "--chunk-size",
        16,
        "--random-weights",
        0,
        "--quiet",
        check=True,
    )
    folder = tmp_path / "run.export"
    assert (folder / "masks.json").is_file() and (folder / "overlay.mp4").is_file()
    assert len(list((folder / "davis").iterdir())) == 40


def test_rows_unpacked_from_packed_masks_are_those_rows():
    """Bands of rows read straight from the packed bits, widths not a multiple of 8 too."""
    rng = np.random.default_rng(0)
    for H, W in ((7, 5), (13, 9), (6, 16)):
        masks = rng.random((3, 2, H, W)) < 0.5
        packed = maskio.pack(masks)
        for r0 in range(H):
            for r1 in range(r0 + 1, H + 1):
                assert np.array_equal(maskio.unpack_rows(packed, W, r0, r1), masks[..., r0:r1, :])
