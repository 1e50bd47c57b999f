"""Dask distributed (`--workers N`, `--scheduler ADDRESS`): `client` is what the client
sends and watches, `tasks` what a worker runs. Stages never import Dask: they are handed a
`client.Cluster` and call its methods."""
