"""The tiny-shapes-video world: one coloured shape moving on a coloured background, drawn here,
the captions people write for it, and the checker that says whether a clip moves as captioned.

A clip is FRAMES frames of SIZE x SIZE pixels: a background colour and one shape (kind circle,
square or triangle; one of the eight colours of tiny-shapes, not the background's) that
  - moves right, left, down or up: its centre travels TRAVEL pixels in a straight line at a
    steady pace, from a start drawn at random across the other axis; or
  - grows or shrinks: its half extent goes from R_SMALL to R_LARGE (or back), centred.

A caption says the shape, its motion and usually the background, the way a person might type it
(`describe`): "a red circle moves from left to right on a blue background", "a green square
falls", "on a black background, a yellow triangle grows", "blue square sliding to the left".
Without a background the background is white; words the model does not know change nothing.

Held out of training (`held_out_sets`, from a fixed seed): HELD_OUT (background, kind, colour,
motion) combinations, which no training clip holds, each in three sets: canonical captions, free
phrasings, and free phrasings with real English words the model never saw.

`check_clip` is the held-out check: per frame, the largest 4-connected region of pixels whose
nearest palette colour is the caption's colour; its centroid must travel at least DISTANCE of
the picture the caption's way with at most BACKWARD of the frame-to-frame steps going back, or
its area must grow (shrink) by AREA_RATIO; the shape must be found in most frames, and the
clip's border must be the background's colour. examples/tiny_shapes_video/clip_check.h is the
same check in C++. Deterministic: everything is drawn from numpy Generators seeded by the caller.
"""

import itertools
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tiny_shapes"))
import shapes  # noqa: E402  (tiny-shapes' palette, drawing and caption padding)

SIZE = 64
FRAMES = 17
COLOURS = shapes.COLOURS
DEFAULT_BACKGROUND = shapes.DEFAULT_BACKGROUND
KINDS = shapes.KINDS
MOTIONS = ["right", "left", "down", "up", "grow", "shrink"]
R = 8  # half extent of a moving shape
R_SMALL, R_LARGE = 5, 14  # half extents a growing (shrinking) shape goes between
TRAVEL = 36  # pixels a moving shape's centre travels
MARGIN = 12  # the centre stays this far from the picture's edges

# The checker's thresholds (clip_check.h holds the same numbers).
DISTANCE = 0.25  # of SIZE: the least net travel of the centroid the caption's way
BACKWARD = 0.25  # the most frame-to-frame steps (of FRAMES - 1) that go back more than STEP_SLACK
STEP_SLACK = 0.5  # pixels: a step back this small is noise, not a step back
AREA_RATIO = 1.5  # the least growth (shrinkage) of the area, last frame against first
MIN_AREA = 4  # pixels: a region smaller than this is not a shape
PRESENT = 0.8  # of the frames: the shape must be found in at least this many
CHECKER = {"distance": DISTANCE, "backward": BACKWARD, "step_slack": STEP_SLACK,
           "area_ratio": AREA_RATIO, "min_area": MIN_AREA, "present": PRESENT}

# How a caption may say a motion. The first phrasing is the canonical one.
MOTION_WORDS = {
    "right": ["moves from left to right", "moves right", "moves to the right", "slides right",
              "goes right", "travels from left to right", "slides to the right",
              "moving to the right", "sliding right"],
    "left": ["moves from right to left", "moves left", "moves to the left", "slides left",
             "goes left", "travels from right to left", "slides to the left",
             "moving to the left", "sliding left"],
    "down": ["falls", "moves down", "drops", "falls down", "goes down", "moves downward", "sinks",
             "falling", "moving down"],
    "up": ["rises", "moves up", "goes up", "floats up", "moves upward", "climbs", "rising",
           "moving up"],
    "grow": ["grows", "gets bigger", "expands", "grows larger", "swells", "growing",
             "getting bigger"],
    "shrink": ["shrinks", "gets smaller", "contracts", "shrinks away", "shrinking",
               "getting smaller"],
}
BACKGROUND_FORMS = {
    "after": ["{} on a B background", "{} on B", "{} against a B background",
              "{} with a B background", "{}, B background", "{} over B"],
    "before": ["a B background where {}", "B background, {}", "on a B background, {}",
               "on B, {}"],
}
PREFIXES = ["a video of", "an animation of", "a clip of", "show", "animate", "a movie where"]
SUFFIXES = ["please", "slowly"]
UNKNOWN_HELD_OUT = ["beautiful", "shiny", "wooden", "quickly", "very", "nice", "cute", "happy",
                    "bright", "simple", "lovely", "painted", "modern", "my", "flat", "smoothly",
                    "gently", "steadily", "calm", "little"]
