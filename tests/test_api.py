"""The Python API alone (no subprocess for the pipeline): prompts as objects, results read back,
every error class; and the package as pip installs it."""

import json
import shutil
import subprocess
import sys

import make_sample
import numpy as np
import pytest
import zarr
from conftest import IMAGE_SIZE, ROOT
from oracle import oracle_tracking, same_bits
from PIL import Image

import segpipe
from segpipe import prompts as prompt_file

SIZE = IMAGE_SIZE


@pytest.fixture(scope="module")
def api_run(tmp_path_factory, clip_dir):
    """The whole pipeline through `segpipe.run`, prompts given as objects (the mask one as a
    numpy array), equal to the clip's prompts file."""
    root = tmp_path_factory.mktemp("api")
    entries = json.loads((clip_dir / "prompts.json").read_text())["prompts"]
    objects = []
    for e in entries:
        if "mask" in e:
            mask = np.asarray(Image.open(clip_dir / e["mask"]))  # uint8 0/255
            objects.append(segpipe.Prompt(e["object"], e["frame"], mask=mask))
        else:
            objects.append(
                segpipe.Prompt(
                    e["object"],
                    e["frame"],
                    points=e.get("points"),
                    labels=e.get("labels"),
                    box=e.get("box"),
                )
            )
    run = segpipe.run(
        clip_dir / "clip.mp4",
        root / "clip.zarr",
        objects,
        decoding=segpipe.Decoding(chunk_size=6, image_size=SIZE),
        encoding=segpipe.Encoding(random_weights=0),
        output=segpipe.Output(exports=["davis", "vis-json"]),
        execution=segpipe.Execution(progress=False),
    )
    return run


def test_run_through_the_api_matches_sam2(api_run, clip_dir):
    assert isinstance(api_run, segpipe.Run)
    expected = oracle_tracking(api_run.path, clip_dir / "prompts.json")
    assert expected.masks["both"].any()
    assert np.array_equal(api_run.masks(), expected.masks["both"])
    assert same_bits(api_run.scores, expected.scores["both"])
    assert np.array_equal(api_run.areas, expected.masks["both"].sum((2, 3)))
    # the objects are the file's prompts: the same identity as loading the file
    T, (W, H) = api_run.frame_count, api_run.size
    stored = zarr.open_group(str(api_run.path), mode="r").attrs["track"]["prompts_sha256"]
    assert stored == prompt_file.digest(prompt_file.load(clip_dir / "prompts.json", T, W, H))
    folder = segpipe.api.export_folder(api_run.path)
    assert len(list((folder / "davis").iterdir())) == 40 and (folder / "masks.json").is_file()


def test_reading_results_back(api_run):
    run = segpipe.open(api_run.path)
    group = zarr.open_group(str(run.path), mode="r")
    masks, scores = group["masks"][...], group["object_scores"][...]
    assert run.frame_count == 40 and run.fps == 24.0 and run.size == (160, 120)
    assert run.object_ids == [1, 2, 3]
    assert np.allclose(np.diff(run.timestamps), 1 / 24, atol=1e-3)
    part = run.masks(frames=slice(5, 17), objects=[3, 1])  # crosses chunks 0, 1 and 2
    assert part.shape == (12, 2, 120, 160) and part.dtype == bool
    assert np.array_equal(part, masks[5:17][:, [2, 0]])
    assert np.array_equal(run.masks(frames=slice(None, None, 7)), masks[::7])
    assert np.array_equal(run.mask(13, 2), masks[13, 1])
    assert np.array_equal(run.scores, scores, equal_nan=True) and run.tracked.all()
    chunks = list(run.iter_masks(frames=slice(4, 20)))
    assert [list(idx) for idx, _ in chunks] == [
        [4, 5],
        list(range(6, 12)),
        list(range(12, 18)),
        [18, 19],
    ]
    assert run.status()["stages"]["track_forward"]["done"] == 6


def test_prompts_as_dicts_and_a_new_track(api_run, tmp_path):
    store = shutil.copytree(api_run.path, tmp_path / "s.zarr")
    kept = segpipe.open(store)  # kept across the retrack: it must follow the store
    assert kept.object_ids == [1, 2, 3]
    mask = np.zeros((120, 160), bool)
    mask[40:60, 50:90] = True
    run = segpipe.track(
        store,
        [
            {"object": 5, "frame": 30, "mask": mask},
            {"object": 6, "frame": 30, "points": np.array([[20.0, 30.0]]), "labels": np.array([1])},
        ],
        tracking=segpipe.Tracking(direction="forward"),
        execution=segpipe.Execution(progress=False),
    )
    assert run.object_ids == [5, 6] and kept.object_ids == [5, 6]
    assert np.array_equal(kept.mask(31, 6), run.mask(31, 6))
    assert np.array_equal(kept.masks(frames=slice(30, 40)), run.masks(frames=slice(30, 40)))
    assert not run.tracked[:30].any() and run.tracked[30:].all()
    assert not run.masks(frames=slice(0, 30)).any()  # untracked frames read as empty
    out = segpipe.export(
        store, "davis", tmp_path / "d", frames=slice(28, 33), objects=[6], progress=False
    )
    assert sorted(p.name for p in out.iterdir()) == [f"{t:05d}.png" for t in range(28, 33)]


