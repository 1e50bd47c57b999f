"""The four segpipe stages: decode, encode, track, export. Each reads its inputs from the
run store and writes its outputs to it, nothing else."""
