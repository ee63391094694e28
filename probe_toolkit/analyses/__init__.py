"""Stage 2, the science: pure functions over arrays (attention entropy, window neighbours, the
selection rules shared with ``training/``, the label-free decoder, linear probes). No file I/O
beyond the dask chunks they are handed."""
