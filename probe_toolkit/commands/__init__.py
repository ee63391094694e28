"""Stage 3, store to results: one module per command. Each opens the store, runs an analysis,
reads labels through a panel when it scores, and saves results with where they came from."""
