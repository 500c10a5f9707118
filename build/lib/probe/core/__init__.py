"""The science: template splits, the vocabulary table, score heads, the prefix-cache engine, the sweep, GCG and
response scoring. Nothing here parses arguments; only the sweep and GCG write checkpoints, and only when given
a run directory."""
