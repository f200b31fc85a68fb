"""The tiny-shapes world: coloured shapes on a coloured background, drawn here, and the captions
people write for them.

A scene is a background colour and one to three shapes, each a (kind, colour, size, place): kind
circle, square or triangle; one of eight colours, not the background's; size small, medium or
large; place a cell of a 3x3 grid of the 96x96 picture (distinct cells).

A caption says some of that, the way a person might type it (`describe`):
  - every word order and phrasing of `PLACE_WORDS`, `SIZE_WORDS`, `BACKGROUND_FORMS`: "a big red
    circle in the top-left corner on a blue background", "a blue background with a red circle",
    "red circle on blue", "in the middle, a tiny green square";
  - what it leaves out has a default: no size -> medium; no background -> white; no place -> the
    center for one shape, free (any cells) for several; counts for equal shapes ("two red circles",
    "three tiny blue squares and a green triangle") at free places;
  - words it does not know ("a nice picture of ...", made-up words) change nothing.

Held out of training (`held_out_sets`, from a fixed seed): 300 one-shape scenes (bg, kind,
colour, size, place), which no training picture holds even as one of its shapes, and multi-shape
scenes no training picture equals. Deterministic: everything is drawn from numpy Generators
seeded by the caller.
"""

import itertools

import numpy as np
from PIL import Image, ImageDraw

SIZE = 96
GRID = 3
CELL = SIZE / GRID
# Well separated in RGB, so a pixel's nearest palette colour names it without doubt.
COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 170, 60),
    "blue": (40, 70, 220),
    "yellow": (240, 210, 40),
    "purple": (140, 50, 180),
    "orange": (245, 130, 20),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
}
DEFAULT_BACKGROUND = "white"
KINDS = ["circle", "square", "triangle"]
PLURAL = {"circle": "circles", "square": "squares", "triangle": "triangles"}
SIZES = {"small": 7, "medium": 10, "large": 13}  # half extent in pixels
DEFAULT_SIZE = "medium"
JITTER = 2  # pixels of random offset of a shape's center inside its cell
CENTER = (1, 1)

# How a caption may say each thing. The first phrasing is the canonical one (heldout.json).
SIZE_WORDS = {"small": ["small", "tiny", "little"], "medium": ["medium", "medium-sized"],
              "large": ["large", "big", "huge"]}
_CORNER = {"top left": ["top left", "top-left", "upper left"],
           "top right": ["top right", "top-right", "upper right"],
           "bottom left": ["bottom left", "bottom-left", "lower left"],
           "bottom right": ["bottom right", "bottom-right", "lower right"]}


def _corner(words):
    out = []
    for w in words:
        out += [f"at the {w}", f"in the {w}", f"in the {w} corner", w]
    return out


PLACE_WORDS = {
    (0, 0): _corner(_CORNER["top left"]),
    (0, 1): ["at the top", "at the top center", "in the top middle", "at the top centre", "top",
             "top center", "top middle"],
    (0, 2): _corner(_CORNER["top right"]),
    (1, 0): ["on the left", "at the left", "in the middle left", "on the left side", "left",
             "middle left"],
    (1, 1): ["in the center", "in the centre", "in the middle", "at the center", "center",
             "centre", "middle", "centered"],
    (1, 2): ["on the right", "at the right", "in the middle right", "on the right side", "right",
             "middle right"],
    (2, 0): _corner(_CORNER["bottom left"]),
    (2, 1): ["at the bottom", "at the bottom center", "in the bottom middle", "at the bottom centre",
             "bottom", "bottom center", "bottom middle"],
    (2, 2): _corner(_CORNER["bottom right"]),
}
# A background colour B said after the shapes, or before them ({} is the shapes).
BACKGROUND_FORMS = {
    "after": ["{} on a B background", "{} on B", "{} on a B backdrop", "{} against a B background",
              "{} with a B background", "{}, B background", "{} on a background of B",
              "{} over B"],
    "before": ["a B background with {}", "B background, {}", "on a B background, {}",
               "a B background and {}"],
}
PREFIXES = ["a picture of", "an image of", "a drawing of", "draw", "please draw", "show",
            "an illustration of", "i want"]
SUFFIXES = ["please", "thanks"]
NUMBERS = {2: "two", 3: "three"}
# Made-up words mixed into training captions so that words the model does not know are ignored:
# syllables never forming a caption word. Held-out scenes use real English words instead.
_SYLLABLES = ["ka", "lo", "mi", "zu", "ter", "po", "na", "vex", "ri", "dol", "gu", "sha", "fen",
              "wib", "qua", "ro", "tis", "bel", "mun", "yo"]
