"""Lays the frames `xfuser-run --output_type frames` wrote for a video side by side: one PNG strip
per video (every --every-th frame, each scaled up --scale times, nearest neighbour, a 2-pixel gap
between frames), for the README.

    python3 examples/tiny_shapes_video/strip.py docs/images/tiny_shapes_video

Every NAME.mp4 in the folder with its NAME_frameNNNN.png files gets NAME_strip.png beside it.
Needs Pillow.
"""

import argparse
import re
from pathlib import Path

from PIL import Image


def chosen_frames(count, every):
    """Every `every`-th frame index, and the last frame always."""
    idx = list(range(0, count, every))
    return idx if idx[-1] == count - 1 else idx + [count - 1]


def strip(frames, every, scale, gap=2):
    chosen = [frames[i] for i in chosen_frames(len(frames), every)]
    w, h = chosen[0].size
    out = Image.new("RGB", (len(chosen) * (w * scale + gap) - gap, h * scale), (255, 255, 255))
    for i, f in enumerate(chosen):
        out.paste(f.resize((w * scale, h * scale), Image.NEAREST), (i * (w * scale + gap), 0))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--scale", type=int, default=2)
    args = ap.parse_args()
    videos = sorted(args.folder.glob("*.mp4"))
    if not videos:
        raise SystemExit(f"strip.py: no .mp4 in {args.folder}")
    for video in videos:
        pattern = re.compile(re.escape(video.stem) + r"_frame(\d{4})\.png$")
        found = sorted((int(m.group(1)), p) for p in args.folder.iterdir()
                       if (m := pattern.match(p.name)))
        if not found:
            raise SystemExit(f"strip.py: {video} has no frame PNGs (run with --output_type frames)")
        if [k for k, _ in found] != list(range(len(found))):
            raise SystemExit(f"strip.py: {video}'s frames are not 0..{len(found) - 1}")
        frames = [Image.open(p).convert("RGB") for _, p in found]
        out = args.folder / f"{video.stem}_strip.png"
        strip(frames, args.every, args.scale).save(out)
        print(f"{out}: frames {chosen_frames(len(frames), args.every)} of {len(frames)}")


if __name__ == "__main__":
    main()
