"""The GPU semantics on the CPU: SAM 2 as it runs on GPUs is the predictor under bfloat16
autocast. CPU autocast runs the same code path, so segpipe with `--precision bfloat16` is
checked against SAM 2's own predictor under CPU bfloat16 autocast: masks and object scores
bit for bit, for several chunk sizes, both directions, embeddings stored in float32 and in
bfloat16. (CPU bfloat16 is slow: a short clip at image size 64.)"""

import shutil

import make_sample
import numpy as np
import pytest
import zarr
from conftest import segpipe
from oracle import oracle_tracking, same_bits

import segpipe as api
from segpipe.model import Weights, build_model
from segpipe.settings import Encoding, Execution, Tracking
from segpipe.stages.encode import encode
from segpipe.stages.track.stage import track

SIZE, T = 64, 10


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    root = tmp_path_factory.mktemp("bf16")
    frames, masks = make_sample.make_clip(num_frames=T, width=96, height=72, seed=6)
    make_sample.write_video(root / "clip.mp4", frames)
    make_sample.write_prompts(root, masks, frames=(3, 4, 6))
    return root


@pytest.fixture(scope="module")
def predictor():
    return build_model("sam2.1_hiera_t", SIZE, Weights(random_seed=0))


@pytest.fixture(scope="module")
def oracle(clip, predictor, tmp_path_factory):
    store = tmp_path_factory.mktemp("bf16o") / "o.zarr"
    api.decode(
        clip / "clip.mp4",
        store,
        decoding=api.Decoding(image_size=SIZE),
        execution=api.Execution(progress=False),
    )
    result = oracle_tracking(store, clip / "prompts.json", precision="bfloat16")
    plain = oracle_tracking(store, clip / "prompts.json")
    # the premise: bfloat16 autocast really changes SAM 2's results
    assert not same_bits(result.scores["forward"], plain.scores["forward"])
    return result


def encoded(clip, predictor, root, chunk_size, embedding_dtype):
    """The clip decoded (`segpipe.decode`, what `segpipe decode` calls) and encoded under
    bfloat16, in this process."""
    store = root / f"c{chunk_size}_{embedding_dtype}.zarr"
    api.decode(
        clip / "clip.mp4",
        store,
        decoding=api.Decoding(image_size=SIZE, chunk_size=chunk_size),
        execution=api.Execution(progress=False),
    )
    encode(
        store,
        Encoding(random_weights=0, embedding_dtype=embedding_dtype, precision="bfloat16"),
        Execution(progress=False),
        predictor=predictor,
    )
    return store


@pytest.mark.parametrize(
    "chunk_size,embedding_dtype", [(1, "float32"), (7, "float32"), (7, "bfloat16")]
)
def test_bfloat16_tracking_is_bit_identical_to_sam2_under_autocast(
    clip, predictor, oracle, tmp_path, chunk_size, embedding_dtype
):
    store = encoded(clip, predictor, tmp_path, chunk_size, embedding_dtype)
    group = zarr.open_group(str(store), mode="r")
    assert group.attrs["model"]["precision"] == "bfloat16"
    kinds = [
        (
            group[f"features/level{i}"].attrs["torch_dtype"],
            group[f"features/level{i}"].attrs["embedding_dtype"],
        )
        for i in range(3)
    ]
    # SAM 2 keeps the vision features in float32 under autocast: stored exactly either way
    assert kinds == [
        ("bfloat16", embedding_dtype),
        ("bfloat16", embedding_dtype),
        ("float32", "float32"),
    ]
    for direction in ("forward", "reverse"):
        copy = shutil.copytree(store, tmp_path / f"{direction}.zarr")
        track(
            copy,
            clip / "prompts.json",
            Tracking(direction),
            execution=Execution(progress=False),
            predictor=predictor,
        )
        got = zarr.open_group(str(copy), mode="r")
        assert oracle.masks[direction].any()
        assert np.array_equal(got["masks"][...], oracle.masks[direction]), direction
        assert same_bits(got["object_scores"][...], oracle.scores[direction]), direction
    if (chunk_size, embedding_dtype) == (7, "float32"):
        # repair under bfloat16: re-encode a chunk in the store's precision, and retrack a
        # chunk from its bfloat16 memory snapshot read back from the store
        copy = tmp_path / "forward.zarr"
        features = zarr.open_group(str(copy), mode="r")["features/level0"][...]
        (copy / "features" / "level0" / "c" / "0" / "0" / "0" / "0").unlink()
        (copy / "masks" / "c" / "1" / "0" / "0" / "0").unlink()
        api.repair(copy, execution=api.Execution(progress=False))  # what `segpipe repair` calls
        got = zarr.open_group(str(copy), mode="r")
        assert np.array_equal(got["features/level0"][...], features)
        assert np.array_equal(got["masks"][...], oracle.masks["forward"])
        assert same_bits(got["object_scores"][...], oracle.scores["forward"])


def test_default_precision_follows_the_device():
    from segpipe.model import pick_precision

    assert pick_precision(None, "cuda") == "bfloat16" and pick_precision(None, "cpu") == "float32"
    assert pick_precision("bfloat16", "cpu") == "bfloat16"


def test_precision_is_a_store_setting(clip, predictor, tmp_path):
    store = encoded(clip, predictor, tmp_path, 16, "float32")
    proc = segpipe("encode", "--store", store, "--random-weights", 0, "--precision", "float32")
    assert proc.returncode == 1 and "model precision=bfloat16, not float32" in proc.stderr, (
        proc.stderr
    )
