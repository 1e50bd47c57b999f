"""SAM 2's room: its models and weights (`catalog`), building its predictor (`build`), and
the family that ties them to segpipe (`family`)."""
