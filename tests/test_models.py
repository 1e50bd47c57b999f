"""The model-family room: a family registered from a test file alone is offered and asked
for its weights and sizes; what it says it cannot do is refused in one line."""

import pytest

from segpipe.errors import BadInput
from segpipe.models import registry
from segpipe.models.base import ModelFamily, Sizes, Weights


class Small(ModelFamily):
    name = "small"
    models = ("small-1",)
    checkpoints_from_hub = False
    tracks_with_segpipe = False

    def weights(self, model, checkpoint, random_seed):
        return Weights(random_seed=random_seed)

    def sizes(self, model):
        return Sizes(16, 32, 3, 4, ((4, 4), (8, 8), (32, 16)))


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(registry, "FAMILIES", dict(registry.FAMILIES))
    return registry.register(Small())


def test_a_family_registered_here_is_offered_and_asked(small):
    from segpipe import model
    from segpipe.estimate import model_sizes

    assert "small-1" in registry.models() and registry.family_of("small-1") is small
    assert model.resolve_weights("small-1", None, 3) == Weights(random_seed=3)
    assert model_sizes("small-1").mem_dim == 16
    assert model_sizes("sam2.1_hiera_t").levels == ((32, 16, 4), (64, 16, 2), (256, 16, 1))
    with pytest.raises(ValueError, match="registered already"):
        registry.register(Small())


def test_what_a_family_cannot_do_is_refused_in_one_line(small):
    from segpipe import model

    with pytest.raises(BadInput, match="small-1 takes no hf: checkpoint") as e:
        model.resolve_weights("small-1", "hf:someone/small", None)
    assert "\n" not in str(e.value)
    with pytest.raises(BadInput, match="unknown model 'nope'; choose one of .*small-1"):
        model.resolve_weights("nope", None, 0)
