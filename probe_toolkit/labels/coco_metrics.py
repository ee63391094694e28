"""The COCO metrics probe reports, named once (numpy-free, so a protocol's settings can list them):
``labels.scoring`` computes them, ``probe decode-sweep`` chooses a setting by one, the tables print them."""

METRICS = ("AP", "AP50", "AP75", "AR1", "AR10", "AR100")  # COCOeval's stats 0, 1, 2, 6, 7, 8
SWEEP_METRICS = (*(f"segm_{m}" for m in METRICS), *(f"bbox_{m}" for m in METRICS), "corloc", "mean_best_iou")  # what decode-sweep can choose by
