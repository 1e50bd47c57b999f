"""Objects tracked in groups (`stages.track.groups`): each group a pass of its own over the
chunks with its own memory, and the masks and object scores bit for bit those of SAM 2's own
`SAM2VideoPredictor` (built with `sam2.build_sam` directly) tracking every object together:
1, 5 and 11 objects in 1, 2 and 5 groups, prompts on one frame and on different frames,
points, boxes and masks, forward, reverse and both, chunk sizes 1 and 4, non-overlap. Here
the groups run one after another in this process, at its thread count, as the oracle does;
on Dask workers (side by side, at the workers' thread count) in `test_dask.py` and
`test_dask_bits.py`."""

from __future__ import annotations

import json
import shutil

import make_sample
import numpy as np
import pytest
from conftest import (
    IMAGE_SIZE,
    assert_same_store,
    ledger_records,
    read_checked,
    same_values,
    tree_digest,
)
from oracle import oracle_tracking, sam2_predictor
from PIL import Image
from test_track import assert_matches_oracle

from segpipe.settings import Decoding, Encoding, Execution, Tracking, from_options
from segpipe.stages.decode import decode
from segpipe.stages.encode import encode
from segpipe.stages.track.groups import object_groups, split
from segpipe.stages.track.stage import track
from segpipe.store.runstore import RunStore

T, W, H = 12, 96, 72
SIZE = IMAGE_SIZE


@pytest.fixture(scope="module")
def predictor():
    from segpipe.model import Weights, build_model

    return build_model("sam2.1_hiera_t", SIZE, Weights(random_seed=0))


@pytest.fixture(scope="module")
def clip(tmp_path_factory, predictor):
    """A 12-frame clip, encoded in chunks of 1 and of 4 (read-only: copy before tracking)."""
    root = tmp_path_factory.mktemp("groups")
    frames, _ = make_sample.make_clip(num_frames=T, width=W, height=H, seed=3)
    make_sample.write_video(root / "clip.mp4", frames)
    for C in (1, 4):
        store = root / f"c{C}.zarr"
        decode(root / "clip.mp4", store, Decoding(C, SIZE), quiet=True)
        encode(store, Encoding(random_weights=0), Execution(progress=False), predictor=predictor)
    return root


def many_prompts(folder, n: int, frames: tuple, kinds=("points", "box", "mask")):
    """Prompts for objects 1..n spread over the frame, object i on frames[i % len(frames)],
    as points (one positive, one negative), a box or a mask, in turn."""
    entries = []
    for i in range(n):
        frame = frames[i % len(frames)]
        x, y = 6 + (i % 8) * 11, 10 + (i // 8) * 30
        kind = kinds[i % len(kinds)]
        entry = {"object": i + 1, "frame": frame}
        if kind == "points":
            entry.update(points=[[x, y], [x + 5, y + 9]], labels=[1, 0])
        elif kind == "box":
            entry.update(box=[x - 4, y - 4, x + 5, y + 7])
        else:
            mask = np.zeros((H, W), np.uint8)
            mask[y - 4 : y + 6, x - 3 : x + 4] = 255
            Image.fromarray(mask).save(folder / f"mask{i + 1}.png")
            entry.update(mask=f"mask{i + 1}.png")
        entries.append(entry)
    path = folder / f"prompts{n}_{'_'.join(map(str, frames))}.json"
    path.write_text(json.dumps({"prompts": entries}))
    return path


# (objects, prompted frames, direction, chunk size, groups)
CASES = [
    (11, (1, 5, 9), "forward", 4, (5,)),  # 1 group: every other tracking test
    (5, (4,), "forward", 1, (2, 5)),
    (5, (3, 7), "reverse", 4, (2,)),
    (1, (6,), "both", 1, (2,)),
]


@pytest.mark.parametrize("objects, frames, direction, chunk_size, groups", CASES)
def test_groups_are_sam2s_predictor_bit_for_bit(
    clip, predictor, tmp_path, objects, frames, direction, chunk_size, groups
):
    prompts = many_prompts(tmp_path, objects, frames)
    passes = ("forward", "reverse") if direction == "both" else (direction,)
    oracle = oracle_tracking(clip / f"c{chunk_size}.zarr", prompts, directions=passes)
    stores = []
    for g in groups:
        store = shutil.copytree(clip / f"c{chunk_size}.zarr", tmp_path / f"g{g}.zarr")
        track(
            store,
            prompts,
            Tracking(direction),
            execution=Execution(progress=False, groups=g),
            predictor=predictor,
        )
        assert_matches_oracle(store, oracle, direction, f"{objects} objects, {g} groups")
        stores.append(store)
    for store in stores[1:]:  # memory and ledgers too: a store's layout is the grouping's own
        assert_same_store(stores[0], store)
    # one zarr chunk per object of every per-object array (groups never share a file)
    s = RunStore.open(stores[-1])
    assert all(s.array(n).chunks[1] == 1 for n in ("masks", "object_scores", "tracked"))
    folder = s.path / "memory" / ("reverse" if direction == "reverse" else "forward")
    assert sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) == list(range(objects))


