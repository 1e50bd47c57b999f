"""Dataset mode: the output PNGs of SAM 2's vos_inference, bit for bit, resumable.

The tests make a small DAVIS-style dataset (three JPEG-folder videos, indexed-PNG annotations
with their own palette, and the same masks in SA-V's per-object layout); in `dogs` object 3
first appears on frame 3. The oracle (`vos_oracle`) runs SAM 2's own predictor over whole
videos as the tool does; segpipe runs in chunks of 4 frames.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    IMAGE_SIZE,
    assert_user_error,
    freeze,
    ledger_count,
    segpipe,
    tree_mtimes,
    wait_for,
)
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
import make_sample  # noqa: E402

SEED, CHUNK = 0, 4
VIDEOS = {"bear": (10, 11), "cows": (9, 12), "dogs": (10, 13)}  # frames, clip seed
ANNOTATED = {"bear": (0, 5), "cows": (0, 6), "dogs": (0, 5, 7)}  # frames with annotation PNGs
LATER = ("dogs", 3, 5)  # object 3 of dogs is annotated from frame 5 on (the second chunk)
# the annotations' own palette (not DAVIS's): outputs must carry it
PALETTE = [v for i in range(256) for v in ((i * 47) % 256, (i * 91) % 256, 255 - i)]
VARIANTS = {
    "default": [],
    "use-all-masks": ["--use-all-masks"],
    "per-obj-png-file": ["--per-obj-png-file"],
    "later-objects": ["--track-object-appearing-later-in-video"],
    # the rest at once: per-object PNGs of objects appearing later (the last frame has no
    # PNG: the DAVIS palette), a score threshold, SAM 2's postprocessing
    "later-per-obj-thresh-post": [
        "--per-obj-png-file",
        "--track-object-appearing-later-in-video",
        "--score-thresh",
        "-0.5",
        "--apply-postprocessing",
    ],
}


def stem(t: int) -> str:
    return f"{t * 5:05d}"  # names that are numbers but not indices, as in YouTube-VOS


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("vos")
    for video, (T, seed) in VIDEOS.items():
        frames, masks = make_sample.make_clip(num_frames=T, width=80, height=60, seed=seed)
        (root / "JPEGImages" / video).mkdir(parents=True)
        for t, frame in enumerate(frames):
            Image.fromarray(frame).save(root / "JPEGImages" / video / f"{stem(t)}.jpg", quality=90)
        for t in ANNOTATED[video]:
            ids = np.zeros(masks.shape[2:], np.uint8)
            for o in (2, 1, 0):
                if video == LATER[0] and o + 1 == LATER[1] and t < LATER[2]:
                    continue
                ids[masks[t, o]] = o + 1
            img = Image.fromarray(ids, mode="L").convert("P")
            img.putpalette(PALETTE)
            (root / "Annotations" / video).mkdir(parents=True, exist_ok=True)
            img.save(root / "Annotations" / video / f"{stem(t)}.png")
            for obj in np.unique(ids[ids > 0]) if t else range(1, 4):
                if video == LATER[0] and obj == LATER[1] and t < LATER[2]:
                    continue
                folder = root / "PerObject" / video / f"{obj:03d}"
                folder.mkdir(parents=True, exist_ok=True)
                single = Image.fromarray((ids == obj).astype(np.uint8), mode="L").convert("P")
                single.putpalette(PALETTE)
                single.save(folder / f"{stem(t)}.png")
    return root


def mask_dir(root: Path, flags) -> Path:
    return root / ("PerObject" if "--per-obj-png-file" in flags else "Annotations")


def dataset_args(root: Path, out: Path, work: Path, flags) -> list:
    return [
        "dataset",
        "--base-video-dir",
        root / "JPEGImages",
        "--input-mask-dir",
        mask_dir(root, flags),
        "--output-mask-dir",
        out,
        "--work-dir",
        work,
        "--image-size",
        IMAGE_SIZE,
        "--chunk-size",
        CHUNK,
        "--random-weights",
        SEED,
        "--device",
        "cpu",
        *flags,
    ]


@pytest.fixture(scope="module")
def oracles(dataset, tmp_path_factory) -> dict:
    """Each variant's oracle output folder (computed when first asked) and its failures."""
    from vos_oracle import ToolError, oracle_predictor, oracle_video

    cache = {}

    def get(name):
        if name not in cache:
            flags = VARIANTS[name]
            per_obj = "--per-obj-png-file" in flags
            predictor = oracle_predictor(
                IMAGE_SIZE, SEED, per_obj=per_obj, postprocessing="--apply-postprocessing" in flags
            )
            thresh = (
                float(flags[flags.index("--score-thresh") + 1])
                if "--score-thresh" in flags
                else 0.0
            )
            out, failed = tmp_path_factory.mktemp(f"oracle-{name}"), []
            for video in VIDEOS:
                try:
                    oracle_video(
                        predictor,
                        dataset / "JPEGImages",
                        mask_dir(dataset, flags),
                        out,
                        video,
                        score_thresh=thresh,
                        use_all_masks="--use-all-masks" in flags,
                        per_obj=per_obj,
                        later="--track-object-appearing-later-in-video" in flags,
                    )
                except ToolError:
                    failed.append(video)
            cache[name] = (out, failed)
        return cache[name]

    return get


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """One work folder for the variants: decoded and encoded once, retracked per variant."""
    return tmp_path_factory.mktemp("work")