HELD_OUT = 60
HELD_OUT_SEED = 4321


# ---------------------------------------------------------------- drawing
def track(motion, rng):
    """Per frame (cx, cy, r) of a motion, its start drawn from rng."""
    t = np.linspace(0.0, 1.0, FRAMES)
    lo, hi = MARGIN, SIZE - MARGIN
    if motion in ("right", "left", "down", "up"):
        start = rng.uniform(lo, hi - TRAVEL)
        across = rng.uniform(lo + 4, hi - 4)
        along = start + TRAVEL * t
        if motion in ("left", "up"):
            along = along[::-1]
        r = np.full(FRAMES, float(R))
        if motion in ("right", "left"):
            return along, np.full(FRAMES, across), r
        return np.full(FRAMES, across), along, r
    c = SIZE / 2
    cx, cy = c + rng.uniform(-3, 3), c + rng.uniform(-3, 3)
    r = R_SMALL + (R_LARGE - R_SMALL) * t
    if motion == "shrink":
        r = r[::-1]
    return np.full(FRAMES, cx), np.full(FRAMES, cy), r


def draw(clip, rng):
    """The frames of a clip (bg, kind, colour, motion): uint8 [FRAMES, SIZE, SIZE, 3]."""
    bg, kind, colour, motion = clip
    xs, ys, rs = track(motion, rng)
    out = np.empty((FRAMES, SIZE, SIZE, 3), dtype=np.uint8)
    for f in range(FRAMES):
        img = Image.new("RGB", (SIZE, SIZE), COLOURS[bg])
        d = ImageDraw.Draw(img)
        o = shapes.shape_outline(kind, xs[f], ys[f], rs[f])
        if kind == "circle":
            d.ellipse(o, fill=COLOURS[colour])
        elif kind == "square":
            d.rectangle(o, fill=COLOURS[colour])
        else:
            d.polygon(o, fill=COLOURS[colour])
        out[f] = np.asarray(img)
    return out


# ---------------------------------------------------------------- captions
def all_clips():
    return [(bg, kind, colour, motion)
            for bg, kind, colour, motion in itertools.product(COLOURS, KINDS, COLOURS, MOTIONS)
            if colour != bg]


_pick = shapes._pick
_article = shapes._article


def describe(clip, rng, say_background=True, canonical=False, unknown=None, unknown_rate=0.0,
             filler_rate=0.0):
    """A caption of a clip. canonical: "a C K <first motion phrasing> on a B background".
    Otherwise phrasings, orders and determiners are drawn from rng, a known filler added with
    probability filler_rate, and with unknown_rate one or two words of `unknown` (a list, or
    made-up words when None) put at random places."""
    bg, kind, colour, motion = clip
    choose = (lambda seq: seq[0]) if canonical else (lambda seq: _pick(rng, seq))
    det = _article(colour) if canonical else choose([_article(colour)] * 4 + ["one", "the", ""])
    shape = " ".join(w for w in (det, colour, kind) if w)
    phrase = choose(MOTION_WORDS[motion])
    if canonical or rng.random() < 0.85:
        body = f"{shape} {phrase}"
    else:
        body = f"{shape} that {phrase}" if not phrase.endswith("ing") else f"{shape} {phrase}"
    if say_background:
        body = shapes.with_background(body, bg, BACKGROUND_FORMS, 0.7, canonical, rng)
    return shapes.decorate(body, rng, PREFIXES, SUFFIXES, canonical, unknown, unknown_rate,
                           filler_rate)


def random_clip(rng, excluded=frozenset()):
    """A training clip and whether its caption says the background (85%; white otherwise)."""
    colours = list(COLOURS)
    while True:
        say_background = rng.random() < 0.85
        bg = _pick(rng, colours) if say_background else DEFAULT_BACKGROUND
        colour = bg
        while colour == bg:
            colour = _pick(rng, colours)
        clip = (bg, _pick(rng, KINDS), colour, _pick(rng, MOTIONS))
        if clip not in excluded:
            return clip, say_background


def training_caption(clip, say_background, rng):
    return describe(clip, rng, say_background, unknown_rate=0.15, filler_rate=0.25)


def vocabulary():
    """Every word a caption can hold but made-up ones."""
    words = {"a", "an", "one", "the", "that", "background", ","}
    words.update(COLOURS)
    words.update(KINDS)
    texts = [p for ps in MOTION_WORDS.values() for p in ps]
    texts += [f.replace("{}", "").replace("B", "") for fs in BACKGROUND_FORMS.values() for f in fs]
    texts += PREFIXES + SUFFIXES
    for t in texts:
        for w in t.replace(",", " ").split():
            words.add(w)
    return sorted(words)