def test_non_overlap_runs_as_one_group_and_is_sam2s(clip, tmp_path):
    """Under non-overlap each pixel goes to the highest-scoring object of the frame, which
    couples the objects' outputs: asked for 5 groups, the pass runs as one (every object's
    logits of a frame together), and the masks are SAM 2's with `non_overlap_masks` on (on
    prompts whose masks overlap without it: groups tracked apart would differ). One object
    lacking a chunk redoes it with all of them, to the same store."""
    prompts = many_prompts(tmp_path, 5, (4,), kinds=("box",))
    entries = json.loads(prompts.read_text())["prompts"]
    for e in entries:  # boxes that overlap their neighbours'
        x0, y0, x1, y1 = e["box"]
        e["box"] = [max(0, x0 - 8), y0, min(W - 1, x1 + 8), min(H - 1, y1 + 20)]
    prompts.write_text(json.dumps({"prompts": entries}))
    store = shutil.copytree(clip / "c4.zarr", tmp_path / "s.zarr")
    sam2 = sam2_predictor("sam2.1_hiera_t", SIZE, 0, non_overlap=True)
    oracle = oracle_tracking(store, prompts, predictor=sam2)
    overlapping = oracle_tracking(store, prompts)  # SAM 2 without non-overlap
    assert (overlapping.masks["both"].sum(axis=1) > 1).any()  # it matters here
    track(
        store,
        prompts,
        Tracking("both", non_overlap=True),
        execution=Execution(progress=False, groups=5),
    )
    assert_matches_oracle(store, oracle, "both", "non-overlap")
    assert (read_checked(store, "masks").sum(axis=1) <= 1).all()
    opened = RunStore.open(store)
    settings = opened.attrs["track"]
    forward = [1, 2]  # from frame 4 on, in chunks of 4
    assert object_groups(opened, "forward", forward, 5, settings["options"]) == []
    before = shutil.copytree(store, tmp_path / "before.zarr")
    opened.ledger("track_forward/3").undo(2)  # one object lacks a chunk: all of them redo it
    assert object_groups(opened, "forward", forward, 5, settings["options"]) == [[0, 1, 2, 3, 4]]
    track(
        store,
        prompts,
        Tracking("both", non_overlap=True),
        execution=Execution(progress=False, groups=5),
    )
    assert_same_store(before, store)


def test_objects_from_their_own_starts_in_groups(clip, predictor, tmp_path):
    """`object_start="own"` (each object tracked from its own first prompt, as
    vos_inference tracks objects that appear later; compared with vos_inference itself in
    test_dataset.py): the same store in 1 group and in 3."""
    prompts = many_prompts(tmp_path, 5, (1, 4, 7))
    stores = []
    for g in (1, 3):
        store = shutil.copytree(clip / "c4.zarr", tmp_path / f"g{g}.zarr")
        track(
            store,
            prompts,
            Tracking("forward", object_start="own"),
            execution=Execution(progress=False, groups=g),
        )
        stores.append(store)
    assert_same_store(*stores)
    scores = read_checked(stores[1], "object_scores")
    assert np.isnan(scores[:4, 1]).all() and not np.isnan(scores[4:, 1]).any()