def png_files(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p for p in sorted(folder.rglob("*.png"))}


def assert_same_pngs(ours: Path, theirs: Path) -> int:
    """Same files; in each, the same pixel values, mode and palette. Returns the count."""
    a, b = png_files(ours), png_files(theirs)
    assert sorted(a) == sorted(b), sorted(set(a) ^ set(b))
    for name in a:
        with Image.open(a[name]) as x, Image.open(b[name]) as y:
            assert x.mode == y.mode == "P", name
            assert x.getpalette() == y.getpalette(), name
            assert np.array_equal(np.array(x), np.array(y)), name
    return len(a)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_dataset_pngs_equal_vos_inference(variant, dataset, oracles, work, tmp_path):
    flags = VARIANTS[variant]
    theirs, failed = oracles(variant)
    out = tmp_path / "out"
    proc = segpipe(*dataset_args(dataset, out, work, flags))
    assert "Traceback" not in proc.stderr, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[1:] if line.strip()}
    assert sorted(rows) == sorted(VIDEOS), proc.stdout
    for video in VIDEOS:
        assert ("failed" in rows[video]) == (video in failed), (video, rows[video], proc.stderr)
    if failed:
        assert_user_error(proc, f"{len(failed)} of 3 videos failed")
        assert all(not (out / v).exists() for v in failed)
    else:
        assert proc.returncode == 0, proc.stderr
    per_obj = "--per-obj-png-file" in flags
    expected = sum(T * (3 if per_obj else 1) for v, (T, _) in VIDEOS.items() if v not in failed)
    assert assert_same_pngs(out, theirs) == expected
    # masks are not trivial: the tracked frames hold objects, in the annotations' palette
    values = [np.array(Image.open(p)) for p in png_files(out).values()]
    assert sum(v.any() for v in values) >= len(values) // 2
    from vos_oracle import voc_palette

    later = "--track-object-appearing-later-in-video" in flags
    palette = voc_palette() if per_obj and later else PALETTE
    assert Image.open(next(iter(png_files(out).values()))).getpalette() == palette


def test_which_videos_fail_where(oracles):
    """The premise of the comparisons above: each mode has the tool's failures."""
    assert oracles("default")[1] == []
    assert oracles("use-all-masks")[1] == ["dogs"]  # object 3 new on a later frame
    assert oracles("per-obj-png-file")[1] == ["dogs"]  # object 3 has no first-frame PNG
    assert oracles("later-objects")[1] == []
    assert oracles("later-per-obj-thresh-post")[1] == []


