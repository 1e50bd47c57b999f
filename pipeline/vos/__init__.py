"""Datasets as SAM 2's tools/vos_inference.py runs them: `inputs` (the dataset's videos,
annotations and prompts), `dataset` (one resumable store per video), `davis` (J&F)."""
