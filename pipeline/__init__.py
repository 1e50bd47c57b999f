"""segpipe: segment objects through long videos with SAM 2, chunk by chunk, resumable, with
masks bit-identical to SAM 2's own video predictor.

    >>> import segpipe
    >>> run = segpipe.run("clip.mp4", "clip.zarr",
    ...                   [segpipe.Prompt(1, frame=0, points=[[120, 80]], labels=[1])],
    ...                   checkpoint="sam2.1_hiera_tiny.pt", exports=[])
    >>> run.masks(frames=slice(0, 100), objects=[1]).shape
    (100, 1, 480, 640)

Every name of the API is listed in `__all__`, and imported when first used: `import
segpipe` (or `import segpipe.errors`) imports neither the API's modules nor torch; the calls
that run the model import it.
"""

import importlib

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
        ["run", "decode", "encode", "track", "export", "repair", "studio", "dataset"],
        "segpipe.api",
    ),
    **dict.fromkeys(["evaluate", "open"], "segpipe.api"),
    "Run": "segpipe.results",
    "Prompt": "segpipe.prompts",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'segpipe' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__():
    return sorted({*globals(), *_LAZY})


__all__ = [
    # the stages, and all of them in one call
    "run",
    "decode",
    "encode",
    "track",
    "export",
    "repair",
    # the browser studio over a store
    "studio",
    # datasets (SAM 2's vos_inference) and their DAVIS J&F
    "dataset",
    "evaluate",
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