def test_progress_false_prints_nothing(clip_dir, tmp_path, capfd):
    segpipe.decode(
        clip_dir / "clip.mp4",
        tmp_path / "q.zarr",
        decoding=segpipe.Decoding(chunk_size=8, image_size=32),
        execution=segpipe.Execution(progress=False),
    )
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""


def test_every_error_class(api_run, clip_dir, tmp_path):
    assert all(
        issubclass(c, segpipe.SegpipeError)
        for c in (
            segpipe.BadInput,
            segpipe.StoreNotReady,
            segpipe.StoreMismatch,
            segpipe.DamagedStore,
            segpipe.StoreLocked,
        )
    )
    with pytest.raises(segpipe.BadInput, match="video not found"):
        segpipe.decode(
            tmp_path / "nope.mp4", tmp_path / "a.zarr", execution=segpipe.Execution(progress=False)
        )
    with pytest.raises(segpipe.BadInput, match="prompt #0"):  # frame 99 of 40
        segpipe.track(
            api_run.path,
            [segpipe.Prompt(1, 99, box=[0, 0, 5, 5])],
            execution=segpipe.Execution(progress=False),
        )
    with pytest.raises(segpipe.BadInput, match="unknown object id 9"):
        api_run.masks(objects=[9])
    decoded = tmp_path / "d.zarr"
    segpipe.decode(
        clip_dir / "clip.mp4",
        decoded,
        decoding=segpipe.Decoding(chunk_size=8, image_size=32),
        execution=segpipe.Execution(progress=False),
    )
    with pytest.raises(segpipe.StoreNotReady, match="not encoded yet"):
        segpipe.track(
            decoded, clip_dir / "prompts.json", execution=segpipe.Execution(progress=False)
        )
    with pytest.raises(segpipe.StoreNotReady, match="no tracking results"):
        segpipe.open(decoded).masks()
    with pytest.raises(segpipe.StoreMismatch, match="chunk_size"):
        segpipe.decode(
            clip_dir / "clip.mp4",
            decoded,
            decoding=segpipe.Decoding(chunk_size=4),
            execution=segpipe.Execution(progress=False),
        )
    damaged = shutil.copytree(api_run.path, tmp_path / "damaged.zarr")
    (damaged / "masks" / "c" / "2" / "0" / "0" / "0").unlink()
    with pytest.raises(segpipe.DamagedStore, match="'masks' chunk 2 is missing"):
        segpipe.open(damaged).masks(frames=slice(10, 14))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import time; from segpipe.store.lock import store_lock\n"
                f"with store_lock({str(decoded)!r}):\n    print('held', flush=True); time.sleep(60)"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(segpipe.StoreLocked, match=f"pid {holder.pid}"):
            segpipe.decode(
                clip_dir / "clip.mp4", decoded, execution=segpipe.Execution(progress=False)
            )
    finally:
        holder.kill()
        holder.wait()


def test_import_segpipe_does_not_import_torch():
    code = "import sys, segpipe; print('torch' in sys.modules, 'sam2' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_pip_install_puts_only_segpipe_in_site_packages(tmp_path):
    """`pip install .` of a copy of the source (without dependencies: no network) into an
    empty target folder."""
    src, target = tmp_path / "src", tmp_path / "site"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "pipeline", "stages"):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(
            ROOT / name,
            src / name,
            **({"ignore": shutil.ignore_patterns("__pycache__")} if (ROOT / name).is_dir() else {}),
        )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "--target",
            str(target),
            str(src),
        ],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    names = sorted(p.name for p in target.iterdir() if p.name != "bin")
    assert names == ["segpipe", "segpipe-0.1.0.dist-info"], names
    assert (target / "segpipe" / "stages" / "track" / "stage.py").is_file()
    assert (target / "segpipe" / "__init__.py").read_text() == (
        ROOT / "pipeline" / "__init__.py"
    ).read_text()


def test_api_names_survive_their_modules_being_imported():
    """A submodule named like an API function would replace it on the package once
    imported (the import system binds submodules as package attributes)."""
    import importlib
    import pkgutil

    import segpipe

    for info in pkgutil.iter_modules(segpipe.__path__):
        importlib.import_module(f"segpipe.{info.name}")
    for name in segpipe.__all__:
        assert not isinstance(getattr(segpipe, name), type(segpipe)), name


