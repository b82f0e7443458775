"""Procedural images of the toy world: independent attributes, rendered vectorised in numpy.

Every image shows one object (shape, color, size, fill texture) in one quadrant, a digit glyph in
the diagonally opposite quadrant, one to four small dots in the two remaining quadrants, a
patterned dark backdrop of some tone, a frame around the border and a photometric style::

    shape     circle square triangle cross bar column
    color     red orange yellow green cyan blue purple white
    size      small medium large
    position  top left | top right | bottom left | bottom right      (the object's quadrant)
    fill      solid striped checkered hollow
    pattern   plain grid dotted wavy diagonal                         (the backdrop's texture)
    digit     0 ... 9
    count     one two three four                                      (dots)
    tone      navy maroon olive teal plum brown slate black           (the backdrop's hue)
    frame     no thin thick dashed
    style     clean grainy faded dark

Attributes are drawn independently and uniformly; rendering adds seeded nuisance (sub-pixel
jitter of the object, size jitter, glyph placement, which slots hold the dots, backdrop phase,
grain). Everything is a pure function of (attributes, seed).

Shapes: attribute arrays are int ``(n,)``; images are uint8 ``(n, 3, S, S)`` (NCHW) or, after
``normalize``, float32 ``(n, 3, S, S)``.
"""

from __future__ import annotations

import numpy as np

ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "shape": ("circle", "square", "triangle", "cross", "bar", "column"),
    "color": ("red", "orange", "yellow", "green", "cyan", "blue", "purple", "white"),
    "size": ("small", "medium", "large"),
    "position": ("top left", "top right", "bottom left", "bottom right"),
    "fill": ("solid", "striped", "checkered", "hollow"),
    "pattern": ("plain", "grid", "dotted", "wavy", "diagonal"),
    "digit": tuple(str(i) for i in range(10)),
    "count": ("one", "two", "three", "four"),
    "tone": ("navy", "maroon", "olive", "teal", "plum", "brown", "slate", "black"),
    "frame": ("no", "thin", "thick", "dashed"),
    "style": ("clean", "grainy", "faded", "dark"),
}
ATTRIBUTE_NAMES = tuple(ATTRIBUTES)

# OpenAI CLIP's normalisation (``models.preprocess.OPENAI_CLIP_MEAN`` / ``_STD``, written out
# here so the generators import no model code; the toy world's tests check they agree).
IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)
IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)

_COLORS = np.array([
    (0.95, 0.12, 0.10), (1.00, 0.55, 0.05), (0.95, 0.90, 0.10), (0.15, 0.80, 0.20),
    (0.10, 0.85, 0.90), (0.20, 0.35, 1.00), (0.65, 0.25, 0.95), (0.95, 0.95, 0.95)], np.float32)
_TONES = np.array([
    (0.08, 0.10, 0.38), (0.38, 0.06, 0.08), (0.30, 0.30, 0.05), (0.04, 0.30, 0.28),
    (0.30, 0.08, 0.32), (0.32, 0.18, 0.07), (0.22, 0.25, 0.30), (0.03, 0.03, 0.03)], np.float32)
_RADII = np.array([4.5, 6.0, 7.5], np.float32)
_GLYPH_COLOR = np.array([0.92, 0.92, 0.92], np.float32)
_FRAME_COLOR = np.array([0.85, 0.75, 0.40], np.float32)
_PATTERN_GAIN = 0.5

# 3x5 bitmap digits (rows top to bottom), drawn at scale 2.
_FONT = np.array([[[int(c) for c in row] for row in glyph.split()] for glyph in (
    "111 101 101 101 111", "010 110 010 010 111", "111 001 111 100 111", "111 001 111 001 111",
    "101 101 111 001 001", "111 100 111 001 111", "111 100 111 101 111", "111 001 010 010 010",
    "111 101 111 101 111", "111 101 111 001 111")], bool)  # (10, 5, 3)
# Quadrant origins (y, x) in units of half the image, in `position` order.
_QUADRANTS = np.array([(0, 0), (0, 1), (1, 0), (1, 1)])
_OPPOSITE = np.array([3, 2, 1, 0])
_OTHERS = np.array([(1, 2), (0, 3), (0, 3), (1, 2)])  # the two remaining quadrants
_SLOTS = np.array([(3, 3), (3, 10), (10, 3), (10, 10)])  # dot slots inside a 16-pixel quadrant
_DOT = 3


def num_classes(attribute: str) -> int:
  return len(ATTRIBUTES[attribute])


