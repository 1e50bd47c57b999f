"""Where a stage's chunks are computed, when not in this process: the interface the stages
call (`Executor`), which `segpipe.dask.client.Cluster` implements for Dask's workers.

A stage given no executor (None) computes in this process, by its own code: the encode
stage's `_encode_chunks`, the track stage's `run_passes`, an export's `Export.chunk`, the
dataset's video loop. Given one, it hands its chunks to it and waits: the same store, the
same results (tests/test_dask.py), each chunk committed by whoever computes it.
"""

from __future__ import annotations

from typing import Protocol


class Executor(Protocol):
    """What the stages ask of an executor (a Dask `Cluster`)."""

    device: str | None  # the device type its workers compute on ("cpu", "cuda"), checked alike
    size: int  # its workers: tasks side by side (groups of objects default to it)
    environments: list  # its workers' compute environments, distinct (`segpipe.environment`)

    def work(self, store, checkpoint: str | None, device: str, batch_size: int = 1):
        """The settings every task on `store` carries (weights, device, batch size, lease)."""

    def encode(self, store, chunks: list[int], work, quiet: bool) -> None:
        """Encode `chunks` of `store`, each committed by the task that computes it."""

    def track(self, store, pending: list[str], work, on_commit, quiet: bool, groups: int) -> None:
        """Run the passes `pending` of the store's recorded tracking, in `groups` groups of
        objects side by side; `on_commit(direction, k)` once every group committed chunk k."""

    def export(self, job, request: dict, k: int) -> None:
        """Export chunk k of `job` (a `stages.export.Export`) in the background."""

    def export_rest(self, jobs: list, requests: list[dict], quiet: bool) -> None:
        """Export every chunk the jobs still lack (their finish is the caller's)."""

    def videos(self, layout, names: list[str], options, out, work_dir, total: int, quiet: bool):
        """A dataset's videos side by side; their results in the videos' order."""