def test_run_in_groups_exports_each_chunk_once_every_group_has_it(clip, tmp_path):
    """`run --groups 2` in one process: the groups run one after another, and a chunk is
    exported only once the last group has committed it (exporting after the first group
    read the other groups' masks before they were written): the run's store and exports
    are those of the run in one group."""
    import segpipe as api

    prompts = many_prompts(tmp_path, 5, (2, 6))
    runs = []
    for g in (1, 2):
        store = tmp_path / f"g{g}" / "s.zarr"
        settings = dict(chunk_size=4, image_size=SIZE, random_weights=0, progress=False)
        settings.update(exports=["davis"], groups=g)
        api.run(clip / "clip.mp4", store, prompts, **from_options(settings))
        runs.append(store)
    assert_same_store(*runs, skip_attrs=("exports",))
    a, b = (tree_digest(r.with_name("s.export")) for r in runs)
    assert a == b and len([n for n in a if n.endswith(".png")]) == T


def test_repair_finds_damage_in_a_chunk_only_some_objects_have_done(clip, predictor, tmp_path):
    """Groups commit apart, so a chunk can be done for some objects only (a kill between
    two groups): `repair` checks each object's done chunks, its memory and its own zarr
    chunks of the results, and redoes exactly those, for that object."""
    import segpipe as api

    prompts = many_prompts(tmp_path, 4, (1,))
    whole = shutil.copytree(clip / "c4.zarr", tmp_path / "whole.zarr")
    track(
        whole,
        prompts,
        Tracking("forward"),
        execution=Execution(progress=False, groups=2),
        predictor=predictor,
    )
    store = shutil.copytree(whole, tmp_path / "damaged.zarr")
    opened = RunStore.open(store)
    opened.ledger("track_forward/3").undo(2)  # chunk 2: done for objects 0..2 only
    name = "memory/forward/0/recent_maskmem"
    victim = opened.chunk_file(name, 2, opened.array(name).ndim)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    scores = store / "object_scores" / "c" / "2" / "1"  # object 1's scores of chunk 2
    scores.unlink()
    shutil.rmtree(store / "memory" / "forward" / "2" / "recent_score")  # a whole array
    found = api.repair(store, execution=api.Execution(progress=False))
    assert {(d.array, d.chunk, d.slot) for d in found} == {
        ("memory/forward/0/recent_maskmem", 2, None),
        ("object_scores", 2, 1),
        *(("memory/forward/2/recent_score", k, None) for k in (0, 1, 2)),
    }
    assert_same_store(whole, store)


def test_a_group_resumes_from_its_own_objects_ledgers(clip, predictor, tmp_path):
    """What a kill between two objects' records leaves (some objects of a group have a
    chunk done, others not): the next run tracks, in groups cut where the objects' ledgers
    differ, only what each object lacks, from its own memory snapshot, and rewrites no
    record an object had: the store is the uninterrupted run's."""
    prompts = many_prompts(tmp_path, 5, (1, 6))
    whole = shutil.copytree(clip / "c4.zarr", tmp_path / "whole.zarr")
    track(
        whole,
        prompts,
        Tracking("forward"),
        execution=Execution(progress=False, groups=1),
        predictor=predictor,
    )
    store = shutil.copytree(whole, tmp_path / "cut.zarr")
    opened = RunStore.open(store)
    for slot, chunks in ((1, [2]), (2, [1, 2]), (3, [2])):  # records lost, data left
        for k in chunks:
            opened.ledger(f"track_forward/{slot}").undo(k)
    options = opened.attrs["track"]["options"]
    assert object_groups(opened, "forward", [0, 1, 2], 2, options) == [[1], [2], [3]]
    assert object_groups(opened, "forward", [0, 1, 2], 1, options) == [[1], [2], [3]]
    kept = {s: ledger_records(store, f"track_forward/{s}") for s in range(5)}
    track(
        store,
        prompts,
        Tracking("forward"),
        execution=Execution(progress=False, groups=2),
        predictor=predictor,
    )
    assert_same_store(whole, store)
    for s, records in kept.items():
        now = ledger_records(store, f"track_forward/{s}")
        assert all(now[k] == t for k, t in records.items()), s  # no record written again
        assert len(now) == 3
    assert ledger_records(store, "track_forward").keys() == {0, 1, 2}


