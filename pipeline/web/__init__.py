"""segpipe studio: prompt, review and correct a video's tracking in the browser, over its
store. `session` holds what the page shows and changes (no web), `preview` makes one frame's
mask from the stored embeddings, `app` serves both as JSON endpoints and the page."""
