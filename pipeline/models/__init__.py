"""Model families, one room each: what a family provides (`base.ModelFamily`), the families
segpipe knows (`registry`), and SAM 2, the first (`sam2/`). `segpipe.model` is the one way
from a model's name and weights to a predictor, whatever its family."""
