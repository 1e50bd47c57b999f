"""A new user's first minutes with the command line: what it says, in what order, and
where it says it."""

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_user_error, run_args, segpipe, shell_env, tree_digest


def untracked_args(small, store) -> tuple:
    """The small clip's `run` arguments without --prompts: decoded and encoded only."""
    args = list(run_args(small, store))
    prompts = args.index("--prompts")
    del args[prompts : prompts + 2]
    return tuple(args)


@pytest.fixture(scope="module")
def untracked(small, tmp_path_factory):
    """`run` without prompts on the small clip: (the finished command, its store). The
    store is decoded and encoded, not tracked. Read-only: copy it before changing it."""
    store = tmp_path_factory.mktemp("untracked") / "s.zarr"
    return segpipe(*untracked_args(small, store), check=True), store


@pytest.fixture(scope="module")
def finished(small, tmp_path_factory):
    """`run` on the small clip with its prompts and the default exports, not on a terminal
    and not --quiet: (the finished command, its store). Read-only: copy it before
    changing it."""
    store = tmp_path_factory.mktemp("finished") / "s.zarr"
    return segpipe(*run_args(small, store), check=True), store


def test_version():
    proc = segpipe("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "segpipe, version 0.1.0"


def test_commands_are_listed_in_pipeline_order():
    proc = segpipe("--help")
    listed = [
        line.split()[0]
        for line in proc.stdout.split("Commands:")[1].splitlines()
        if line.startswith("  ")
    ]
    assert listed[:5] == ["decode", "encode", "track", "export", "run"], listed


def test_run_without_prompts_says_what_it_did_and_what_to_run_next(small, untracked):
    proc, store = untracked
    assert proc.returncode == 0, proc.stderr
    hint = [line for line in proc.stderr.splitlines() if line.startswith("run: no --prompts")]
    assert len(hint) == 1, proc.stderr
    assert "not tracked" in hint[0] and f"segpipe track --store {store}" in hint[0]
    quiet = segpipe(*untracked_args(small, store), "--quiet")
    assert quiet.returncode == 0, quiet.stderr
    assert "run: no --prompts" not in quiet.stderr  # warnings stay, notes go


def decoded_frame(video, n):
    import av
    import numpy as np

    with av.open(str(video)) as container:
        for i, frame in enumerate(container.decode(video=0)):
            if i == n:
                return np.asarray(frame.to_image())


def test_frame_shows_frame_n_at_the_videos_size_to_read_prompts_off(small, untracked, tmp_path):
    """`segpipe frame` writes frame N as a PNG at the video's own size: without a grid, the
    decoded frame itself; with one, the same size, and the line on stdout says so. From a
    store it is the store's source; with the source gone, the stored model input scaled
    back (and it says so). Bad frames are one line. (The stores are decoded by the stage
    function the CLI's `decode` calls: this test is about `frame`.)"""
    import numpy as np
    from PIL import Image

    from segpipe.settings import Decoding
    from segpipe.stages.decode import decode

    video = small / "clip.mp4"
    plain = tmp_path / "plain.png"
    proc = segpipe("frame", video, "--at", 13, "--out", plain, "--grid", 0)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{plain}: frame 13 of {video}, 96x72"), proc.stdout
    want = decoded_frame(video, 13)
    assert np.array_equal(np.asarray(Image.open(plain)), want)
    gridded = tmp_path / "grid.png"
    proc = segpipe("frame", video, "--at", 13, "--out", gridded, "--grid", 20)
    assert proc.returncode == 0 and "grid every 20 px" in proc.stdout, proc.stderr
    grid = np.asarray(Image.open(gridded))
    assert grid.shape == want.shape and not np.array_equal(grid, want)
    assert np.array_equal(grid[30:38, 50:58], want[30:38, 50:58])  # between the lines

    store = untracked[1]  # the small clip decoded in chunks of 4 (and encoded)
    from_store = tmp_path / "from_store.png"
    proc = segpipe("frame", store, "--at", 13, "--out", from_store, "--grid", 0)
    assert proc.returncode == 0, proc.stderr
    assert np.array_equal(np.asarray(Image.open(from_store)), want)

    moved = tmp_path / "moved"
    moved.mkdir()
    import shutil

    source = tmp_path / "clip.mp4"
    shutil.copy(video, source)
    store2 = tmp_path / "s2.zarr"
    decode(source, store2, Decoding(4, 128), quiet=True)
    source.rename(moved / "clip.mp4")
    scaled = tmp_path / "scaled.png"
    proc = segpipe("frame", store2, "--at", 13, "--out", scaled, "--grid", 0)
    assert proc.returncode == 0 and "scaled back" in proc.stdout, proc.stderr
    assert np.asarray(Image.open(scaled)).shape == want.shape

    for args, words in (
        ((video, "--at", 24), ("fewer than 25 frames",)),
        ((store, "--at", 24), ("out of range", "0..23")),
        ((tmp_path / "nothing.mp4", "--at", 0), ("no video",)),
        ((video, "--at", 1, "--out", tmp_path), ("is a folder",)),
    ):
        assert_user_error(segpipe("frame", *args), *words)


def write_prompts(path, entries):
    import json

    path.write_text(json.dumps({"prompts": entries}))
    return path


def test_prompts_are_checked_before_any_work(small, tmp_path):
    """What is certainly wrong is refused in one line before anything is written (no store,
    no lock file): a point outside the frame, an object id DAVIS PNGs cannot hold with the
    default exports, a frame past a frame folder's end, or past the frame count an MP4
    records. A frame past the end of a video whose container records no count (MPEG-TS) is
    refused once decoded, before any encoding; it used to be a traceback from the storage
    estimate."""
    video = small / "clip.mp4"
    point = {"object": 1, "frame": 2, "points": [[10, 10]], "labels": [1]}
    cases = {
        "outside": ({**point, "points": [[500, 10]]}, ("outside the 96x72 frame",)),
        "id0": ({**point, "object": 0}, ("davis", "1..255", "[0]")),
    }
    for name, (entry, words) in cases.items():
        store = tmp_path / f"{name}.zarr"
        prompts = write_prompts(tmp_path / f"{name}.json", [entry])
        proc = segpipe(
            "run",
            video,
            "--store",
            store,
            "--prompts",
            prompts,
            "--chunk-size",
            4,
            "--image-size",
            128,
            "--random-weights",
            0,
        )
        assert_user_error(proc, *words)
        assert not store.exists() and not store.with_name(f".{store.name}.lock").exists(), name

    folder = tmp_path / "frames"
    folder.mkdir()
    import av

    with av.open(str(video)) as container:
        for i, frame in enumerate(container.decode(video=0)):
            frame.to_image().save(folder / f"{i:05d}.jpg")
    late = write_prompts(tmp_path / "late.json", [{**point, "frame": 30}])

    def run_late(source, store):
        return segpipe(
            "run",
            source,
            "--store",
            store,
            "--prompts",
            late,
            "--chunk-size",
            4,
            "--image-size",
            128,
            "--random-weights",
            0,
        )

    # a frame folder, and an MP4 (which records its frame count): refused before decoding
    for source, store in ((folder, tmp_path / "folder.zarr"), (video, tmp_path / "video.zarr")):
        assert_user_error(run_late(source, store), "frame 30 is out of range", "0..23")
        assert not store.exists()

    import make_sample

    stream = tmp_path / "clip.ts"  # MPEG-TS records no frame count: refused once decoded
    with av.open(str(video)) as container:
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    make_sample.write_video(stream, frames)
    store = tmp_path / "stream.zarr"
    assert_user_error(run_late(stream, store), "frame 30 is out of range", "0..23")
    from segpipe.store.runstore import RunStore

    decoded = RunStore.open(store)
    assert decoded.attrs["frame_count"] == 24 and "model" not in decoded.attrs
    assert decoded.array("features/level0") is None  # nothing encoded


def test_a_stores_settings_are_the_defaults_of_later_commands(small, tmp_path):
    """Rerun on a finished store without repeating its settings: the model (the shipped
    segpipe_tiny, not the command line's sam2.1_hiera_t), image and chunk size come from
    the store, said once; it used to end in `no weights for sam2.1_hiera_t`."""
    import segpipe as api
    from segpipe.settings import Decoding
    from segpipe.stages.decode import decode

    store = tmp_path / "s.zarr"
    video, prompts = small / "clip.mp4", small / "prompts.json"
    # the stores are made in this process (what `run`, `decode`, `encode` call); the
    # commands the test is about, the ones that take the store's settings, run as commands
    api.run(
        video,
        store,
        prompts,
        encoding=api.Encoding(model="segpipe_tiny"),
        decoding=api.Decoding(image_size=128, chunk_size=8),
        output=api.Output(exports=[]),
        execution=api.Execution(progress=False),
    )
    again = segpipe("run", video, "--store", store, "--prompts", prompts, "--export", "none")
    assert again.returncode == 0, again.stderr
    said = [line for line in again.stderr.splitlines() if "the store's settings" in line]
    assert said == [
        "run: the store's settings: --chunk-size 8 --image-size 128 --model segpipe_tiny"
    ], again.stderr
    assert "already complete" in again.stderr
    seeded = tmp_path / "seeded.zarr"
    decode(video, seeded, Decoding(4, 128), quiet=True)
    api.encode(
        seeded, encoding=api.Encoding(random_weights=3), execution=api.Execution(progress=False)
    )
    proc = segpipe("encode", "--store", seeded)
    assert proc.returncode == 0, proc.stderr
    assert "encode: the store's settings: --random-weights 3" in proc.stderr


def test_a_file_export_given_a_folder_writes_into_it(finished, tmp_path):
    """`export --format vis-json --out some_dir/` used to write a file named some_dir.
    (On a copy of a finished run's store: each export here goes to a new --out.)"""
    import json

    store = shutil.copytree(finished[1], tmp_path / "s.zarr")
    folder = tmp_path / "out"
    proc = segpipe("export", "--store", store, "--format", "vis-json", "--out", f"{folder}/")
    assert proc.returncode == 0, proc.stderr
    assert folder.is_dir() and json.loads((folder / "masks.json").read_text())["videos"]
    existing = tmp_path / "existing"
    existing.mkdir()
    proc = segpipe("export", "--store", store, "--format", "overlay", "--out", existing)
    assert proc.returncode == 0, proc.stderr
    assert (existing / "overlay.mp4").stat().st_size > 0
    # per-object PNGs from `export` (only `dataset` had them): 0/1 per object and frame
    import numpy as np
    from PIL import Image

    import segpipe as package

    per_object = tmp_path / "per_object"
    proc = segpipe(
        "export", "--store", store, "--format", "davis", "--out", per_object, "--per-object"
    )
    assert proc.returncode == 0, proc.stderr
    run = package.open(store)
    masks = run.masks()
    for slot, obj in enumerate(run.object_ids):
        pngs = sorted((per_object / f"{obj:03d}").glob("*.png"))
        assert len(pngs) == run.frame_count
        for t, png in enumerate(pngs):
            assert np.array_equal(np.asarray(Image.open(png)), masks[t, slot].astype(np.uint8))


def test_status_of_a_folder_that_is_not_a_store_says_so(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "a.txt").write_text("x")
    assert_user_error(segpipe("status", "--store", folder), "is a folder but not a segpipe store")
    assert_user_error(
        segpipe("status", "--store", tmp_path / "none.zarr"), "no segpipe store", "segpipe run"
    )


def test_a_file_that_is_no_checkpoint_is_said_so_in_one_line(small, tmp_path):
    """It used to be `does not fit sam2.1_hiera_t: 101` after decoding. A file that is not a
    torch.save archive is refused before any work; a PyTorch file without SAM 2's "model"
    state dict when the model is built."""
    import torch

    text = tmp_path / "notes.pt"
    text.write_text("not weights")
    store = tmp_path / "s.zarr"
    args = (
        "run",
        small / "clip.mp4",
        "--store",
        store,
        "--prompts",
        small / "prompts.json",
        "--chunk-size",
        4,
        "--image-size",
        128,
    )
    assert_user_error(segpipe(*args, "--checkpoint", text), "is not a PyTorch checkpoint")
    assert not store.exists()
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    assert_user_error(
        segpipe(*args, "--checkpoint", other), "not a SAM 2 checkpoint", 'no "model" state dict'
    )


def test_results_go_to_stdout_and_progress_to_stderr_without_carriage_returns(
    small, finished, tmp_path
):
    """Not on a terminal (a pipe, a log file): no bar and no `\\r`, one plain line per stage
    on stderr; what was written where on stdout, `--quiet` or not."""
    proc, store = finished
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stderr and "\r" not in proc.stdout
    out = proc.stdout.splitlines()
    folder = store.with_name("s.export")
    assert out == [
        f"decode: 24 frames into {store}",
        f"track: masks for 3 objects in {store}",
        f"export davis: {folder / 'davis'}",
        f"export vis-json: {folder / 'masks.json'}",
        f"export overlay: {folder / 'overlay.mp4'}",
    ], proc.stdout
    stage_line = re.compile(
        r"^(decode|encode|track \w+|export \S+): \d+(/\d+)? frames \(\d+\.\d s\)$"
    )
    plain = [line for line in proc.stderr.splitlines() if stage_line.match(line)]
    # encoding has its line too (the chunks are encoded as the passes reach them)
    assert sorted(line.split(":")[0] for line in plain) == [
        "decode",
        "encode",
        "track forward",
        "track reverse",
    ], proc.stderr
    # the estimate: two lines (its figures, then what this command writes), before the work
    estimate = [line for line in proc.stderr.splitlines() if "estimate" in line or "writes" in line]
    assert len(estimate) == 2 and estimate[0].startswith("storage estimate: total "), estimate
    assert proc.stderr.index("storage estimate") < proc.stderr.index("decode:")
    # a rerun on the finished store writes nothing and prints no estimate
    rerun = segpipe(*run_args(small, store))
    assert rerun.returncode == 0, rerun.stderr
    assert "estimate" not in rerun.stderr and "writes up to" not in rerun.stderr, rerun.stderr
    assert not any(stage_line.match(line) for line in rerun.stderr.splitlines()), rerun.stderr
    again = tmp_path / "q.zarr"
    quiet = segpipe(
        *run_args(small, again),
        "--quiet",
    )
    assert quiet.returncode == 0, quiet.stderr
    assert [line.split(":")[0] for line in quiet.stdout.splitlines()] == [
        line.split(":")[0] for line in out
    ]
    assert not any(stage_line.match(line) for line in quiet.stderr.splitlines())


def test_the_readmes_own_video_block_runs_as_written(tmp_path):
    """The README's five lines, as a new user walks them on a video of their own (one the
    test makes): the frame is shown, the prompt's point is read off it and written, `run`
    prints where the masks went, and they are there."""
    import re
    import subprocess

    import make_sample
    import numpy as np
    from conftest import ROOT
    from PIL import Image

    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- quickstart[^>]*-->\n```sh\n(.*?)```", text, re.S).group(1)
    frames, masks = make_sample.make_clip(num_frames=12, width=160, height=120)
    make_sample.write_video(tmp_path / "my_video.mp4", frames)
    x, y = make_sample.centroid(masks[0, 0])  # the user reads this off frame0.png
    block = block.replace("[[120, 80]]", f"[[{x:.0f}, {y:.0f}]]")
    env = shell_env()
    proc = subprocess.run(
        ["bash", "-e", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    shown = np.asarray(Image.open(tmp_path / "frame0.png"))
    assert shown.shape == (120, 160, 3)
    written = [
        line.split(": ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("export ")
    ]
    assert len(written) == 3, proc.stdout
    for path in written:
        assert (tmp_path / path).exists(), path
    assert len(list((tmp_path / "my_video.export" / "davis").glob("*.png"))) == 12


def test_status_is_a_short_summary_that_knows_whether_anything_runs(finished):
    """`status` used to print 55 lines for a small store (34 of them bytes per array), no
    objects, prompts or exports, and a rate and an ETA for a process long gone."""
    import json
    import os

    from segpipe.store.lock import store_lock

    proc, store = finished
    assert proc.returncode == 0, proc.stderr
    text = segpipe("status", "--store", store, check=True).stdout
    lines = text.splitlines()
    assert len(lines) <= 25, text
    assert "not running" in lines[0], text
    assert "objects  1: points on frame 5; 2: box on frame 8; 3: mask on frame 11" in lines, text
    assert f"export   davis: {store.with_name('s.export') / 'davis'}" in lines, text
    assert "features/level0" not in text  # the bytes per array: --verbose
    verbose = segpipe("status", "--store", store, "--verbose", check=True).stdout
    assert "features/level0" in verbose and len(verbose.splitlines()) > len(lines)
    stage_rows = [line for line in lines if " / " in line]
    assert len({line.index(" / ") for line in stage_rows}) == 1, text  # columns align
    with store_lock(store):  # a live holder: this process
        report = json.loads(segpipe("status", "--store", store, "--json", check=True).stdout)
        assert report["running"]["pid"] == os.getpid()
        held = segpipe("status", "--store", store, check=True).stdout
        assert f"running: pid {os.getpid()}" in held.splitlines()[0]
    report = json.loads(segpipe("status", "--store", store, "--json", check=True).stdout)
    assert report["running"] is None
    assert [o["id"] for o in report["objects"]] == [1, 2, 3]
    assert report["exports"]["davis"]["complete"] is True


def help_examples(command: str | None) -> list[str]:
    """The example commands of `segpipe [command] --help`, continuation lines joined. The
    help is asked of the CLI in this process (click's test runner), at the width click
    formats for a command not on a terminal (80 columns less its margin of 2), so the text
    is the command's byte for byte; `test_commands_are_listed_in_pipeline_order` and
    test_dask's help test run `--help` as commands."""
    from click.testing import CliRunner

    from segpipe.cli import cli

    args = [*([command] if command else []), "--help"]
    result = CliRunner().invoke(cli, args, prog_name="segpipe", terminal_width=78)
    assert result.exit_code == 0, result.output
    text = result.output
    block = text.split("Example", 1)[1].split("\n\n", 1)[0]
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line.strip() for line in joined.splitlines() if line.strip().startswith("segpipe ")]


def serve_and_stop(line: str, cwd: Path, env: dict) -> int:
    """Run a studio example: it prints its URL, the URL answers, Ctrl-C ends it cleanly."""
    import json
    import signal
    import subprocess
    import urllib.request

    proc = subprocess.Popen(
        ["bash", "-c", f"exec {line}"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = proc.stdout.readline().split()
        assert url and url[0] == "studio:", (line, proc.stderr.read() if proc.poll() else "")
        with urllib.request.urlopen(url[1] + "api/info", timeout=30) as r:
            assert json.loads(r.read())["frames"] == 12
    finally:
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=30)[1]
    assert proc.returncode == 0 and "Traceback" not in err, (line, err)
    return 1


def test_every_help_example_runs_as_written_on_the_sample(tmp_path):
    """Each command's --help example, copied into a shell in a folder holding the sample clip
    (clip.mp4, prompts.json, names.json) and the same clip as a DAVIS-style dataset, runs as written
    with the shipped model (none needs a checkpoint or a cluster address): in pipeline
    order, in one folder, as a new user types them one after the other (the later ones
    work on the store the earlier ones made)."""
    import subprocess

    import make_sample
    import numpy as np
    from PIL import Image

    frames, masks = make_sample.make_clip(num_frames=12, width=160, height=120)
    make_sample.write_video(tmp_path / "clip.mp4", frames)
    make_sample.write_prompts(tmp_path, masks, frames=(0, 2, 4))
    images = tmp_path / "DAVIS" / "JPEGImages" / "480p" / "clip"
    notes = tmp_path / "DAVIS" / "Annotations" / "480p" / "clip"
    images.mkdir(parents=True)
    notes.mkdir(parents=True)
    for t, frame in enumerate(frames):
        Image.fromarray(frame).save(images / f"{t:05d}.jpg", quality=95)
        ids = np.zeros(masks.shape[2:], np.uint8)
        for o in (2, 1, 0):
            ids[masks[t, o]] = o + 1
        png = Image.fromarray(ids, mode="L").convert("P")
        png.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255] + [0] * 756)
        png.save(notes / f"{t:05d}.png")
    (tmp_path / "val.txt").write_text("clip\n")
    (tmp_path / "names.json").write_text('{"objects": [{"id": 1, "name": "disc"}]}')  # (--labels)
    import tifffile

    tifffile.imwrite(tmp_path / "cells.tif", frames[..., 1])  # a grey stack, as microscopes save

    order = ["decode", "encode", "track", "export", "run", "studio", "frame", "dataset"]
    order += ["repair", "migrate", "status", "evaluate", None]
    from segpipe.cli import cli

    assert set(cli.commands) == set(order) - {None}  # every command's example is run
    env = shell_env()
    ran = 0
    for command in order:
        examples = help_examples(command)
        assert examples, command
        for line in examples:
            assert "..." not in line and "tcp://" not in line and ".pt" not in line, line
            if command == "studio":  # serves until Ctrl-C: it must answer, then stop
                ran += serve_and_stop(line, tmp_path, env)
                continue
            proc = subprocess.run(
                ["bash", "-e", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True
            )
            assert proc.returncode == 0, (line, proc.stderr[-2000:])
            assert "Traceback" not in proc.stderr, line
            ran += 1
    assert ran >= 18
    assert len(list((tmp_path / "clip_davis").glob("*.png"))) == 12
    assert (tmp_path / "clip_overlay.mp4").stat().st_size > 0
    assert len(list((tmp_path / "out" / "clip").glob("*.png"))) == 12


def test_an_hf_name_without_the_network_is_refused_in_one_line_at_once(small, tmp_path):
    """An `hf:` checkpoint that is not cached, on a machine that cannot reach the hub (here
    an endpoint on a closed loopback port, and an empty cache): one line at once, not six
    lines of huggingface_hub's retries over 24 s; nothing written."""
    store = tmp_path / "s.zarr"
    env = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")}
    proc = segpipe(
        "run",
        small / "clip.mp4",
        "--store",
        store,
        "--checkpoint",
        "hf:facebook/sam2.1-hiera-tiny",
        env=env,
    )
    assert_user_error(proc, "not in the Hugging Face cache", "cannot be reached", "--checkpoint")
    assert "Retrying" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not store.exists()


def test_a_bad_tracking_window_is_refused_in_one_line(small, untracked, tmp_path):
    """`--frames` is checked against the video and the passes before anything changes."""
    assert untracked[0].returncode == 0, untracked[0].stderr
    store = shutil.copytree(untracked[1], tmp_path / "s.zarr")  # decoded and encoded
    before = tree_digest(store)
    track = ("track", "--store", store, "--prompts", small / "prompts.json")
    for frames, extra, words in (
        ("30:40", (), ("--frames starts at frame 30", "0..23")),
        ("6:6", (), ("holds no frame",)),
        ("0:25", (), ("ends past the video's frames 0..23", "0: runs to the end")),
        ("a:b", (), ("--frames must be A:B",)),
        ("0:4", ("--direction", "forward"), ("no forward pass", "frame 5")),
        ("20:", ("--direction", "reverse"), ("no reverse pass",)),
        ("6:20", ("--direction", "forward", "--object-start", "own"), ("--object-start own",)),
    ):
        assert_user_error(segpipe(*track, "--frames", frames, *extra), *words)
        assert tree_digest(store) == before, frames
