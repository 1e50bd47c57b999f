"""A video file or a folder of frames: what it holds (`info`), its frames read with PyAV
(`video`) or Pillow (`folder`), how a store recognises it (`identity`), and a frame as
SAM 2's model input (`frames`)."""