def sample_attributes(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
  """n independent uniform draws of every attribute -> {name: int32 (n,)}."""
  return {a: rng.integers(0, len(v), size=n).astype(np.int32) for a, v in ATTRIBUTES.items()}


_SHAPES = (
    lambda dx, dy, ax, ay: dx * dx + dy * dy <= 1.0,                                 # circle
    lambda dx, dy, ax, ay: np.maximum(ax, ay) <= 0.85,                               # square
    lambda dx, dy, ax, ay: (dy >= -1.0) & (dy <= 0.9) & (ax <= (dy + 1.0) * 0.55),   # triangle
    lambda dx, dy, ax, ay: ((ax <= 0.36) & (ay <= 1.0)) | ((ay <= 0.36) & (ax <= 1.0)),  # cross
    lambda dx, dy, ax, ay: (ax <= 1.0) & (ay <= 0.45),                               # bar
    lambda dx, dy, ax, ay: (ax <= 0.45) & (ay <= 1.0),                               # column
)


def _shape_mask(shape: np.ndarray, dx: np.ndarray, dy: np.ndarray) -> np.ndarray:
  """shape (n,) ids, dx/dy (n,S,S) coordinates in units of the radius -> bool (n,S,S)."""
  out = np.zeros(dx.shape, bool)
  for i, fn in enumerate(_SHAPES):
    sel = np.flatnonzero(shape == i)
    if sel.size:
      x, y = dx[sel], dy[sel]
      out[sel] = fn(x, y, np.abs(x), np.abs(y))
  return out


def _pattern_mask(pattern: np.ndarray, ix: np.ndarray, iy: np.ndarray, ox: np.ndarray,
                  oy: np.ndarray, phase: np.ndarray) -> np.ndarray:
  """Backdrop texture: pattern (n,), pixel ints ix/iy (1,S,S), offsets (n,1,1) -> (n,S,S)."""
  n = pattern.shape[0]
  x, y = ix + ox, iy + oy
  out = np.zeros((n,) + ix.shape[1:], bool)
  fns = (
      None,                                                                # plain
      lambda s: (x[s] % 4 == 0) | (y[s] % 4 == 0),                         # grid
      lambda s: (x[s] % 4 == 0) & (y[s] % 4 == 0),                         # dotted
      lambda s: (y[s] + np.rint(1.5 * np.sin(2 * np.pi * ix / 8.0 + phase[s])).astype(
          np.int64)) % 5 == 0,                                             # wavy
      lambda s: (x[s] + iy) % 4 == 0,                                      # diagonal
  )
  for i, fn in enumerate(fns):
    sel = np.flatnonzero(pattern == i)
    if fn is not None and sel.size:
      out[sel] = fn(sel)
  return out


def _paint(img: np.ndarray, mask: np.ndarray, color: np.ndarray) -> None:
  """In place: img (n,3,S,S) float, mask (n,S,S), color (3,) or (n,3)."""
  color = np.broadcast_to(np.asarray(color, np.float32), (img.shape[0], 3))
  img[:] = np.where(mask[:, None], color[:, :, None, None], img)


def _render_chunk(attrs: dict[str, np.ndarray], rng: np.random.Generator, size: int) -> np.ndarray:
  n = attrs["shape"].shape[0]
  half = size // 2
  scale = size / 32.0
  iy, ix = np.mgrid[0:size, 0:size]
  iy, ix = iy[None], ix[None]
  py, px = (iy + 0.5).astype(np.float32), (ix + 0.5).astype(np.float32)
  col = lambda a: a[:, None, None]

  # Backdrop: tone, lightened along the pattern.
  img = np.broadcast_to(_TONES[attrs["tone"]][:, :, None, None], (n, 3, size, size)).copy()
  ox, oy = rng.integers(0, 4, size=(2, n))
  phase = rng.uniform(0, 2 * np.pi, size=n)
  pat = _pattern_mask(attrs["pattern"], ix, iy, col(ox), col(oy), col(phase))
  img += _PATTERN_GAIN * pat[:, None]

  # The object.
  quad = _QUADRANTS[attrs["position"]]
  cy = (quad[:, 0] * half + half / 2 + rng.uniform(-1.0, 1.0, n) * scale).astype(np.float32)
  cx = (quad[:, 1] * half + half / 2 + rng.uniform(-1.0, 1.0, n) * scale).astype(np.float32)
  r = _RADII[attrs["size"]] * scale * rng.uniform(0.94, 1.06, n).astype(np.float32)
  dx, dy = (px - col(cx)) / col(r), (py - col(cy)) / col(r)
  in_quadrant = ((iy // half == col(quad[:, 0])) & (ix // half == col(quad[:, 1])))
  outer = _shape_mask(attrs["shape"], dx, dy) & in_quadrant  # the object never leaves it
  inner = _shape_mask(attrs["shape"], dx * 2.0, dy * 2.0)
  fill = col(attrs["fill"])
  lit = np.select([fill == 0, fill == 1, fill == 2, fill == 3],
                  [outer, outer & (iy % 4 < 2), outer & ((ix // 2 + iy // 2) % 2 == 0),
                   outer & ~inner])
  shade = outer & ~lit & (fill != 3)
  color = _COLORS[attrs["color"]]
  _paint(img, shade, 0.35 * color)
  _paint(img, lit, color)

  # The digit glyph in the opposite quadrant (scale-3 3x5 font: 9x15 pixels at size 32).
  g = int(round(3 * scale))
  gq = _QUADRANTS[_OPPOSITE[attrs["position"]]]
  gy0 = gq[:, 0] * half + rng.integers(0, 2, n) * g // 3
  gx0 = gq[:, 1] * half + int(round(3 * scale)) + rng.integers(-1, 2, n) * g // 3
  ly, lx = (iy - col(gy0)) // g, (ix - col(gx0)) // g
  inside = (ly >= 0) & (ly < 5) & (lx >= 0) & (lx < 3)
  glyph = _FONT[col(attrs["digit"]), np.clip(ly, 0, 4), np.clip(lx, 0, 2)] & inside
  _paint(img, glyph, _GLYPH_COLOR)

  # count + 1 dots in random slots of the two remaining quadrants.
  order = np.argsort(rng.uniform(size=(n, 8)), axis=1)
  active = np.zeros((n, 8), bool)
  np.put_along_axis(active, order, np.arange(8)[None] <= attrs["count"][:, None], axis=1)
  dot = max(2, int(round(_DOT * scale)))
  others = _OTHERS[attrs["position"]]
  dots = np.zeros((n, size, size), bool)
  for k in range(8):
    q = _QUADRANTS[others[:, k // 4]]
    sy = q[:, 0] * half + int(round(_SLOTS[k % 4, 0] * scale))
    sx = q[:, 1] * half + int(round(_SLOTS[k % 4, 1] * scale))
    box = ((iy >= col(sy)) & (iy < col(sy) + dot) & (ix >= col(sx)) & (ix < col(sx) + dot))
    dots |= box & col(active[:, k])
  _paint(img, dots, _GLYPH_COLOR)

  # Frame.
  edge = np.minimum(np.minimum(ix, iy), np.minimum(size - 1 - ix, size - 1 - iy))
  frame = col(attrs["frame"])
  width = max(1, int(round(2 * scale)))
  fmask = np.select([frame == 1, frame == 2, frame == 3],
                    [edge < 1, edge < width, (edge < 1) & (((ix + iy) // 2) % 2 == 0)], False)
  _paint(img, np.broadcast_to(fmask, (n, size, size)), _FRAME_COLOR)

  # Photometric style.
  style = attrs["style"]
  grainy = np.flatnonzero(style == 1)
  img[grainy] += rng.normal(0.0, 0.10, size=(grainy.size,) + img.shape[1:]).astype(np.float32)
  faded = style == 2
  img[faded] = 0.5 * img[faded] + 0.5 * 0.55
  img[style == 3] *= 0.5
  return np.clip(np.rint(img * 255.0), 0, 255).astype(np.uint8)


def render(attrs: dict[str, np.ndarray], seed, size: int = 32, chunk: int = 1024) -> np.ndarray:
  """Attributes {name: (n,)} -> uint8 images (n, 3, size, size); deterministic in ``seed``.

  ``seed`` is anything ``np.random.default_rng`` accepts (an int or a list of ints). Images are
  rendered in chunks of ``chunk`` with independent child streams, so the result does not depend
  on memory limits but does depend on ``chunk`` (keep the default).
  """
  if size % 16 or size < 32:
    # below 32 pixels the digit glyph (10 pixels tall at size 16) spills out of its quadrant
    raise ValueError(f"image size must be a multiple of 16 and at least 32, got {size}")
  missing = set(ATTRIBUTES) - set(attrs)
  if missing:
    raise ValueError(f"attributes missing: {sorted(missing)}")
  n = int(attrs["shape"].shape[0])
  for a, v in attrs.items():
    if a in ATTRIBUTES and (v.shape != (n,) or v.min(initial=0) < 0
                            or v.max(initial=0) >= len(ATTRIBUTES[a])):
      raise ValueError(f"attribute {a!r}: expected ints in [0, {len(ATTRIBUTES[a])}) of "
                       f"shape ({n},), got shape {v.shape}")
  out = np.empty((n, 3, size, size), np.uint8)
  seq = np.random.SeedSequence(seed)
  children = seq.spawn((n + chunk - 1) // chunk)
  for i, child in enumerate(children):
    sl = slice(i * chunk, min(n, (i + 1) * chunk))
    part = {a: np.asarray(attrs[a][sl]) for a in ATTRIBUTES}
    out[sl] = _render_chunk(part, np.random.default_rng(child), size)
  return out


def normalize(images: np.ndarray) -> np.ndarray:
  """uint8 (n, 3, H, W) -> float32 (n, 3, H, W): rescale to [0, 1], then (x - mean) / std."""
  x = images.astype(np.float32) * np.float32(1 / 255)
  mean = np.asarray(IMAGE_MEAN, np.float32)[:, None, None]
  std = np.asarray(IMAGE_STD, np.float32)[:, None, None]
  return (x - mean) / std
