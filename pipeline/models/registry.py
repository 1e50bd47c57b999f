"""The model families segpipe knows, and which family a model name belongs to. A new family
is a `base.ModelFamily` and one `register` (the built-in ones here)."""

from __future__ import annotations

from segpipe.errors import BadInput
from segpipe.models.base import ModelFamily
from segpipe.models.hf.family import EDGETAM, SAM3_TRACKER, SAM3_VIDEO
from segpipe.models.sam2.family import SAM2

FAMILIES: dict[str, ModelFamily] = {}


def register(family: ModelFamily) -> ModelFamily:
    """Add `family` (a name or a model name taken is refused: nothing silently replaced)."""
    taken = set(models())
    if family.name in FAMILIES or taken & set(family.models):
        raise ValueError(f"model family {family.name!r} or one of its models is registered already")
    FAMILIES[family.name] = family
    return family


def models() -> list[str]:
    """Every model name, family by family."""
    return [m for family in FAMILIES.values() for m in family.models]


def family_of(model: str) -> ModelFamily:
    """The family of the model named `model` (unknown: `BadInput` listing them)."""
    for family in FAMILIES.values():
        if model in family.models:
            return family
    raise BadInput(f"unknown model {model!r}; choose one of {', '.join(models())}")


register(SAM2)
register(EDGETAM)
register(SAM3_TRACKER)
register(SAM3_VIDEO)
