"""segpipe: segment objects through long videos with SAM 2, chunk by chunk, resumable, with
masks bit-identical to SAM 2's own video predictor.

    >>> import segpipe
    >>> run = segpipe.run("clip.mp4", "clip.zarr",
    ...                   [segpipe.Prompt(1, frame=0, points=[[120, 80]], labels=[1])],
    ...                   encoding=segpipe.Encoding(checkpoint="sam2.1_hiera_tiny.pt"),
    ...                   output=segpipe.Output(exports=[]))
    >>> run.masks(frames=slice(0, 100), objects=[1]).shape
    (100, 1, 480, 640)

Every name of the API is listed in `__all__`, and imported when first used: `import
segpipe` (or `import segpipe.errors`) imports neither the API's modules nor torch; the calls
that run the model import it.
"""

import importlib as _importlib

from segpipe.errors import (
    BadInput,
    DamagedStore,
    NotEnoughSpace,
    SegpipeError,
    StoreLocked,
    StoreMismatch,
    StoreNotReady,
)

# the API's names, each imported from its module when first used: `import segpipe.errors`
# (or any module of the package) loads no more than that module needs
_LAZY = {
    **dict.fromkeys(
        [
            "run",
            "decode",
            "encode",
            "track",
            "label",
            "export",
            "repair",
            "migrate",
            "studio",
            "dataset",
        ],
        "segpipe.api",
    ),
    **dict.fromkeys(["evaluate", "open"], "segpipe.api"),
    "Run": "segpipe.results",
    "Prompt": "segpipe.prompts",
    "Label": "segpipe.labels",
    **dict.fromkeys(
        ["Decoding", "Encoding", "Tracking", "Output", "Execution"], "segpipe.settings"
    ),
    "VosInference": "segpipe.vos.dataset",
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name]), name)
    else:  # a submodule not imported yet (segpipe.api, say)
        try:
            value = _importlib.import_module(f"segpipe.{name}")
        except ModuleNotFoundError:
            raise AttributeError(f"module 'segpipe' has no attribute {name!r}") from None
    globals()[name] = value  # found directly from now on
    return value


def _limit_malloc_arenas() -> None:
    """glibc gives every thread its own malloc arena; with zarr's and our worker threads
    handling chunk-sized buffers, peak RSS then creeps up with video length. Two arenas keep
    it flat (measured in benchmarks/bench_export.py). Set when any module of segpipe is
    first imported, so Python callers, the studio and Dask workers get it as the CLI does."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").mallopt(-8, 2)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass  # not glibc


_limit_malloc_arenas()


def __dir__():
    return sorted({*(k for k in globals() if not k.startswith("_")), *_LAZY})


__all__ = [
    # the stages, and all of them in one call
    "run",
    "decode",
    "encode",
    "track",
    "export",
    "repair",
    "migrate",
    # naming the objects
    "label",
    "Label",
    # the browser studio over a store
    "studio",
    # datasets (SAM 2's vos_inference) and their DAVIS J&F
    "dataset",
    "evaluate",
    # the settings the calls take
    "Decoding",
    "Encoding",
    "Tracking",
    "Output",
    "Execution",
    "VosInference",
    # reading results back
    "open",
    "Run",
    # prompts as objects
    "Prompt",
    # errors
    "SegpipeError",
    "BadInput",
    "StoreNotReady",
    "StoreMismatch",
    "DamagedStore",
    "StoreLocked",
    "NotEnoughSpace",
]
