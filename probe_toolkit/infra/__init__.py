"""What every stage leans on and none owns: errors, atomic writes, progress, memory, provenance,
and the one runner that maps a function over a store's images locally, on dask or by shards."""
