"""Track stage: `stage` (settings, prompts and the passes), `tracker` (SAM 2's predictor
driven chunk by chunk from stored features), `memory` (the tracking memory saved at every
chunk boundary and injected again), `supply` (features made when a pass reaches them)."""