def held_out_sets(seed=HELD_OUT_SEED, n=HELD_OUT):
    """(excluded clips, sets): n clips no training clip equals, each motion n / 6 times, in three
    sets of (clip, caption): canonical, free (random phrasings, the background said) and unknown
    (free phrasings with one or two real English words the model never saw)."""
    rng = np.random.default_rng(seed)
    clips = all_clips()
    held = []
    for motion in MOTIONS:
        of = [c for c in clips if c[3] == motion]
        held += [of[i] for i in sorted(rng.choice(len(of), size=n // len(MOTIONS), replace=False))]
    sets = {"canonical": [(c, describe(c, rng, canonical=True)) for c in held],
            "free": [(c, describe(c, rng)) for c in held],
            "unknown": [(c, describe(c, rng, unknown=UNKNOWN_HELD_OUT, unknown_rate=1.0))
                        for c in held]}
    return frozenset(held), sets


def write_held_out(path, sets, steps, guidance, max_sequence_length):
    import json
    doc = {"size": SIZE, "frames": FRAMES, "num_inference_steps": steps,
           "guidance_scale": guidance, "max_sequence_length": max_sequence_length,
           "checker": CHECKER, "palette": {k: list(v) for k, v in COLOURS.items()},
           "sets": {name: [{"caption": cap, "background": c[0], "kind": c[1], "colour": c[2],
                            "motion": c[3]} for c, cap in items]
                    for name, items in sets.items()}}
    with open(path, "w") as f:
        f.write(json.dumps(doc, indent=1) + "\n")


# ---------------------------------------------------------------- the checker
def nearest_palette(frames):
    """Each pixel's nearest palette colour (index into COLOURS; squared RGB distance, ties to the
    first): int [..., H, W]."""
    pal = np.array(list(COLOURS.values()), dtype=np.int64)
    d = ((frames[..., None, :].astype(np.int64) - pal) ** 2).sum(-1)
    return d.argmin(-1)


def largest_region(mask):
    """The largest 4-connected region of a bool [H, W] mask (ties: the first met in raster
    order): (pixel count, centroid x, centroid y), or (0, nan, nan)."""
    h, w = mask.shape
    seen = np.zeros_like(mask)
    best = (0, float("nan"), float("nan"))
    for y0 in range(h):
        for x0 in range(w):
            if not mask[y0, x0] or seen[y0, x0]:
                continue
            stack, n, sx, sy = [(y0, x0)], 0, 0, 0
            seen[y0, x0] = True
            while stack:
                y, x = stack.pop()
                n, sx, sy = n + 1, sx + x, sy + y
                for yy, xx in ((y - 1, x), (y + 1, x), (y, x - 1), (y, x + 1)):
                    if 0 <= yy < h and 0 <= xx < w and mask[yy, xx] and not seen[yy, xx]:
                        seen[yy, xx] = True
                        stack.append((yy, xx))
            if n > best[0]:
                best = (n, sx / n, sy / n)
    return best


def check_clip(frames, colour, background, motion):
    """Whether frames (uint8 [F, H, W, 3]) show `colour` moving as `motion` says on
    `background`: (passed, details)."""
    names = list(COLOURS)
    cls = nearest_palette(frames)
    f, h, w = cls.shape
    border = np.concatenate([cls[:, 0, :].ravel(), cls[:, -1, :].ravel(), cls[:, :, 0].ravel(),
                             cls[:, :, -1].ravel()])
    bg_ok = bool(np.bincount(border, minlength=len(names)).argmax() == names.index(background))
    regions = [largest_region(cls[i] == names.index(colour)) for i in range(f)]
    found = [r for r in regions if r[0] >= MIN_AREA]
    present = len(found) >= PRESENT * f
    details = {"background": bg_ok, "present": len(found), "passed": False}
    if not (bg_ok and present):
        return False, details
    if motion in ("grow", "shrink"):
        first, last = found[0][0], found[-1][0]
        ratio = last / first if motion == "grow" else first / last
        details["area_ratio"] = ratio
        ok = ratio >= AREA_RATIO
    else:
        axis = 1 if motion in ("right", "left") else 2
        sign = 1.0 if motion in ("right", "down") else -1.0
        pos = np.array([r[axis] for r in found]) * sign
        travel = pos[-1] - pos[0]
        back = int((np.diff(pos) < -STEP_SLACK).sum())
        details["travel"], details["back_steps"] = float(travel), back
        ok = travel >= DISTANCE * SIZE and back <= BACKWARD * (FRAMES - 1)
    details["passed"] = bool(ok)
    return bool(ok), details
