"""Concept prompts: SAM 3's concept model (`sam3-video-mini`: the real architecture, small,
seeded random weights) tracked chunk by chunk by segpipe, bit for bit transformers' own
`Sam3VideoModel` processing the whole video in one session (`hf_oracle.concept_oracle`):
masks, ids and scores, with instances appearing mid-video and others removed by its
hotstart. Chunk sizes 1, 4 and 16, a kill -9 mid-run then a rerun under `--keep masks`, two
concepts, exports and status; objects clicked beside the concepts, bit for bit transformers'
`Sam3TrackerVideoModel` loaded from the same checkpoint (`hf_oracle.click_oracle`), killed and
resumed too; bad input refused in one line."""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest
from conftest import assert_user_error, ledger_records, run_code, segpipe, tree_digest
from hf_oracle import assert_concepts_as_transformers, click_oracle, concept_oracle, hf_model
from test_families import GatedHub
from test_studio import browser, fetch, open_page  # noqa: F401 - (browser: a fixture)

from segpipe.models.hf.configs import sam3_video_config, tokenizer
from segpipe.store.runstore import RunStore

SIZE = 112  # 8 x 8 patches of 14


def run_args(small, store, chunk, *more, concepts=("fish",)):
    found = [a for c in concepts for a in ("--concept", c)]
    return (
        "run", small / "clip.mp4", "--store", store, *found, "--chunk-size", chunk,
        "--image-size", SIZE, "--model", "sam3-video-mini", "--random-weights", 0,
        "--quiet", *more,
    )  # fmt: skip


@pytest.fixture(scope="module")
def oracles(small, tmp_path_factory):
    """Per concepts: transformers' whole-video session over the small clip's frames."""
    folder = tmp_path_factory.mktemp("concepts")
    store = folder / "decoded.zarr"
    segpipe("decode", small / "clip.mp4", "--store", store, "--image-size", SIZE, check=True)
    net = hf_model("sam3-video", sam3_video_config(SIZE, mini=True), seed=0)
    out, info = {}, {}
    for c in [("fish",), ("fish", "cell")]:
        out[c], info[c] = concept_oracle(store, list(c), net, tokenizer())
    out["info"] = info
    out["clicks"] = click_oracle(store, small / "prompts.json", net)
    return out


def test_the_oracle_sees_instances_appear_and_go(oracles):
    """The test's thresholds make the model's rules work: several instances, none on the
    first frames, some first shown mid-video, some shown and then gone."""
    shown = oracles[("fish",)]
    first = {}
    for t in sorted(shown):
        for i in shown[t]:
            first.setdefault(i, t)
    assert len(first) >= 3, first
    assert min(first.values()) > 0 and len(set(first.values())) >= 2, first
    gone = [i for i, t in first.items() if any(i not in shown[u] for u in range(t, 24))]
    assert gone, "no instance leaves"
    info = oracles["info"]
    assert info[("fish",)]["removed"], "the hotstart removed nothing"
    assert all(info[("fish", "cell")]["shown"].values()), info  # each concept has instances


@pytest.mark.parametrize("chunk", [1, 4, 16])
def test_concepts_tracked_as_transformers_own_session(small, oracles, tmp_path, chunk):
    store = tmp_path / "s.zarr"
    segpipe(*run_args(small, store, chunk, "--export", "vis-json"), check=True)
    assert_concepts_as_transformers(store, oracles[("fish",)])
    # the export carries every instance, by its store id
    masks = json.loads((tmp_path / "s.export" / "masks.json").read_text())
    ids = RunStore.open(store).array("masks").attrs["object_ids"]
    assert sorted(a["object_id"] for a in masks["annotations"]) == sorted(ids)
    # a rerun is a no-op
    before = ledger_records(store, "track_forward")
    segpipe(*run_args(small, store, chunk, "--export", "vis-json"), check=True)
    assert ledger_records(store, "track_forward") == before


def test_two_concepts_keep_their_instances_apart(small, oracles, tmp_path):
    """Two concepts, each finding instances (the oracle's check): ids and masks as
    transformers' session gives them, each pixel to one instance of a concept at most."""
    store = tmp_path / "s.zarr"
    segpipe(*run_args(small, store, 4, "--export", "none", concepts=("fish", "cell")), check=True)
    assert_concepts_as_transformers(store, oracles[("fish", "cell")])
    # `track` without --concept goes on with the store's concepts (done: nothing to do)
    before = tree_digest(store)
    proc = segpipe("track", "--store", store, check=True)
    assert "already complete" in proc.stderr, proc.stderr
    assert tree_digest(store) == before