UNKNOWN_HELD_OUT = ["beautiful", "shiny", "wooden", "quickly", "very", "nice", "cute", "happy",
                    "bright", "simple", "lovely", "painted", "modern", "my", "flat", "clean",
                    "vivid", "sharp", "tidy", "calm"]


def cell_center(place):
    row, col = place
    return ((col + 0.5) * CELL, (row + 0.5) * CELL)


# ---------------------------------------------------------------- drawing
def shape_outline(kind, cx, cy, r):
    """The polygon (or the ellipse's box) of a shape of half extent r centered at (cx, cy)."""
    if kind == "circle":
        return [cx - r, cy - r, cx + r, cy + r]
    if kind == "square":
        s = r * 0.85
        return [cx - s, cy - s, cx + s, cy + s]
    h = r * 0.9  # an upright triangle, as wide as high, its box centered
    return [(cx, cy - h), (cx - r, cy + h), (cx + r, cy + h)]


def draw(scene, rng):
    """The picture of a scene (uint8 HxWx3), with the shapes' centers jittered by rng."""
    bg, items = scene
    img = Image.new("RGB", (SIZE, SIZE), COLOURS[bg])
    d = ImageDraw.Draw(img)
    for kind, colour, size, place in items:
        cx, cy = cell_center(place)
        cx += rng.uniform(-JITTER, JITTER)
        cy += rng.uniform(-JITTER, JITTER)
        outline = shape_outline(kind, cx, cy, SIZES[size])
        fill = COLOURS[colour]
        if kind == "circle":
            d.ellipse(outline, fill=fill)
        elif kind == "square":
            d.rectangle(outline, fill=fill)
        else:
            d.polygon(outline, fill=fill)
    return np.asarray(img)


# ---------------------------------------------------------------- scenes
def single_scenes():
    """Every one-shape scene (the shape's colour differs from the background)."""
    return [(bg, ((kind, colour, size, place),))
            for bg, kind, colour, size, place in itertools.product(COLOURS, KINDS, COLOURS, SIZES,
                                                                   PLACE_WORDS)
            if colour != bg]


def key(scene):
    """A scene as a set: the order its shapes are listed in does not matter."""
    return (scene[0], tuple(sorted(scene[1])))


