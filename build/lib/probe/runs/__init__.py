"""Run bookkeeping: run directories (the only interface between scoring and analysis), one metadata schema for
every command, timing, and process groups under torchrun."""
