import pytest

from segpipe.plan import ChunkPlan


def frames_of(plan):
    return [list(range(*plan.bounds(k))) for k in plan]


def test_fewer_frames_than_a_chunk():
    plan = ChunkPlan(5, 32)
    assert plan.num_chunks == 1 and plan.bounds(0) == (0, 5)


def test_exact_multiple():
    plan = ChunkPlan(96, 32)
    assert plan.num_chunks == 3 and plan.bounds(2) == (64, 96)


def test_one_frame_over_a_multiple():
    plan = ChunkPlan(97, 32)
    assert plan.num_chunks == 4 and plan.bounds(3) == (96, 97)
    assert plan.chunk_of(96) == 3 and plan.chunk_of(95) == 2


def test_chunk_size_one():
    plan = ChunkPlan(4, 1)
    assert frames_of(plan) == [[0], [1], [2], [3]]


@pytest.mark.parametrize("T,C", [(5, 32), (96, 32), (97, 32), (4, 1), (0, 3)])
def test_chunks_cover_every_frame_once(T, C):
    plan = ChunkPlan(T, C)
    assert sum(frames_of(plan), []) == list(range(T))


def test_bad_plans():
    with pytest.raises(ValueError):
        ChunkPlan(10, 0)
    with pytest.raises(IndexError):
        ChunkPlan(10, 4).bounds(3)


@pytest.mark.parametrize("direction", ["forward", "reverse"])
@pytest.mark.parametrize("start", [0, 5, 13])
def test_pass_frames_in_a_chunk_match_the_whole_pass(direction, start):
    from segpipe.plan import pass_frames, pass_frames_in

    plan = ChunkPlan(14, 4)
    whole = pass_frames(direction, start, 14)
    for k in plan:
        lo, hi = plan.bounds(k)
        assert pass_frames_in(direction, start, lo, hi) == [f for f in whole if lo <= f < hi]
