"""The run store: one zarr v3 group per video (`runstore.RunStore`), its lock
(`lock`), chunk ledger (`ledger`), layout and reset table (`layout`), and what it
records: features, masks, retention, tracking settings and the source."""

from segpipe.store.runstore import RunStore  # noqa: F401 - segpipe.store.RunStore
