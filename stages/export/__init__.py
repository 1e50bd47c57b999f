"""Export stage: `stage` (an export and its record, chunk by chunk), `writers` (the
formats), `as_tracked` (exports of `run`, each chunk as soon as its masks are final)."""