def test_reading_one_mask_reads_only_its_object_and_frames(tmp_path):
    """`run.mask(f, o)` and `run.masks(frames, objects)` read the zarr chunks of the objects
    and frames asked for, not the whole (C, O, H, W) store chunk: measured with tracemalloc
    (numpy's buffers are traced), one mask of three objects in a chunk of 8 frames peaks
    under 60% of the chunk's bytes (the whole-chunk read it replaced: over 100%), and the
    masks read are the store's."""
    import tracemalloc

    frames, masks = make_sample.make_clip(num_frames=8, width=512, height=384, seed=2)
    make_sample.write_video(tmp_path / "clip.mp4", frames)
    make_sample.write_prompts(tmp_path, masks, frames=(0, 2, 4))
    store = tmp_path / "s.zarr"
    segpipe.run(
        tmp_path / "clip.mp4",
        store,
        tmp_path / "prompts.json",
        decoding=segpipe.Decoding(chunk_size=8, image_size=IMAGE_SIZE),
        encoding=segpipe.Encoding(random_weights=0),
        output=segpipe.Output(exports=[]),
        execution=segpipe.Execution(progress=False),
    )
    run = segpipe.open(store)
    whole = zarr.open_group(str(store), mode="r")["masks"][...]
    chunk_bytes = whole.nbytes  # one store chunk: all 8 frames, 3 objects
    tracemalloc.start()
    one = run.mask(5, 2)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert np.array_equal(one, whole[5, 1])
    assert peak < chunk_bytes * 0.6, (peak, chunk_bytes)
    assert np.array_equal(run.masks(slice(2, 7), [3, 1]), whole[2:7][:, [2, 0]])
    assert np.array_equal(run.masks(slice(None, None, -1), [2]), whole[::-1][:, [1]])
    assert np.array_equal(run.masks(slice(1, 8, 3)), whole[1:8:3])


def test_a_threads_predictor_is_built_once_and_a_rewritten_checkpoint_again(tmp_path):
    """`model.shared_predictor`: the same settings in one thread give the same predictor
    (built once: the stages of a command, the API calls that follow one another); another
    thread gets its own; other settings another; `release_predictors` lets it go. A
    checkpoint file written again (other weights at the same path and of the same size, its
    old modification time put back, as `cp -p` does) is built again, with the new weights;
    `Models(keep=2)` keeps two, the least recently used let go."""
    import os
    import threading

    import torch

    from segpipe.model import Models, Weights, build_model, release_predictors, shared_predictor

    seed0 = Weights(random_seed=0)
    first = shared_predictor("sam2.1_hiera_t", SIZE, seed0, "cpu")
    assert shared_predictor("sam2.1_hiera_t", SIZE, seed0, "cpu") is first
    other = []
    thread = threading.Thread(
        target=lambda: other.append(shared_predictor("sam2.1_hiera_t", SIZE, seed0, "cpu"))
    )
    thread.start()
    thread.join()
    assert other[0] is not first
    assert shared_predictor("sam2.1_hiera_t", SIZE, seed0, "cpu") is first
    release_predictors()
    assert shared_predictor("sam2.1_hiera_t", SIZE, seed0, "cpu") is not first
    assert shared_predictor("sam2.1_hiera_t", SIZE, seed0, "cpu", non_overlap=True) is not first

    models = Models(keep=2)
    path = tmp_path / "w.pt"
    torch.save({"model": build_model("sam2.1_hiera_t", SIZE, seed0).state_dict()}, path)
    on_file = Weights(checkpoint=path)
    a = models.get("sam2.1_hiera_t", SIZE, on_file, "cpu")
    assert models.get("sam2.1_hiera_t", SIZE, on_file, "cpu") is a
    old = path.stat()
    torch.save(
        {"model": build_model("sam2.1_hiera_t", SIZE, Weights(random_seed=1)).state_dict()}, path
    )
    os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns))
    assert path.stat().st_size == old.st_size
    b = models.get("sam2.1_hiera_t", SIZE, on_file, "cpu")
    assert b is not a
    weight = "image_encoder.trunk.patch_embed.proj.weight"
    assert not torch.equal(a.state_dict()[weight], b.state_dict()[weight])
    c = models.get("sam2.1_hiera_t", SIZE, seed0, "cpu")  # kept: b, c
    assert len(models.built) == 2 and models.get("sam2.1_hiera_t", SIZE, on_file, "cpu") is b
    models.get("sam2.1_hiera_t", SIZE, Weights(random_seed=2), "cpu")  # c, used least lately, goes
    assert models.get("sam2.1_hiera_t", SIZE, on_file, "cpu") is b
    assert models.get("sam2.1_hiera_t", SIZE, seed0, "cpu") is not c
