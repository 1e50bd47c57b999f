"""TIFF stacks, a source kind of the registry: multi-page files and folders of numbered
TIFFs, 8 and 16 bits, grey and RGB, tracked as SAM 2's predictor tracks the same frames.

"The same frames" are made here, from the raw samples, by the rule the docs state (not by
segpipe's code): 8 bits as they are, 16 bits through one window for the whole source,
lo and hi the sorted samples' entries floor(0.001 (n - 1)) and ceil(0.999 (n - 1)), each
sample mapped to round((clip(v, lo, hi) - lo) * 255 / (hi - lo)), halves up; grey repeated
into RGB. SAM 2 reads them from a folder with its own loader (`oracle_tracking` with
`video_dir`).
"""

from __future__ import annotations

import io
import signal
import urllib.request
from pathlib import Path

import make_sample
import numpy as np
import pytest
import tifffile
import zarr
from conftest import IMAGE_SIZE, ledger_count, run_code, segpipe
from oracle import assert_tracked_as_sam2, oracle_tracking
from PIL import Image

T, W, H = 9, 96, 72


def raw_stack(bits: int, rgb: bool, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(T, H, W[, 3]) samples as a microscope might save them, and the clip's masks. 16-bit
    ones: 100 + 2 v + noise (0 or 1), with 1% of the samples at each end of [100, 610] (so
    that is the window) and a few hot pixels far past it (which the percentiles leave out);
    the window's width, 510, makes every odd sample an exact half to round."""
    frames, masks = make_sample.make_clip(num_frames=T, width=W, height=H, seed=seed)
    a = frames if rgb else frames[..., 1]
    if bits == 16:
        rng = np.random.default_rng(seed)
        noise = rng.integers(0, 2, a.shape, dtype=np.uint16)
        a = np.minimum(100 + 2 * a.astype(np.uint16) + noise, 610)
        flat = a.reshape(-1)
        picks = rng.choice(flat.size, flat.size // 50 + 5, replace=False)
        flat[picks[: flat.size // 100]] = 100
        flat[picks[flat.size // 100 : flat.size // 50]] = 610
        flat[picks[-5:]] = 65535
    return a, masks


def model_frames(a: np.ndarray) -> tuple[np.ndarray, tuple[int, int] | None]:
    """The documented rule, from the raw samples: (T, H, W, 3) uint8, and the 16-bit window."""
    window = None
    if a.dtype == np.uint16:
        v = np.sort(a, axis=None)
        n1 = v.size - 1
        lo, hi = int(v[int(np.floor(0.001 * n1))]), int(v[int(np.ceil(0.999 * n1))])
        window = (lo, hi)
        x = (np.clip(a, lo, hi).astype(np.float64) - lo) * 255 / (hi - lo)
        a = np.floor(x + 0.5).astype(np.uint8)
    if a.ndim == 3:
        a = np.repeat(a[..., None], 3, axis=-1)
    return a, window


def write_source(path: Path, a: np.ndarray, folder: bool) -> Path:
    photometric = "rgb" if a.ndim == 4 else "minisblack"
    if not folder:
        tifffile.imwrite(path, a, photometric=photometric)
        return path
    path.mkdir()
    for t, frame in enumerate(a):
        tifffile.imwrite(path / f"{t * 5}.tif", frame, photometric=photometric)  # 0, 5, 10..
    return path


def sam2_folder(frames: np.ndarray, folder: Path) -> Path:
    """The frames as SAM 2 loads a video: numbered .jpg names (lossless PNG data in them)."""
    folder.mkdir()
    for t, frame in enumerate(frames):
        Image.fromarray(frame).save(folder / f"{t:05d}.jpg", format="PNG")
    return folder


ARGS = ["--image-size", IMAGE_SIZE, "--random-weights", 0, "--chunk-size", 4, "--quiet"]


@pytest.mark.parametrize(
    "bits, rgb, folder",
    [(8, False, False), (8, True, False), (16, False, False), (16, True, False), (16, False, True)],
    ids=["8-bit grey", "8-bit RGB", "16-bit grey", "16-bit RGB", "16-bit grey folder"],
)
def test_a_tiff_stack_tracks_as_sam2_on_the_same_frames(tmp_path, bits, rgb, folder):
    """`run` on the stack, both directions: the recorded window is the documented one, the
    stored model input is the documented frame resized as SAM 2 resizes, and masks and
    object scores are SAM 2's, bit for bit, given those frames."""
    a, masks = raw_stack(bits, rgb, seed=bits + rgb)
    source = write_source(tmp_path / ("stack" if folder else "stack.tif"), a, folder)
    make_sample.write_prompts(tmp_path, masks, frames=(2, 4, 6))
    store = tmp_path / "s.zarr"
    segpipe("run", source, "--store", store, "--prompts", tmp_path / "prompts.json", *ARGS,
            "--export", "none", check=True)  # fmt: skip
    expected, window = model_frames(a)
    group = zarr.open_group(str(store), mode="r")
    video = group.attrs["video"]
    assert video["kind"] == ("tiff-folder" if folder else "tiff"), video
    assert (video["width"], video["height"], group.attrs["frame_count"]) == (W, H, T)
    assert video.get("intensity") == (None if window is None else list(window))
    assert window in (None, (100, 610))  # odd samples are exact halves: rounded up
    for t in (0, T - 1):
        resized = np.asarray(Image.fromarray(expected[t]).resize((IMAGE_SIZE, IMAGE_SIZE)))
        assert np.array_equal(group["frames"][t], resized), t
    oracle = oracle_tracking(
        store, tmp_path / "prompts.json", video_dir=sam2_folder(expected, tmp_path / "sam2")
    )
    assert_tracked_as_sam2(store, oracle)


KILL_MID_MASK_WRITE = """
import sys
sys.path.insert(0, "tests")
import kill_points

kill_points.mid_write("/masks/c/1/", nth=1)
kill_points.cli(sys.argv[1:])
"""


def test_kill_9_mid_track_of_a_16_bit_stack_then_rerun(tmp_path):
    """`run --keep masks` on a 16-bit stack (its frames read from the file again for each
    chunk a pass encodes), killed halfway through writing the forward pass's 2nd chunk of
    masks (its 1st committed), then run again: SAM 2's masks and scores on the documented frames, bit for bit."""
    a, masks = raw_stack(16, False, seed=5)
    source = write_source(tmp_path / "stack.tif", a, folder=False)
    make_sample.write_prompts(tmp_path, masks, frames=(2, 4, 6))
    store = tmp_path / "s.zarr"
    argv = ["run", source, "--store", store, "--prompts", tmp_path / "prompts.json", *ARGS,
            "--export", "none", "--keep", "masks"]  # fmt: skip
    proc = run_code(KILL_MID_MASK_WRITE, *argv)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    done = ledger_count(store, "track_forward")
    assert done == 1, done  # the kill landed mid-track: one chunk of three committed
    segpipe(*argv, check=True)
    expected, _ = model_frames(a)
    oracle = oracle_tracking(
        store, tmp_path / "prompts.json", video_dir=sam2_folder(expected, tmp_path / "sam2")
    )
    assert_tracked_as_sam2(store, oracle)


def test_frame_and_the_studio_show_a_16_bit_stack_as_the_model_sees_it(tmp_path):
    """`segpipe frame` on the stack and on its store, and the studio's frame image, are the
    documented 8-bit frame at the stack's size; bad TIFFs are refused in one line."""
    from segpipe.web.server import StudioServer

    a, _ = raw_stack(16, False, seed=7)
    source = write_source(tmp_path / "stack.tif", a, folder=False)
    expected, _ = model_frames(a)
    store = tmp_path / "s.zarr"
    segpipe("decode", source, "--store", store, "--chunk-size", 4, "--image-size", IMAGE_SIZE,
            "--quiet", check=True)  # fmt: skip
    for what in (source, store):
        out = tmp_path / "f.png"
        segpipe("frame", what, "--at", 5, "--out", out, "--grid", 0, check=True)
        assert np.array_equal(np.asarray(Image.open(out)), expected[5]), what
    server = StudioServer(store, port=0).start()
    try:
        with urllib.request.urlopen(server.url.split("?")[0] + "api/frames/5.jpg") as r:
            shown = np.asarray(Image.open(io.BytesIO(r.read())))
    finally:
        server.stop()
    jpeg = io.BytesIO()
    Image.fromarray(expected[5]).save(jpeg, "JPEG", quality=90)  # as the studio sends frames
    assert np.array_equal(shown, np.asarray(Image.open(jpeg)))
    float_stack = tmp_path / "float.tif"
    tifffile.imwrite(float_stack, a.astype(np.float32))
    hyper = tmp_path / "hyper.tif"
    tifffile.imwrite(
        hyper, np.zeros((3, 2, H, W), np.uint16), imagej=True, metadata={"axes": "TZYX"}
    )
    for bad, words in ((float_stack, "8- and 16-bit"), (hyper, "TZYX")):
        proc = segpipe("decode", bad, "--store", tmp_path / "bad.zarr")
        assert proc.returncode == 1 and words in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
        assert not (tmp_path / "bad.zarr").exists()


def test_tiff_layouts_read_as_documented(tmp_path):
    """Planar and interleaved RGB, RGBA, BigTIFF, LZW, one page, and ImageJ's contiguous
    file (a stack over 4 GB) give the same frames; several series, channels (C), float
    samples, a folder of mismatched frames are refused in one line, the store left as it
    was; the window falls back to the whole range where its percentiles meet."""
    from segpipe.sources.registry import for_store, iter_frames, kind_of, probe

    a, _ = raw_stack(16, True, seed=3)
    frames, _ = model_frames(a)

    def read(path):
        info = for_store(path, probe(path))
        return np.stack([np.asarray(p()) for _, _, p in iter_frames(path, 0, info.as_attrs())])

    writes = {
        "interleaved.tif": dict(photometric="rgb"),
        "planar.tif": dict(photometric="rgb", planarconfig="separate"),
        "big.tif": dict(photometric="rgb", bigtiff=True),
        "lzw.tif": dict(photometric="rgb", compression="lzw"),
    }
    for name, options in writes.items():
        data = np.moveaxis(a, -1, 1) if "planar" in name else a
        tifffile.imwrite(tmp_path / name, data, **options)
        assert kind_of(tmp_path / name).name == "tiff"
        assert np.array_equal(read(tmp_path / name), frames), name
    alpha = np.concatenate([a, np.full(a.shape[:-1] + (1,), 65535, np.uint16)], axis=-1)
    tifffile.imwrite(tmp_path / "rgba.tif", alpha, photometric="rgb", extrasamples=["unassalpha"])
    assert np.array_equal(read(tmp_path / "rgba.tif"), frames)  # alpha neither read nor counted
    grey, _ = raw_stack(16, False, seed=4)
    tifffile.imwrite(
        tmp_path / "ij.tif", grey, imagej=True, truncate=True, metadata={"axes": "TYX"}
    )
    assert np.array_equal(read(tmp_path / "ij.tif"), model_frames(grey)[0])
    tifffile.imwrite(tmp_path / "one.tif", grey[4])
    assert probe(tmp_path / "one.tif").claimed_frames == 1
    sparse = np.zeros((4, H, W), np.uint16)
    sparse[:, :2, :2] = 3000  # under 0.1% of the samples bright: the window is 0..3000
    tifffile.imwrite(tmp_path / "sparse.tif", sparse, photometric="minisblack")
    sparse_info = for_store(tmp_path / "sparse.tif", probe(tmp_path / "sparse.tif"))
    assert (sparse_info.claimed_frames, sparse_info.intensity) == (4, (0, 3000))

    with tifffile.TiffWriter(tmp_path / "series.tif") as w:
        for t in range(3):
            w.write(grey[t] if t != 1 else grey[t, :10, :10])
    tifffile.imwrite(tmp_path / "float.tif", grey.astype(np.float32))
    tifffile.imwrite(tmp_path / "channels.tif", grey[:3], imagej=True, metadata={"axes": "CYX"})
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    tifffile.imwrite(mixed / "0.tif", grey[0])
    tifffile.imwrite(mixed / "1.tif", grey[1, :, :50])
    store = tmp_path / "s.zarr"
    for bad, words in (
        ("series.tif", "3 image series"),
        ("float.tif", "8- and 16-bit"),
        ("channels.tif", "not channels C"),
        ("mixed", "a folder's frames must match"),
    ):
        proc = segpipe("decode", tmp_path / bad, "--store", store)
        assert proc.returncode == 1 and words in proc.stderr, (bad, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
        assert not store.exists()


def test_a_tiff_folder_stays_its_kind_and_the_store_its_window(tmp_path):
    """A decoded TIFF folder: `--fps` is its timing; a PNG put in the folder later does not
    make it another kind (decode again is a no-op, status shows the window); the frames read
    back go through the window the store recorded, not one computed again."""
    a, _ = raw_stack(16, False, seed=6)
    source = write_source(tmp_path / "stack", a, folder=True)
    store = tmp_path / "s.zarr"
    decode = ("decode", source, "--store", store, "--chunk-size", 4, "--image-size", IMAGE_SIZE)
    segpipe(*decode, "--fps", 2, "--quiet", check=True)
    assert zarr.open_group(str(store), mode="r").attrs["video"]["fps"] == 2.0
    Image.fromarray(np.zeros((H, W), np.uint8)).save(source / "preview.png")
    again = segpipe(*decode, check=True)
    assert "already complete" in again.stderr, again.stderr
    shown = segpipe("status", "--store", store, check=True).stdout
    assert "16-bit samples 100..610 mapped to 0..255" in shown, shown
    group = zarr.open_group(str(store), mode="r+")
    video = dict(group.attrs["video"])
    video["intensity"] = [0, 1020]  # another window in the record: the one frames go through
    group.attrs["video"] = video
    out = tmp_path / "f.png"
    segpipe("frame", store, "--at", 3, "--out", out, "--grid", 0, check=True)
    expected = ((a[3].astype(np.int64) * 510 + 1020) // 2040).clip(0, 255).astype(np.uint8)
    assert np.array_equal(np.asarray(Image.open(out))[..., 0], expected)
