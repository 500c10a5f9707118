"""Remote modelling code for the tests: re-implementations of the authors' published files, as checkpoints
ship them (copied into a checkpoint folder and loaded with trust_remote_code)."""