def test_split_is_contiguous_and_even():
    assert split(list(range(16)), 5) == [
        [0, 1, 2, 3],
        [4, 5, 6],
        [7, 8, 9],
        [10, 11, 12],
        [13, 14, 15],
    ]
    assert split([0], 2) == [[0]] and split([0, 1, 2], 1) == [[0, 1, 2]]


def test_a_frames_object_independent_steps_run_once_for_all_its_objects(clip, predictor, tmp_path):
    """`stages.track.shared`: the first memory-attention layer's self-attention and the
    memory encoder's `pix_feat_proj` take the same input for every object of a frame; they
    run once a tracked frame, not once per object, and the masks and scores stay SAM 2's
    predictor's bit for bit (its predictor computes them for each object)."""
    from segpipe.stages.track.shared import PerFrame

    prompts = many_prompts(tmp_path, 5, (4,))
    oracle = oracle_tracking(clip / "c4.zarr", prompts, directions=("forward",))
    store = shutil.copytree(clip / "c4.zarr", tmp_path / "s.zarr")
    steps = PerFrame.of(predictor).steps
    before = {name: step.computed for name, step in steps.items()}
    track(
        store,
        prompts,
        Tracking("forward"),
        execution=Execution(progress=False),
        predictor=predictor,
    )
    assert_matches_oracle(store, oracle, "forward", "shared steps")
    ran = {name: step.computed - before[name] for name, step in steps.items()}
    tracked = T - 4 - 1  # frames 5..11, after the prompted frame 4
    # the prompted frame's memory is encoded outside the frame loop, once per object
    assert ran == {"self_attention": tracked, "pix_feat_proj": tracked + 5}, ran


def test_shared_steps_compare_bits_not_values():
    import torch

    from segpipe.stages.track.shared import Shared, same

    x = torch.tensor([0.0, float("nan"), 1.0])
    assert same((x,), (x.clone(),))  # a NaN is its own bits
    assert not same((x,), (torch.tensor([-0.0, float("nan"), 1.0]),))  # -0.0 is not 0.0
    assert not same((x,), (x.double(),)) and not same((x,), (x[:2],))
    y = torch.arange(6.0).reshape(2, 3)
    assert not same((y,), (y.t().contiguous().t(),))  # same values, another layout
    calls = Shared(lambda t: t * 2)
    calls.on = True
    calls(x), calls(x.clone())
    assert calls.computed == 1  # the equal input shared
    assert torch.equal(calls(x + 1)[2:], torch.tensor([4.0])) and calls.computed == 2
    z = torch.ones(2)
    calls(z)
    z.add_(1)  # changed in place since: computed anew, not the held output
    assert torch.equal(calls(z), torch.full((2,), 4.0)) and calls.computed == 4