class Spec:
    """What a caption says of a scene: the scene, and which of its parts are left out."""

    def __init__(self, scene, say_background=True, say_sizes=None, say_places=True, groups=None):
        self.scene = scene
        self.say_background = say_background
        self.say_sizes = say_sizes if say_sizes is not None else [True] * len(scene[1])
        self.say_places = say_places
        # Lists of shape indices said together as a count ("two red circles"); default one each.
        self.groups = groups or [[i] for i in range(len(scene[1]))]

    def as_json(self, caption):
        bg, items = self.scene
        return {"caption": caption, "background": bg, "background_said": self.say_background,
                "places_said": self.say_places,
                "shapes": [{"kind": k, "colour": c, "size": z, "row": p[0], "col": p[1],
                            "size_said": s}
                           for (k, c, z, p), s in zip(items, self.say_sizes)]}


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def random_spec(rng, excluded=frozenset(), excluded_multi=frozenset()):
    """A scene and what its caption says, from the training distribution: one to three shapes,
    places said 80% of the time, each size 70%, the background 85%; unsaid parts take their
    defaults. Counts ("two red circles") for equal shapes at free places. No shape, with its
    background, is a held-out one-shape scene (`excluded`) and no scene is a held-out multi-shape
    one (`excluded_multi`)."""
    colours = list(COLOURS)
    while True:
        n = int(rng.choice([1, 2, 3], p=[0.4, 0.3, 0.3]))
        say_background = rng.random() < 0.85
        bg = _pick(rng, colours) if say_background else DEFAULT_BACKGROUND
        say_places = rng.random() < 0.8
        say_sizes = [bool(rng.random() < 0.7) for _ in range(n)]
        if not say_places and n == 1:
            places = [CENTER]
        else:
            idx = rng.choice(GRID * GRID, size=n, replace=False)
            places = [(int(i) // GRID, int(i) % GRID) for i in idx]
        items = []
        for i in range(n):
            colour = bg
            while colour == bg:
                colour = _pick(rng, colours)
            size = _pick(rng, list(SIZES)) if say_sizes[i] else DEFAULT_SIZE
            items.append((_pick(rng, KINDS), colour, size, places[i]))
        groups = None
        if not say_places and n >= 2 and rng.random() < 0.5:
            # A count: the first two (or all three) shapes the same.
            m = n if n == 2 or rng.random() < 0.5 else 2
            say_sizes[1:m] = [say_sizes[0]] * (m - 1)
            items[1:m] = [(items[0][0], items[0][1], items[0][2], items[i][3])
                          for i in range(1, m)]
            groups = [list(range(m))] + [[i] for i in range(m, n)]
        scene = (bg, tuple(items))
        if any((bg, (s,)) in excluded for s in items) or key(scene) in excluded_multi:
            continue
        return Spec(scene, say_background, say_sizes, say_places, groups)


# ---------------------------------------------------------------- captions
def _article(word):
    return "an" if word[0] in "aeiou" else "a"


def describe(spec, rng, canonical=False, unknown=None, unknown_rate=0.0, filler_rate=0.0):
    """A caption of `spec`. canonical: the first phrasing of everything, shapes in their listed
    order, "on a B background" (heldout.json's caption). Otherwise phrasings, orders and
    determiners are drawn from rng; with probability filler_rate a known filler ("a picture of",
    "please") is added, and with unknown_rate one or two words of `unknown` (a list, or made-up
    words when None) go at random places."""
    bg, items = spec.scene
    choose = (lambda seq: seq[0]) if canonical else (lambda seq: _pick(rng, seq))
    phrases = []
    place_first = not canonical and spec.say_places and len(items) == 1 and rng.random() < 0.2
    for group in spec.groups:
        kind, colour, size, place = items[group[0]]
        words = []
        if spec.say_sizes[group[0]]:
            words.append(choose(SIZE_WORDS[size]))
        words.append(colour)
        if len(group) > 1:
            words = [NUMBERS[len(group)]] + words + [PLURAL[kind]]
        else:
            words.append(kind)
            det = _article(words[0]) if canonical else choose(
                [_article(words[0])] * 5 + ["one", ""] + [""] * 2)
            if det:
                words = [det] + words
        text = " ".join(words)
        if spec.say_places and len(group) == 1 and not place_first:
            text += " " + choose(PLACE_WORDS[place])
        phrases.append(text)
    if not canonical:
        order = rng.permutation(len(phrases))
        phrases = [phrases[i] for i in order]
    if len(phrases) == 1:
        body = phrases[0]
    elif len(phrases) == 2:
        body = f"{phrases[0]} {choose(['and', 'and', ','])} {phrases[1]}".replace(" ,", ",")
    else:
        sep = choose([" and ", ", ", " and "])
        last = choose([" and ", ", and ", " and "])
        body = phrases[0] + sep + phrases[1] + last + phrases[2]
    if place_first:
        body = choose(PLACE_WORDS[items[0][3]]) + ", " + body
    if spec.say_background:
        body = with_background(body, bg, BACKGROUND_FORMS, 0.75, canonical, rng)
    return decorate(body, rng, PREFIXES, SUFFIXES, canonical, unknown, unknown_rate, filler_rate)


def with_background(body, bg, forms, after_rate, canonical, rng):
    """`body` with the background colour said by one of `forms` ("after": B said after the body,
    with probability after_rate; "before"; {} is the body). canonical: forms["after"][0]."""
    choose = (lambda seq: seq[0]) if canonical else (lambda seq: _pick(rng, seq))
    group = forms["after"] if canonical or rng.random() < after_rate else forms["before"]
    form = choose(group)
    return form.replace("a B", _article(bg) + " B").replace("B", bg).replace("{}", body)


def decorate(body, rng, prefixes, suffixes, canonical=False, unknown=None, unknown_rate=0.0,
             filler_rate=0.0):
    """A caption `body` as a person might pad it: with probability filler_rate a known filler (a
    prefix 70% of the time, else a suffix), and with unknown_rate one or two words of `unknown`
    (a list, or made-up words when None) at random places. canonical: `body` as it is. Shared
    with the video world (examples/tiny_shapes_video/world.py)."""
    words = body.split(" ")
    if not canonical and rng.random() < filler_rate:
        if rng.random() < 0.7:
            words = _pick(rng, prefixes).split(" ") + words
        else:
            words = words + [_pick(rng, suffixes)]
    if not canonical and rng.random() < unknown_rate:
        for _ in range(1 + int(rng.random() < 0.3)):
            if unknown is None:
                w = "".join(_pick(rng, _SYLLABLES) for _ in range(int(rng.integers(1, 4))))
            else:
                w = _pick(rng, unknown)
            words.insert(int(rng.integers(len(words) + 1)), w)
    return " ".join(w for w in words if w)


def training_caption(spec, rng):
    return describe(spec, rng, unknown_rate=0.15, filler_rate=0.25)


def vocabulary():
    """Every word a caption can hold but made-up ones (CLIP's tokenizer makes each one token)."""
    words = {"a", "an", "one", "and", "background", "of", ",", "-"}
    words.update(COLOURS)
    words.update(KINDS)
    words.update(PLURAL.values())
    words.update(NUMBERS.values())
    texts = [p for ps in PLACE_WORDS.values() for p in ps]
    texts += [p for ps in SIZE_WORDS.values() for p in ps]
    texts += [f.replace("{}", "").replace("B", "") for fs in BACKGROUND_FORMS.values() for f in fs]
    texts += PREFIXES + SUFFIXES
    for t in texts:
        for w in t.replace(",", " ").replace("-", " ").split():
            words.add(w)
    return sorted(words)


# ---------------------------------------------------------------- held-out sets
HELD_OUT_SEED = 1234


def held_out_sets(seed=HELD_OUT_SEED, singles=300, free=100, multi=100, counts=50, unknown=100):
    """The held-out evaluation, fixed by seed. Returns (excluded one-shape scenes, excluded
    multi-shape scene keys, the sets): lists of (Spec, caption):
      single:  held-out one-shape scenes, everything said, random phrasings and orders;
      free:    one- to three-shape scenes whose caption leaves a size, the places or the
               background out (drawn as training scenes are; no training picture equals one);
      multi:   two- and three-shape scenes, places said, no training picture equal to one;
      counts:  "two red circles ...", free places;
      unknown: the single set's scenes with one or two real English words the model never saw.
    """
    rng = np.random.default_rng(seed)
    scenes = single_scenes()
    idx = sorted(rng.choice(len(scenes), size=singles, replace=False))
    held = [scenes[i] for i in idx]
    excluded = frozenset(held)
    sets = {"single": [], "free": [], "multi": [], "counts": [], "unknown": []}
    for scene in held:
        spec = Spec(scene)
        sets["single"].append((spec, describe(spec, rng)))
        sets["unknown"].append((spec, describe(spec, rng, unknown=UNKNOWN_HELD_OUT,
                                               unknown_rate=1.0)))
    sets["unknown"] = [sets["unknown"][i * singles // unknown] for i in range(unknown)]
    excluded_multi = set()
    while len(sets["multi"]) < multi:
        spec = random_spec(rng, excluded)
        if len(spec.scene[1]) < 2 or not spec.say_places:
            continue
        spec.say_background = True
        k = key(spec.scene)
        if k in excluded_multi:
            continue
        excluded_multi.add(k)
        sets["multi"].append((spec, describe(spec, rng)))
    while len(sets["free"]) < free:
        spec = random_spec(rng, excluded)
        if spec.say_places and all(spec.say_sizes) and spec.say_background:
            continue
        if len(spec.groups) < len(spec.scene[1]):
            continue  # counts have their own set
        excluded_multi.add(key(spec.scene))
        sets["free"].append((spec, describe(spec, rng)))
    while len(sets["counts"]) < counts:
        spec = random_spec(rng, excluded)
        if len(spec.groups) == len(spec.scene[1]):
            continue
        excluded_multi.add(key(spec.scene))
        sets["counts"].append((spec, describe(spec, rng)))
    return excluded, frozenset(excluded_multi), sets


def write_held_out(path, sets, checker, steps, max_sequence_length):
    """heldout.json: every held-out set (caption, background, shapes with grid row/col and what
    the caption says of them) and what the checker needs (palette, picture size, grid, its
    thresholds, the steps and text length the pictures are made with)."""
    import json
    doc = {"size": SIZE, "grid": GRID, "num_inference_steps": steps,
           "max_sequence_length": max_sequence_length, "checker": checker,
           "palette": {k: list(v) for k, v in COLOURS.items()},
           "sets": {name: [spec.as_json(cap) for spec, cap in items]
                    for name, items in sets.items()}}
    with open(path, "w") as f:
        f.write(json.dumps(doc, indent=1) + "\n")
