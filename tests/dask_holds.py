"""A Dask worker plugin that installs `kill_points.hold_at_next_record` in every worker of a
cluster, those it has and those it starts (a test registers it, then unregisters it)."""

import kill_points
from distributed.diagnostics.plugin import WorkerPlugin


class HoldAtNextRecord(WorkerPlugin):
    def __init__(self, part: str, claim: str, release: str):
        self.args = (part, claim, release)

    def setup(self, worker):
        self.undo = kill_points.hold_at_next_record(*self.args)

    def teardown(self, worker):  # unregistered: the worker writes as it did
        self.undo()
