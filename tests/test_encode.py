import signal

import numpy as np
import pytest
import torch
import zarr
from conftest import (
    IMAGE_SIZE,
    EncoderCalls,
    assert_user_error,
    ledger_count,
    popen_segpipe,
    segpipe,
    tree_digest,
    wait_for,
)

from segpipe.models.sam2.frames import preprocess
from segpipe.settings import Encoding, Execution
from segpipe.stages.encode import encode
from segpipe.store.features import LEVELS, from_storage


@pytest.fixture(scope="module")
def decoded(tmp_path_factory, clip_dir):
    """The clip decoded in chunks of 8 (`segpipe.decode`, what `segpipe decode` calls).
    Read-only: tests copy it."""
    import segpipe as api

    store = tmp_path_factory.mktemp("enc") / "decoded.zarr"
    api.decode(
        clip_dir / "clip.mp4",
        store,
        decoding=api.Decoding(chunk_size=8, image_size=IMAGE_SIZE),
        execution=api.Execution(progress=False),
    )
    return store


def copy_store(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def reference_features(predictor, frames):
    """SAM 2's predictor on each frame alone, as `_get_image_feature` calls it."""
    out = [[], [], []]
    with torch.inference_mode():
        for f in frames:
            backbone = predictor.forward_image(preprocess(f[None]))
            for level, feats in enumerate(backbone["backbone_fpn"]):
                out[level].append(feats)
    return [torch.cat(level) for level in out]


def test_preprocessing_matches_sam2_frame_loader(decoded, tmp_path):
    from PIL import Image
    from sam2.utils.misc import load_video_frames

    frames = zarr.open_group(str(decoded), mode="r")["frames"][:3]
    for t, f in enumerate(frames):
        Image.fromarray(f).save(tmp_path / f"{t:05d}.jpg", format="PNG")  # lossless, SAM 2's names
    images, _, _ = load_video_frames(str(tmp_path), IMAGE_SIZE, offload_video_to_cpu=True)
    ours = preprocess(frames)
    assert torch.equal(images, ours) and ours.stride() == images.stride()


@pytest.fixture(scope="module")
def sam2_features(decoded, predictor):
    """SAM 2's features of every frame of the decoded store, computed once."""
    return reference_features(predictor, zarr.open_group(str(decoded), mode="r")["frames"][...])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_features_equal_sam2_forward_image(decoded, tmp_path, predictor, sam2_features, dtype):
    """Every frame in float32, in batches of 3; the first two chunks (16 frames) in the
    16-bit dtypes, which only store what float32 computed, rounded."""
    store = copy_store(decoded, tmp_path / "s.zarr")
    chunks = None if dtype == "float32" else [0, 1]
    encode(
        store,
        Encoding(random_weights=0, embedding_dtype=dtype, batch_size=3),
        Execution(progress=False),
        predictor=predictor,
        chunks=chunks,
    )
    group = zarr.open_group(str(store), mode="r")
    n = group["frames"].shape[0] if chunks is None else 16
    torch_dtype = getattr(torch, dtype)
    for name, expected in zip(LEVELS, sam2_features):
        expected = expected[:n]
        stored = from_storage(group[name][:n], dtype)
        # float32: exact; float16 / bfloat16: the float32 feature rounded once to the dtype
        assert torch.equal(stored, expected.to(torch_dtype).to(torch.float32)), name
        if dtype != "float32":
            ulp = torch.finfo(torch_dtype).eps * expected.abs().clamp_min(
                torch.finfo(torch_dtype).tiny
            )
            assert ((stored - expected).abs() <= ulp).all()


def test_checkpoint_file_gives_the_random_weights_features(decoded, encoded, tmp_path, checkpoint):
    """`encode --checkpoint` with the seeded weights saved as a file gives the features of
    `encode --random-weights 0` (the module's `encoded` store, only read here)."""
    a = encoded
    b = copy_store(decoded, tmp_path / "b.zarr")
    segpipe("encode", "--store", b, "--checkpoint", checkpoint, "--quiet", check=True)
    ga, gb = zarr.open_group(str(a), mode="r"), zarr.open_group(str(b), mode="r")
    for name in LEVELS:
        assert np.array_equal(ga[name][...], gb[name][...])
    assert len(gb.attrs["model"]["weights"]["checkpoint_sha256"]) == 64


def test_kill_mid_encode_then_resume_is_identical(decoded, encoded, tmp_path, predictor):
    """kill -9 mid-encode, then the same command again: the features of an uninterrupted
    encode (the module's `encoded` store, only read here), and a further encode is a no-op."""
    import segpipe as api

    ref = encoded
    store = copy_store(decoded, tmp_path / "killed.zarr")
    proc = popen_segpipe("encode", "--store", store, "--random-weights", 0)
    assert wait_for(lambda: ledger_count(store, "encode") >= 2, proc), (
        "encode ended before the kill"
    )
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert ledger_count(store, "encode") < 5
    api.encode(
        store, encoding=api.Encoding(random_weights=0), execution=api.Execution(progress=False)
    )  # the command's call, in this process
    ga, gb = zarr.open_group(str(ref), mode="r"), zarr.open_group(str(store), mode="r")
    for name in LEVELS:
        assert np.array_equal(ga[name][...], gb[name][...]), name

    calls = EncoderCalls(predictor)
    before = tree_digest(store)
    encode(store, Encoding(random_weights=0), Execution(progress=False), predictor=predictor)
    calls.close()
    assert calls.count == 0 and tree_digest(store) == before


@pytest.fixture(scope="module")
def encoded(decoded, tmp_path_factory, predictor):
    """`segpipe encode --random-weights 0` of the decoded store, uninterrupted (the stage
    function, in this process). Read-only."""
    store = copy_store(decoded, tmp_path_factory.mktemp("encoded") / "s.zarr")
    encode(store, Encoding(random_weights=0), Execution(progress=False), predictor=predictor)
    return store


@pytest.mark.parametrize(
    "args,words",
    [
        (["--model", "sam2.1_hiera_s", "--random-weights", "0"], ["model name"]),
        (["--random-weights", "1"], ["model weights"]),
        (["--random-weights", "0", "--embedding-dtype", "bfloat16"], ["embedding_dtype"]),
    ],
)
def test_mismatched_model_is_refused(encoded, args, words):
    before = tree_digest(encoded)
    assert_user_error(segpipe("encode", "--store", encoded, *args), *words)
    assert tree_digest(encoded) == before


def test_mismatched_image_size_is_refused(encoded, clip_dir):
    before = tree_digest(encoded)
    proc = segpipe(
        "run", clip_dir / "clip.mp4", "--store", encoded, "--image-size", 512, "--random-weights", 0
    )
    assert_user_error(proc, "image_size")
    assert tree_digest(encoded) == before


def test_no_weights_says_which_checkpoint_to_download(decoded):
    proc = segpipe("encode", "--store", decoded, "--model", "sam2.1_hiera_s")
    assert_user_error(proc, "sam2.1_hiera_small.pt", "--checkpoint")


def test_hf_checkpoint_offline_and_uncached_fails_clearly(decoded, tmp_path):
    before = tree_digest(decoded)
    proc = segpipe(
        "encode",
        "--store",
        decoded,
        "--checkpoint",
        "hf:facebook/sam2.1-hiera-tiny",
        env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")},
    )
    assert_user_error(proc, "hf:facebook/sam2.1-hiera-tiny", "cache")
    assert tree_digest(decoded) == before


def test_random_weights_warning_in_status(encoded):
    proc = segpipe("status", "--store", encoded, check=True)
    assert "random weights" in proc.stdout


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_features_held_in_memory_track_as_features_read_back(small, tmp_path, dtype):
    """In `run` a chunk encoded for a pass goes to the tracker from memory (`Encoded.read`),
    rounded as its stored dtype rounds it on the way to the disk and back; `track` on a
    store encoded first reads every chunk back from the disk. With a lossy embedding dtype
    (float32 features stored as bfloat16 or float16) the rounding shows in the scores: both
    ways give the same masks and scores bit for bit (and in float32, where the held levels
    are the encoder's own tensors, unrounded). In batches of 3 (chunks of 4: a batch
    of 3 and one of 1), so the held chunk's frames are served from the batches the encoder
    made (`Batches`), across a batch's end, as from the chunk read back."""
    from conftest import read_checked, run_in_process, same_values

    import segpipe as api
    from segpipe.settings import from_options

    held = tmp_path / "held.zarr"
    run_in_process(small, held, embedding_dtype=dtype, batch_size=3, exports=[])
    staged = tmp_path / "staged.zarr"
    options = dict(chunk_size=4, image_size=IMAGE_SIZE, random_weights=0, progress=False)
    options = from_options(dict(options, embedding_dtype=dtype, batch_size=3))
    api.run(small / "clip.mp4", staged, None, **options)  # encode all
    api.track(staged, small / "prompts.json", execution=api.Execution(progress=False))
    for name in ("masks", "object_scores", "object_areas"):
        assert same_values(read_checked(held, name), read_checked(staged, name)), name
    if dtype == "float32":  # the encoder's own tensors, served as views of its batches
        return
    unrounded = tmp_path / "float32.zarr"  # the premise: the rounding changes the scores
    run_in_process(small, unrounded, exports=[])
    assert not same_values(
        read_checked(held, "object_scores"), read_checked(unrounded, "object_scores")
    )
