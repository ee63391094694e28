"""What every stage leans on and none owns: errors, atomic writes, progress, memory, provenance,
and the chunked runner that maps a function over a store's images locally or on dask."""
