"""segpipe: segment objects through long videos with SAM 2, chunk by chunk, resumable, with
masks bit-identical to SAM 2's own video predictor.

    >>> import segpipe
    >>> run = segpipe.run("clip.mp4", "clip.zarr",
    ...                   [segpipe.Prompt(1, frame=0, points=[[120, 80]], labels=[1])],
    ...                   checkpoint="sam2.1_hiera_tiny.pt", exports=[])
    >>> run.masks(frames=slice(0, 100), objects=[1]).shape
    (100, 1, 480, 640)

Every name of the API is listed in `__all__`. `import segpipe` does not import torch: the
calls that run the model import it.
"""

from segpipe.api import (
    dataset,
    decode,
    encode,
    evaluate,
    export,
    open,
    repair,
    run,
    studio,
    track,
)
from segpipe.errors import (
    BadInput,
    DamagedStore,
    NotEnoughSpace,
    SegpipeError,
    StoreLocked,
    StoreMismatch,
    StoreNotReady,
)
from segpipe.prompts import Prompt
from segpipe.results import Run

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
