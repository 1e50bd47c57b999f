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


def sam2_order(T, start_frame_idx, max_frame_num_to_track, reverse):
    """The processing order of SAM 2's `propagate_in_video` (sam2 1.1.0), written out."""
    if reverse:
        end = max(start_frame_idx - max_frame_num_to_track, 0)
        return list(range(start_frame_idx, end - 1, -1)) if start_frame_idx > 0 else []
    end = min(start_frame_idx + max_frame_num_to_track, T - 1)
    return list(range(start_frame_idx, end + 1))


@pytest.mark.parametrize("direction", ["forward", "reverse"])
@pytest.mark.parametrize("start", [0, 5, 13])
@pytest.mark.parametrize("window", [(0, 14), (0, 6), (5, 6), (3, 11), (9, 14)])
def test_pass_frames_in_a_chunk_match_the_whole_pass(direction, start, window):
    from segpipe.plan import Span

    plan = ChunkPlan(14, 4)
    span = Span(start, *window)
    whole = span.frames(direction)
    assert whole == sam2_order(14, **span.sam2_arguments(direction))
    assert all(window[0] <= f < window[1] for f in whole)
    for k in plan:
        lo, hi = plan.bounds(k)
        assert span.frames_in(direction, lo, hi) == [f for f in whole if lo <= f < hi]