def test_objects_clicked_beside_the_concepts(small, oracles, tmp_path):
    """A point, a box and a mask (frames 5, 8 and 11) beside the concept: the clicked
    objects are transformers' `Sam3TrackerVideoModel` (from the same checkpoint) tracking
    them forward from frame 5, the instances still transformers' `Sam3VideoModel`'s, ids
    past the largest clicked one (ids 7, 4, 9 here); the export carries both, `status`
    tells them apart (with the name the prompts file gives), `track` alone or with the
    concept alone keeps the store's clicks (nothing left: a no-op)."""
    store = tmp_path / "s.zarr"
    named = json.loads((small / "prompts.json").read_text())
    ids = {1: 7, 2: 4, 3: 9}  # (the oracle's, renumbered: ids are labels to the model)
    for p in named["prompts"]:
        p["object"] = ids[p["object"]]
        if "mask" in p:
            p["mask"] = str(small / p["mask"])
    named["objects"] = [{"id": 7, "name": "missed fish"}]
    (tmp_path / "named.json").write_text(json.dumps(named))
    clicks = ("--prompts", tmp_path / "named.json", "--export", "vis-json")
    segpipe(*run_args(small, store, 4, *clicks), check=True)
    assert_concepts_as_transformers(store, oracles[("fish",)], oracles["clicks"])
    ids = RunStore.open(store).array("masks").attrs["object_ids"]
    assert ids[:3] == [7, 4, 9] and min(ids[3:]) > 9
    masks = json.loads((tmp_path / "s.export" / "masks.json").read_text())
    assert sorted({a["object_id"] for a in masks["annotations"]}) == sorted(ids)
    report = json.loads(segpipe("status", "--store", store, "--json", check=True).stdout)
    assert [o["id"] for o in report["objects"]] == [7, 4, 9]
    assert report["objects"][0]["name"] == "missed fish"
    assert report["concepts"]["instance_ids"] == ids[3:]
    before = tree_digest(store)
    for more in ((), ("--concept", "fish")):
        proc = segpipe("track", "--store", store, *more, check=True)
        assert "already complete" in proc.stderr, proc.stderr
    assert tree_digest(store) == before


KILL = """
import sys
sys.path.insert(0, "tests")
import kill_points
kill_points.mid_write(sys.argv[1], int(sys.argv[2]))
kill_points.cli(sys.argv[3:])
"""


@pytest.mark.parametrize(
    "chunk,nth,clicked", [(4, 5, False), (1, 20, False), (4, 5, True), (4, 1, True)]
)
def test_killed_mid_run_then_rerun_under_keep_masks(small, oracles, tmp_path, chunk, nth, clicked):
    """Killed halfway through writing the snapshot after chunk `nth` (chunks of 4: frames
    20 to 23; of 1: frame 20, its output final once frame 23 is tracked), or with objects
    clicked beside the concept, through writing their memory after chunk 5 or 1 (before
    the instances' snapshot; after chunk 0 nothing is tracked yet, the restart restores
    their prompted memory alone): the chunks before it committed, the rest redone from the
    snapshots before it, which hold live instances from chunk 4 on (and the clicked
    objects' memory), not tracked again, and the result transformers'."""
    store = tmp_path / "s.zarr"
    clicks = ("--prompts", small / "prompts.json") if clicked else ()
    args = run_args(small, store, chunk, "--keep", "masks", "--export", "none", *clicks)
    part = "forward/session/recent_maskmem_features/c" if clicked else "concepts"
    killed = run_code(KILL, f"memory/{part}/{nth}/", 1, *args)
    assert killed.returncode == -9, killed.stderr
    opened = RunStore.open(store)
    assert opened.pass_ledger("forward").count() == nth  # the kill landed mid-run
    restored = opened.array(f"memory/concepts/{nth - 1}").attrs["state"]
    assert bool(restored["obj_ids"]) == (nth * chunk >= 20), "live instances restored"
    if clicked:  # every clicked object has frames in reach after chunk nth - 1 (none yet
        in_reach = opened.read("memory/forward/session/recent_frame", nth - 1, nth)[0]
        assert (in_reach >= 0).any(axis=1).all() == (nth > 1), in_reach  # after chunk 0)
    committed = dict(ledger_records(store, "track_forward"))
    segpipe(*args, check=True)
    again = ledger_records(store, "track_forward")
    assert all(again[k] == t for k, t in committed.items())  # not tracked again
    assert_concepts_as_transformers(
        store, oracles[("fish",)], oracles["clicks"] if clicked else None
    )
    report = json.loads(segpipe("status", "--store", store, "--json", check=True).stdout)
    found = report["concepts"]
    assert found["concepts"] == ["fish"] and len(found["per_chunk"]) == 24 // chunk
    assert min(found["per_chunk"]) >= 0 and max(found["per_chunk"]) > 0
    assert found["instance_ids"] == opened.array("masks").attrs["object_ids"][3 if clicked else 0 :]


