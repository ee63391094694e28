"""A label read's size check on a panel of PNG images, against decoding each image.

Reading a panel's labels checks every image's stored size against its annotation
(``labels.hygiene.check_sizes``). It reads each file's header; the EXIF orientation, which a
PNG may store after its pixels, is looked for only where a size disagrees. The baseline is what
asking every file for its orientation costs (Pillow's ``getexif()`` decodes a PNG whole), which
the check did before. Synthetic noise PNGs (incompressible, like photographs), interleaved
rounds, medians, CPU seconds.

    python benchmarks/labels.py [--images 200] [--size 500x375] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from probe_toolkit.labels import hygiene


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--size", default="500x375", help="width x height of each PNG")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.lower().split("x"))
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        listed = []
        for i in range(args.images):
            Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(folder / f"{i:05d}.png")
            listed.append({"id": i, "file_name": f"{i:05d}.png", "width": width, "height": height})

        def orientation_of_all() -> None:
            for im in listed:
                with Image.open(folder / im["file_name"]) as picture:
                    picture.getexif().get(0x0112, 1)

        sides = {"check_sizes": lambda: hygiene.check_sizes(folder / "panel.json", folder, listed), "every orientation": orientation_of_all}
        times: dict[str, list[float]] = {name: [] for name in sides}
        for r in range(args.rounds + 1):  # round 0 warms the page cache
            for name, run in sides.items() if r % 2 else list(sides.items())[::-1]:
                start = time.process_time()
                run()
                if r:
                    times[name].append(1000 * (time.process_time() - start) / args.images)
    ms = {name: statistics.median(t) for name, t in times.items()}
    print(
        f"size check {ms['check_sizes']:.3f} ms per image, every file's orientation (decoding each PNG) {ms['every orientation']:.3f} ms: "
        f"{ms['every orientation'] / ms['check_sizes']:.0f}x ({args.images} PNGs of {width}x{height}, {args.rounds} rounds, CPU)"
    )
    print(
        json.dumps(
            {
                "benchmark": "labels",
                "images": args.images,
                "size": [width, height],
                "rounds": args.rounds,
                "ms_per_image": ms,
                "cpu": platform.processor() or platform.machine(),
            }
        )
    )


if __name__ == "__main__":
    main()
