"""Stage 1, checkpoint to store: read a checkpoint safely, build its timm ViT, cut the views,
run one forward per view and cache tokens, keys and attention in zarr. Never reads a label."""