def test_object_batch_stacks_objects_through_sam2s_step(clip, predictor, tmp_path):
    """`object_batch` (`--object-batch K`, `stages.track.batch`): up to K objects of a frame
    whose memories are read from the same frames go through SAM 2's step together, as its
    legacy predictor batches them. Not SAM 2's predictor's bits (batched kernels), but its
    masks nearly; the same store in chunks of 1 and of 4 and after a resume (the batches
    depend only on the frame and the memories: the objects run as one group); a setting of
    the store like the others (kept when not given, 1 recorded as none, a change tracks
    anew, and 1 is SAM 2's predictor again)."""
    from segpipe.errors import BadInput

    prompts = many_prompts(tmp_path, 5, (4,))
    oracle = oracle_tracking(clip / "c4.zarr", prompts, directions=("forward",))
    steps = []  # the batch size of every SAM 2 step the tracker runs
    run_step = predictor._run_single_frame_inference

    def counted(**kwargs):
        steps.append(kwargs["batch_size"])
        return run_step(**kwargs)

    predictor._run_single_frame_inference = counted
    try:
        stores = []
        for C in (1, 4):
            store = shutil.copytree(clip / f"c{C}.zarr", tmp_path / f"b{C}.zarr")
            track(
                store,
                prompts,
                Tracking("forward", object_batch=4),
                execution=Execution(progress=False),
                predictor=predictor,
            )
            stores.append(store)
    finally:
        del predictor._run_single_frame_inference
    # each object's prompt through SAM 2's API, then frames 5..11 in batches of 4 and 1
    assert steps == ([1] * 5 + [4, 1] * (T - 4 - 1)) * 2, steps
    for name in ("masks", "object_scores", "object_areas", "tracked"):
        assert same_values(read_checked(stores[0], name), read_checked(stores[1], name)), name
    store = stores[1]
    masks, scores = read_checked(store, "masks"), read_checked(store, "object_scores")
    expected = oracle.masks["forward"]
    assert masks[:4].sum() == 0 and np.array_equal(masks[4], expected[4])  # prompted: SAM 2's
    # nearly SAM 2's (here, at 64 on one thread, equal but for rounding in the scores);
    # an object given another one's pointers or memories moves its scores by 1e-4 or more
    assert (masks != expected).sum() <= 0.001 * expected.sum(), (masks != expected).sum()
    assert np.nanmax(np.abs(scores - oracle.scores["forward"])) < 1e-5
    opened = RunStore.open(store)
    options = opened.attrs["track"]["options"]
    assert options["object_batch"] == 4
    assert object_groups(opened, "forward", [1, 2], 5, options) == []
    before = shutil.copytree(store, tmp_path / "before.zarr")
    opened.ledger("track_forward/3").undo(2)  # one object lacks a chunk: all of them redo it
    assert object_groups(opened, "forward", [1, 2], 5, options) == [[0, 1, 2, 3, 4]]
    track(
        store,
        prompts,
        Tracking("forward"),
        execution=Execution(progress=False, groups=3),
        predictor=predictor,
    )  # the store's
    assert_same_store(before, store)
    with pytest.raises(BadInput, match="^--object-batch must be a positive integer, got 0$"):
        track(
            store,
            prompts,
            Tracking("forward", object_batch=0),
            execution=Execution(progress=False),
            predictor=predictor,
        )
    assert_same_store(before, store)
    track(
        store,
        prompts,
        Tracking("forward", object_batch=1),
        execution=Execution(progress=False),
        predictor=predictor,
    )
    assert "object_batch" not in RunStore.open(store).attrs["track"]["options"]
    assert_matches_oracle(store, oracle, "forward", "object batch 1")


def test_object_batches_hold_only_objects_whose_memories_sam2_reads_alike(
    clip, predictor, tmp_path
):
    """Objects prompted on other frames are read from other memory frames by SAM 2: they go
    through its step in separate batches (`stacked` refuses a batch whose objects' memory
    frames differ), and the masks stay SAM 2's but for rounding."""
    prompts = many_prompts(tmp_path, 5, (2, 6))  # objects 1, 3, 5 on frame 2; 2, 4 on 6
    oracle = oracle_tracking(clip / "c4.zarr", prompts, directions=("forward",))
    steps = []
    run_step = predictor._run_single_frame_inference

    def counted(**kwargs):
        steps.append((kwargs["frame_idx"], kwargs["batch_size"]))
        return run_step(**kwargs)

    predictor._run_single_frame_inference = counted
    try:
        store = shutil.copytree(clip / "c4.zarr", tmp_path / "s.zarr")
        track(
            store,
            prompts,
            Tracking("forward", object_batch=4),
            execution=Execution(progress=False),
            predictor=predictor,
        )
    finally:
        del predictor._run_single_frame_inference
    assert [n for _, n in steps[:5]] == [1] * 5  # SAM 2's own calls for the prompts
    tracked = steps[5:]
    # from frame 2 on, in two kinds: objects 1, 3, 5 (memory of frame 2) and 2, 4 (of their
    # prompt on frame 6, read from the start); on frame 2 and frame 6 each kind has its
    # prompts' outputs, so the other kind alone is tracked there
    expected = [(2, 2)] + [(f, n) for f in range(3, T) for n in ((3,) if f == 6 else (3, 2))]
    assert sorted(tracked) == sorted(expected), tracked
    masks, expected_masks = read_checked(store, "masks"), oracle.masks["forward"]
    assert (masks != expected_masks).sum() <= 0.001 * expected_masks.sum()
    scores = read_checked(store, "object_scores")
    assert np.nanmax(np.abs(scores - oracle.scores["forward"])) < 1e-5
