"""The source kinds segpipe reads, each behind `base.SourceKind`: a video file (`video`, PyAV),
a frame folder (`folder`, Pillow), TIFF stacks (`tiff`, tifffile); which kind a path is
(`registry`), what it holds (`info`), how a store recognises it (`identity`), and a frame
as SAM 2's model input (`frames`)."""