def test_kill_mid_second_video_then_rerun(dataset, oracles, tmp_path):
    """kill -9 while the second video tracks: the rerun leaves the first video alone and
    ends with the oracle's PNGs."""
    import subprocess

    from conftest import spawn

    out, work = tmp_path / "out", tmp_path / "work"
    args = [str(a) for a in dataset_args(dataset, out, work, [])]
    proc = spawn(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    second = work / "cows.zarr"
    chunks = -(-VIDEOS["cows"][0] // CHUNK)
    try:
        assert wait_for(lambda: ledger_count(second, "export_vos") >= 1, proc, timeout=300)
        freeze(proc)
        done = ledger_count(second, "track_forward")
        assert 1 <= done < chunks, done  # the kill lands mid-video
        # outputs appear chunk by chunk, as the chunks are tracked
        assert CHUNK <= len(png_files(out / "cows")) < VIDEOS["cows"][0]
        exported = tree_mtimes(out / "cows")
        tracked_chunk_0 = (second / "ledger" / "track_forward" / "0" / "c" / "0").stat().st_mtime_ns
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    first = {
        **tree_mtimes(out / "bear"),
        **{f"store/{k}": v for k, v in tree_mtimes(work / "bear.zarr").items()},
    }
    rerun = segpipe(*dataset_args(dataset, out, work, []), check=True)
    assert "already done" in next(
        line for line in rerun.stdout.splitlines() if line.startswith("bear")
    )
    assert first == {
        **tree_mtimes(out / "bear"),
        **{f"store/{k}": v for k, v in tree_mtimes(work / "bear.zarr").items()},
    }
    assert_same_pngs(out, oracles("default")[0])
    # the second video resumed: its chunks done before the kill were not done again
    now = tree_mtimes(out / "cows")
    assert all(now[name] == mtime for name, mtime in exported.items() if name.endswith(".png"))
    assert (
        second / "ledger" / "track_forward" / "0" / "c" / "0"
    ).stat().st_mtime_ns == tracked_chunk_0


def test_a_bad_video_is_reported_and_the_others_go_on(dataset, tmp_path):
    import shutil

    root = tmp_path / "ds"
    shutil.copytree(dataset / "JPEGImages", root / "JPEGImages")
    shutil.copytree(dataset / "Annotations", root / "Annotations")
    (root / "JPEGImages" / "cows" / f"{stem(2)}.jpg").write_bytes(b"not a jpeg")
    (root / "Annotations" / "bear" / f"{stem(0)}.png").unlink()
    (root / "list.txt").write_text("bear\ncows\ndogs\n")
    proc = segpipe(
        *dataset_args(root, tmp_path / "out", tmp_path / "work", []),
        "--video-list-file",
        root / "list.txt",
        "--evaluate",
        root / "Annotations",
    )
    assert_user_error(proc, "2 of 3 videos failed", "bear", "cows")
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[1:4]}
    assert "no input mask for frame 00000" in rows["bear"]
    assert "unreadable image" in rows["cows"]
    assert rows["dogs"].rstrip().endswith("done")
    assert len(png_files(tmp_path / "out" / "dogs")) == VIDEOS["dogs"][0]
    # J&F of the videos that ran, against their annotations (dogs: frame 3 is scored)
    from segpipe.vos.davis import evaluate

    report = evaluate(tmp_path / "out", root / "Annotations", videos=["dogs"])
    assert report.table() in proc.stdout


def test_run_with_vos_options_and_an_id_mask_prompt(dataset, oracles, tmp_path):
    """`run` with the dataset's options and an `id_mask` prompt is the tool's output for that
    video; a new score threshold retracks, and the masks shrink to the logits above it."""
    import json

    from segpipe.store.runstore import RunStore

    ann = dataset / "Annotations" / "bear" / f"{stem(0)}.png"
    (tmp_path / "prompts.json").write_text(
        json.dumps({"prompts": [{"frame": 0, "id_mask": str(ann)}]})
    )
    store = tmp_path / "bear.zarr"
    common = ["--store", store, "--random-weights", SEED, "--device", "cpu"]
    segpipe(
        "run",
        dataset / "JPEGImages" / "bear",
        "--prompts",
        tmp_path / "prompts.json",
        "--image-size",
        IMAGE_SIZE,
        "--chunk-size",
        CHUNK,
        "--direction",
        "forward",
        "--no-postprocessing",
        "--non-overlap",
        "--export",
        "none",
        *common,
        check=True,
    )
    masks = RunStore.open(store).read("masks")
    ids = RunStore.open(store).attrs["track"]["object_ids"]
    assert ids == [1, 2, 3]
    theirs = oracles("default")[0] / "bear"
    for t in range(VIDEOS["bear"][0]):
        composed = np.array(Image.open(theirs / f"{stem(t)}.png"))
        for slot, obj in enumerate(ids):
            assert np.array_equal(masks[t, slot], composed == obj), (t, obj)
    segpipe("track", "--score-threshold", 3.0, *common[:2], check=True)
    settings = RunStore.open(store).attrs["track"]
    assert settings["options"] == {
        "postprocessing": False,
        "non_overlap": True,
        "score_threshold": 3.0,
        "object_start": "earliest",
    }
    higher = RunStore.open(store).read("masks")
    assert (higher <= masks).all() and higher.sum() < masks.sum()


def test_bad_tracking_options_and_id_masks_are_one_line_errors(dataset, tmp_path):
    import json

    rgb = tmp_path / "rgb.png"
    Image.new("RGB", (80, 60)).save(rgb)
    (tmp_path / "p.json").write_text(json.dumps({"prompts": [{"frame": 0, "id_mask": str(rgb)}]}))
    store = tmp_path / "s.zarr"
    base = [
        "run",
        dataset / "JPEGImages" / "cows",
        "--store",
        store,
        "--image-size",
        64,
        "--chunk-size",
        4,
        "--random-weights",
        0,
        "--export",
        "none",
    ]
    assert_user_error(segpipe(*base, "--prompts", tmp_path / "p.json"), "id_mask", "indexed")
    ann = dataset / "Annotations" / "cows" / f"{stem(0)}.png"
    (tmp_path / "q.json").write_text(json.dumps({"prompts": [{"frame": 0, "id_mask": str(ann)}]}))
    assert_user_error(
        segpipe(*base, "--prompts", tmp_path / "q.json", "--object-start", "own"),
        "--direction forward",
    )


def test_annotations_from_a_later_frame_give_pngs_from_it(dataset, tmp_path):
    """--use-all-masks on a video annotated from frame 6 on: the forward pass starts there,
    and, as in the tool, there are no PNGs for the frames before it."""
    import shutil

    from vos_oracle import oracle_predictor, oracle_video

    root = tmp_path / "ds"
    shutil.copytree(dataset / "JPEGImages" / "cows", root / "JPEGImages" / "cows")
    shutil.copytree(dataset / "Annotations" / "cows", root / "Annotations" / "cows")
    (root / "Annotations" / "cows" / f"{stem(0)}.png").unlink()
    segpipe(
        *dataset_args(root, tmp_path / "out", tmp_path / "work", ["--use-all-masks"]), check=True
    )
    oracle_video(
        oracle_predictor(IMAGE_SIZE, SEED, postprocessing=False, per_obj=False),
        root / "JPEGImages",
        root / "Annotations",
        tmp_path / "theirs",
        "cows",
        use_all_masks=True,
    )
    assert assert_same_pngs(tmp_path / "out", tmp_path / "theirs") == VIDEOS["cows"][0] - 6


def test_a_chunk_tracked_but_not_exported_is_exported_on_rerun(
    dataset, oracles, tmp_path, monkeypatch
):
    """A crash between a chunk's tracking commit and its PNGs (the process dies there): the
    rerun finds the tracking done and exports what is missing."""
    import segpipe

    class Crash(BaseException):
        pass

    from segpipe.stages.export.as_tracked import ExportsAsTracked

    committed = ExportsAsTracked.committed

    def crash_after_the_second_commit(self, direction, k):
        if k == 1:
            raise Crash()
        committed(self, direction, k)

    (tmp_path / "list.txt").write_text("bear\n")
    args = dict(
        vos=segpipe.VosInference(video_list_file=tmp_path / "list.txt"),
        encoding=segpipe.Encoding(random_weights=SEED),
        decoding=segpipe.Decoding(image_size=IMAGE_SIZE, chunk_size=CHUNK),
        execution=segpipe.Execution(device="cpu", progress=False),
    )
    out, work = tmp_path / "out", tmp_path / "work"
    monkeypatch.setattr(ExportsAsTracked, "committed", crash_after_the_second_commit)
    with pytest.raises(Crash):
        segpipe.dataset(dataset / "JPEGImages", dataset / "Annotations", out, work, **args)
    assert len(png_files(out / "bear")) == CHUNK  # chunk 1 tracked, not exported
    assert ledger_count(work / "bear.zarr", "track_forward") == 2
    monkeypatch.undo()
    [result] = segpipe.dataset(dataset / "JPEGImages", dataset / "Annotations", out, work, **args)
    assert result.status == "done"
    theirs = oracles("default")[0]
    assert assert_same_pngs(out / "bear", theirs / "bear") == VIDEOS["bear"][0]