def test_bad_concepts_refused_in_one_line_before_any_write(small, tmp_path):
    """An empty concept, a concept for a family without a detector, clicks on the concept
    model without a concept, a concept the other way than forward: one line each, nothing
    made (`run`), an encoded store as it was (`track`)."""
    fresh = tmp_path / "new.zarr"
    assert_user_error(segpipe(*run_args(small, fresh, 4, concepts=(" ",))), "--concept is empty")
    # longer than the 32 tokens transformers' processor pads a concept to (a token a letter)
    assert_user_error(segpipe(*run_args(small, fresh, 4, concepts=("x" * 31,))), "33 tokens")
    tracker = [
        a if a != "sam3-video-mini" else "sam3-tracker-mini" for a in run_args(small, fresh, 4)
    ]
    assert_user_error(segpipe(*tracker), "has no detector")
    both = (*run_args(small, fresh, 4), "--prompts", small / "prompts.json")
    assert_user_error(segpipe(*both, "--direction", "both"), "forward from frame 0")
    clicks_alone = [a for a in both if a not in ("--concept", "fish")]
    assert_user_error(segpipe(*clicks_alone), "beside concept prompts")
    assert not fresh.exists()
    store = tmp_path / "s.zarr"
    segpipe("decode", small / "clip.mp4", "--store", store, "--image-size", SIZE, check=True)
    encode = ("encode", "--store", store, "--random-weights", 0, "--model")
    segpipe(*encode, "sam3-tracker-mini", check=True)
    before = tree_digest(store)
    proc = segpipe("track", "--store", store, "--concept", "fish")
    assert_user_error(proc, "sam3-tracker-mini has no detector")
    assert tree_digest(store) == before
    other = tmp_path / "v.zarr"
    segpipe("decode", small / "clip.mp4", "--store", other, "--image-size", SIZE, check=True)
    segpipe(*encode[:2], other, *encode[3:], "sam3-video-mini", check=True)
    before = tree_digest(other)
    for more, said in (
        (["--concept", ""], "--concept is empty"),
        (["--concept", "fish", "--direction", "reverse"], "forward from frame 0"),
        (["--concept", "fish", "--frames", "0:8"], "whole video"),
        (["--concept", "x" * 31], "33 tokens"),
        (["--prompts", small / "prompts.json"], "beside concept prompts"),
    ):
        assert_user_error(segpipe("track", "--store", other, *more), said)
    assert tree_digest(other) == before


def test_a_gated_checkpoint_without_a_login_says_how_to_log_in(small, tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), GatedHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {
            "HF_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
            "HF_HOME": str(tmp_path / "hf"),
            "HF_TOKEN": "",
        }
        store = tmp_path / "s.zarr"
        args = [a for a in run_args(small, store, 4) if a not in ("--random-weights", 0)]
        args = [a if a != "sam3-video-mini" else "sam3-video" for a in args]
        proc = segpipe(*args, "--checkpoint", "hf:facebook/sam3", env=env)
        assert_user_error(proc, "hf:facebook/sam3 is gated", "log in")
        assert not store.exists()
    finally:
        server.shutdown()


def test_the_studios_find_box_tracks_every_instance(browser, small, oracles, tmp_path):
    """segpipe studio on a store of sam3-video-mini: the concept typed in the page's box and
    Find track every instance as `segpipe track --concept` does (transformers' session's
    masks, ids and scores); the timeline has a strip per instance. An empty box, and a click
    preview on such a store, are refused in one line."""
    from segpipe.web.server import StudioServer

    store = tmp_path / "s.zarr"
    segpipe("decode", small / "clip.mp4", "--store", store, "--image-size", SIZE,
            "--chunk-size", 4, check=True)  # fmt: skip
    segpipe("encode", "--store", store, "--model", "sam3-video-mini", "--random-weights", 0,
            check=True)  # fmt: skip
    server = StudioServer(store, port=0).start()
    try:
        page = open_page(browser, server.url)
        page.fill("#concept", " ")
        page.click("#find")
        page.wait_for_function("document.getElementById('error').textContent.includes('empty')")
        page.fill("#concept", "fish")
        page.click("#find")
        deadline = time.monotonic() + 300
        while json.loads(fetch(server.url + "api/progress")[1])["state"] != "done":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert_concepts_as_transformers(store, oracles[("fish",)])
        ids = RunStore.open(store).array("masks").attrs["object_ids"]
        assert json.loads(fetch(server.url + "api/info")[1])["tracked_objects"] == ids
        scores = json.loads(fetch(server.url + "api/scores")[1])
        assert scores["objects"] == ids and len(scores["areas"]) == len(ids)
        page.wait_for_function(f"S.scores.objects.length === {len(ids)}")
        # The empty box's refusal is the only error; its events may arrive late, so they are
        # read here, after the page has been pumped, not cleared when the page showed it.
        expected = [e for e in page.errors if "api/track" in e and "is empty" in e]
        others = [e for e in page.errors if e not in expected and "status of 400" not in e]
        assert len(expected) == 1 and others == [], page.errors
        for concepts, said in ((["fish", ""], b"empty"), ([], b"no concept"), ("fish", b"list")):
            status, body, _ = fetch(server.url + "api/track", "POST", {"concepts": concepts})
            assert status == 400 and said in body, body
        status, body, _ = fetch(server.url + "api/preview", "POST", {"frame": 5, "object": 1})
        assert status == 400 and b"concepts, not clicks" in body, body
    finally:
        server.stop()
