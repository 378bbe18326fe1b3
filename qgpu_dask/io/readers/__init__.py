"""One reader per file format, each streaming an acquisition's frames in blocks (``base.Reader``); the
module of each also declares its ``Format`` (detect by content, open), which ``io.registry`` lists."""
