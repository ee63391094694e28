"""Where labels enter, and only here: panels (labelled image sets with a role), the hash-chained
ledger every label read is written to first, masks as COCO RLE, and scoring against a panel."""
