"""The reported runs: the README's results block rendered from their committed summaries, and a
run of yours read beside one of them.

    python -m experiments.report --readme                        # rewrite README.md's block
    python -m experiments.report WORKDIR --compare=main_seed0_amd_epyc

The registry (``RUNS``: ``docs/results/runs/runs.json``) lists every committed run: its name,
its directory (beside the registry, holding the run's ``summary.json``), the config it ran (its
``--config``; the runs of one config are each other's peers), its seed, CPU, date and command,
and whether the README shows it. ``render_block`` lays the shown runs out as the README's block
between ``BEGIN`` and ``END``: the main job's headline table (a row per kind and setting, a
column per method, each entry ``composed (or removed) / controls`` per run, the runs joined by
``|``, then the cell count), headed by what produced the runs and the retentions; a test fails
when README.md and the committed summaries disagree. ``compare`` reads a summary beside a
committed one entry by entry (the table's entries and the retentions) against the spread of
each entry across every committed run of the same config (all seeds and machines), with a
verdict per entry and overall, and the two runs' provenance. Labels come from
``platonic_jax.eval.layout`` (``SUMMARY_SETTINGS``, ``METHODS``) at run time. Pure but for
``load_runs``, ``read_summary`` and ``write_readme``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Mapping, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = os.path.join(ROOT, "docs", "results", "runs", "runs.json")
README = os.path.join(ROOT, "README.md")
MAIN_JOB_PAGE = os.path.join(ROOT, "docs", "results", "main_job.md")
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
KINDS = {"addition": "composed", "negation": "removed"}  # kind: the entry's task field
RETENTIONS = {"oracle_retention": "oracle", "consensus_retention": "consensus"}
# The tolerance of an entry whose spread is unmeasured (fewer than two committed runs of the
# config hold it): points for a change from zero-shot, a ratio for a retention.
TOLERANCE = {"points": 1.0, "ratio": 0.05}
SAME = 5e-5  # summaries keep 4 decimals: closer than this is the same figure
_FIELDS = {"name", "dir", "config", "seed", "cpu", "date", "command", "readme", "label"}
_REQUIRED = ("name", "dir", "config", "seed", "cpu", "command")


@dataclasses.dataclass(frozen=True)
class Run:
  """One committed run of the registry; ``dir`` absolute, ``label`` its name in the README's
  entries (by default ``seed N``)."""
  name: str
  dir: str
  config: str
  seed: int
  cpu: str
  command: str
  date: str | None = None
  readme: bool = False
  label: str = ""


def load_runs(path: str = RUNS) -> list[Run]:
  """The registry's runs, in its order. A run missing a field, naming an unknown field, or
  repeating a name is an error naming it."""
  with open(path) as f:
    data = json.load(f)
  runs, base = [], os.path.dirname(os.path.abspath(path))
  for i, r in enumerate(data.get("runs", [])):
    where = f"{path}: run {r.get('name', i)!r}"
    if unknown := sorted(set(r) - _FIELDS):
      raise ValueError(f"{where} has unknown fields {unknown} (fields: {sorted(_FIELDS)})")
    if missing := [k for k in _REQUIRED if k not in r]:
      raise ValueError(f"{where} lacks {missing}")
    if any(r["name"] == run.name for run in runs):
      raise ValueError(f"{where} is listed twice")
    runs.append(Run(name=r["name"], dir=os.path.normpath(os.path.join(base, r["dir"])),
                    config=r["config"], seed=int(r["seed"]), cpu=r["cpu"],
                    command=r["command"], date=r.get("date"), readme=bool(r.get("readme")),
                    label=r.get("label") or f"seed {int(r['seed'])}"))
  return runs


def read_summary(path: str) -> dict:
  """The ``summary.json`` of a main job's workdir (or that file itself)."""
  f = os.path.join(path, "summary.json") if os.path.isdir(path) else path
  if not os.path.isfile(f):
    raise FileNotFoundError(f"no summary.json at {f} (a main job's workdir holds one)")
  with open(f) as fh:
    return json.load(fh)


def find_run(runs: Sequence[Run], name_or_dir: str) -> Run:
  """The run of ``runs`` named ``name_or_dir``, or whose directory it is."""
  for r in runs:
    if name_or_dir == r.name:
      return r
  path = os.path.realpath(os.path.expanduser(name_or_dir))
  for r in runs:
    if path in (os.path.realpath(r.dir), os.path.join(os.path.realpath(r.dir), "summary.json")):
      return r
  raise ValueError(f"unknown run {name_or_dir!r}: give a committed run's name or directory "
                   f"({', '.join(r.name for r in runs) or 'the registry lists none'})")


# The entries: the headline table's and the retentions.

def _ordered(known: Sequence[str], found: Sequence[str]) -> list[str]:
  """``found``'s distinct names, those of ``known`` first in its order, then the rest as met."""
  found = list(dict.fromkeys(found))
  return [k for k in known if k in found] + [f for f in found if f not in known]


def table_keys(summaries: Sequence[Mapping]) -> tuple[list[tuple[str, str]], list[str]]:
  """(rows, methods) the summaries' headline table has: rows ``(kind, setting)`` in kind
  order then ``layout.SUMMARY_SETTINGS``' order (settings it lacks after, as met), methods in
  ``layout.SUMMARY_METHODS``' order (others after)."""
  from platonic_jax.eval import layout
  rows, methods = [], []
  for kind in KINDS:
    settings = [s for m in summaries for s, b in (m.get(kind) or {}).items() if b]
    rows += [(kind, s) for s in _ordered(list(layout.SUMMARY_SETTINGS), settings)]
    methods += [meth for m in summaries for b in (m.get(kind) or {}).values()
                for meth in (b or {})]
  return rows, _ordered(list(layout.SUMMARY_METHODS), methods)


def setting_label(setting: str) -> str:
  """The setting's name in the headline table (``layout.SUMMARY_SETTINGS``; else its key)."""
  from platonic_jax.eval import layout
  return layout.SUMMARY_SETTINGS.get(setting, setting.replace("_", " "))


def method_label(method: str) -> str:
  """The method's name in the tables (``layout.METHODS``; else its key)."""
  from platonic_jax.eval import layout
  return layout.METHODS.get(method, method.replace("_", " "))


@dataclasses.dataclass(frozen=True)
class Entry:
  """One figure of a summary: ``value`` (points, or a ratio for a retention) and the cells it
  averages (None for a retention)."""
  label: str
  value: float | None
  cells: int | None
  unit: str  # a key of TOLERANCE


def entries(summary: Mapping, keys: Sequence[tuple] | None = None) -> dict[tuple, Entry]:
  """{key: Entry} of ``summary``: per (kind, setting, method) of its headline table the task
  figure (``composed`` or ``removed``) and the controls', keyed ``(kind, setting, method,
  field)``; then each retention, keyed ``(name,)``. ``keys``: those to read (a key the summary
  lacks is left out), by default all the summary has."""
  out = {}
  rows, methods = table_keys([summary])
  for kind, setting in rows:
    block = summary[kind][setting]
    for m in methods:
      if m not in block:
        continue
      for field in (KINDS[kind], "controls"):
        out[(kind, setting, m, field)] = Entry(
            f"{kind}, {setting_label(setting)}: {method_label(m)}, {field}",
            float(block[m][field]), int(block[m]["cells"]), "points")
  for key, name in RETENTIONS.items():
    if key in summary:
      v = summary[key]
      out[(key,)] = Entry(f"retention ({name})", None if v is None else float(v), None, "ratio")
  return out if keys is None else {k: out[k] for k in keys if k in out}


# The README's block.

def _short_commit(summary: Mapping) -> str:
  """The run's commit, 7 hex digits (``(dirty)`` after it for a tree with changes)."""
  git = (summary.get("provenance") or {}).get("git") or {}
  c = git.get("commit")
  return "not recorded" if not c else c[:7] + (" (dirty)" if git.get("dirty") else "")


def _commit(summary: Mapping) -> str:
  return f"commit {_short_commit(summary)}"


def _joined(values: Sequence[str]) -> str:
  """One value when every run has it, else each run's joined by `` | ``."""
  return values[0] if len(set(values)) == 1 else " | ".join(values)


def _cell(summaries: Sequence[Mapping], kind: str, setting: str, method: str) -> str:
  """A table entry: ``composed / controls`` per run joined by ``\\|``, then the cell count
  (each run's when they differ); "" when no run has it, ``n/a`` for a run without it."""
  blocks = [((s.get(kind) or {}).get(setting) or {}).get(method) for s in summaries]
  if not any(blocks):
    return ""
  figs = [f"{b[KINDS[kind]]:+.1f} / {b['controls']:+.1f}" if b else "n/a" for b in blocks]
  cells = [str(b["cells"]) if b else "n/a" for b in blocks]
  if len(set(c for c, b in zip(cells, blocks) if b)) == 1:
    return " \\| ".join(figs) + f" ({next(c for c, b in zip(cells, blocks) if b)})"
  return " \\| ".join(f"{f} ({c})" if b else f for f, c, b in zip(figs, cells, blocks))


def render_block(runs: Sequence[Run], summaries: Sequence[Mapping], *, runs_link: str,
                 page_link: str) -> str:
  """The README's results block (``BEGIN`` ... ``END``, lines joined by newlines) for the
  ``runs`` and their ``summaries``: one line naming the runs and what produced them (command,
  commit, CPU, date: once when the runs share it), the units, the controls, the retentions and
  the ``--compare`` command; then the headline table (``table_keys``; entries ``_cell``).
  ``runs_link`` and ``page_link``: the registry's and the main job's page's paths from the
  README."""
  if not runs:
    raise ValueError("the registry shows no run in the README (set \"readme\": true on one)")
  labels = _joined([r.label for r in runs])
  made = [_joined([f"`{r.command}`" for r in runs]), _joined([_commit(s) for s in summaries]),
          _joined([r.cpu for r in runs])]
  made.append(_joined([r.date or "date not recorded" for r in runs]))
  controls = _joined([", ".join(s.get("controls") or ()) or "none" for s in summaries])
  ret = []
  for key, name in RETENTIONS.items():
    if any(key in s for s in summaries):
      ret.append(" | ".join("n/a" if key not in s else "undefined" if s[key] is None
                            else f"{s[key]:.2f}" for s in summaries) + f" ({name})")
  head = (f"The main job, {labels}: {'; '.join(made)} ([runs]({runs_link}), "
          f"[main_job.md]({page_link})). Mean change from zero-shot in points, composed (or "
          f"removed) tasks / controls ({controls}) per run, then the cells averaged"
          + (f"; retention {', '.join(ret)}" if ret else "")
          + f". Compare yours: `python -m experiments.report WORKDIR --compare={runs[0].name}`.")
  rows, methods = table_keys(summaries)
  table = ["| | " + " | ".join(method_label(m) for m in methods) + " |",
           "|---|" + "---|" * len(methods)]
  table += ["|" + "|".join(f" {c} " if c else " " for c in
                          [f"{kind}, {setting_label(setting)}"]
                          + [_cell(summaries, kind, setting, m) for m in methods]) + "|"
            for kind, setting in rows]
  return "\n".join([BEGIN, head, ""] + table + ["", END])


def replace_block(text: str, block: str) -> str:
  """``text`` (README.md's) with the lines from ``BEGIN`` to ``END`` replaced by ``block``."""
  lines = text.split("\n")
  at = [i for i, line in enumerate(lines) if line.strip() == BEGIN]
  end = [i for i, line in enumerate(lines) if line.strip() == END]
  if len(at) != 1 or len(end) != 1 or end[0] < at[0]:
    raise ValueError(f"the README needs one line {BEGIN} and, after it, one line {END} around "
                     f"its results block (found {len(at)} and {len(end)})")
  return "\n".join(lines[:at[0]] + block.split("\n") + lines[end[0] + 1:])


def readme_block(readme: str = README, runs_path: str = RUNS) -> str:
  """``render_block`` of the registry's runs shown in the README, links relative to it."""
  shown = [r for r in load_runs(runs_path) if r.readme]
  base = os.path.dirname(os.path.abspath(readme))
  return render_block(shown, [read_summary(r.dir) for r in shown],
                      runs_link=os.path.relpath(os.path.abspath(runs_path), base),
                      page_link=os.path.relpath(MAIN_JOB_PAGE, base))


def write_readme(readme: str = README, runs_path: str = RUNS) -> bool:
  """Rewrites ``readme``'s results block from the registry; whether it changed."""
  with open(readme) as f:
    old = f.read()
  new = replace_block(old, readme_block(readme, runs_path))
  if new != old:
    from platonic_jax.atomic import write_bytes
    write_bytes(readme, new.encode())
  return new != old


# Comparison with a committed run.

@dataclasses.dataclass(frozen=True)
class Verdict:
  """One entry compared: the two figures, the difference, the tolerance it was read against
  (the spread when ``measured``), its ``status`` (``same``, ``within``, ``outside``, or ``one``:
  held or defined by one run only) and the verdict's words."""
  key: tuple
  label: str
  yours: float | None
  reported: float | None
  difference: float | None
  tolerance: float | None
  measured: bool
  status: str
  words: str


def spread(key: tuple, peers: Sequence[Mapping]) -> float | None:
  """The range (max - min) of entry ``key`` across ``peers``' summaries; None when fewer than
  two hold it."""
  vals = [e.value for s in peers for e in entries(s, [key]).values() if e.value is not None]
  return max(vals) - min(vals) if len(vals) >= 2 else None


def compare_entries(yours: Mapping, reported: Mapping,
                    peers: Sequence[Mapping]) -> list[Verdict]:
  """Per entry of either summary (``entries``, the reported run's order, then yours'), the
  ``Verdict``: the same figure, within the spread across ``peers`` (every committed run of
  the config, the reported one among them; ``TOLERANCE`` where unmeasured), outside it, or
  held by one run only. A differing cell count is named in the words."""
  ours, theirs = entries(yours), entries(reported)
  out = []
  for key in list(theirs) + [k for k in ours if k not in theirs]:
    a, b = ours.get(key), theirs.get(key)
    e = b or a
    if a is None or b is None or a.value is None or b.value is None:
      if a is not None and b is not None and a.value is None and b.value is None:
        status, words = "same", "undefined in both"
      else:
        status = "one"
        words = ("only in the reported run" if a is None else "only in yours" if b is None
                 else "undefined in " + ("yours" if a.value is None else "the reported run"))
      out.append(Verdict(key, e.label, a and a.value, b and b.value, None, None, False, status,
                         words))
      continue
    d = a.value - b.value
    s = spread(key, peers)
    tol = TOLERANCE[e.unit] if s is None else s
    fmt = _fmt(e.unit)
    against = (f"the spread {fmt(tol, False)}" if s is not None
               else f"the default tolerance {fmt(tol, False)}")
    if abs(d) < SAME:
      status, words = "same", "same"
    elif abs(d) <= tol + SAME:
      status = "within"
      words = "within the spread" if s is not None else "within the default tolerance"
    else:
      status, words = "outside", f"outside: {fmt(d)} beyond {against}"
    if a.cells != b.cells:
      words += f"; cells {a.cells} vs {b.cells}"
    out.append(Verdict(key, e.label, a.value, b.value, d, tol, s is not None, status, words))
  return out


def _fmt(unit: str):
  def fmt(v, sign=True):
    if v is None:
      return "n/a"
    return (f"{v:+.2f}" if sign else f"{v:.2f}") if unit == "points" else f"{v:.3f}"
  return fmt


def _provenance_rows(yours: Mapping, reported: Mapping) -> tuple[list[list[str]], list[str]]:
  """Rows (field, yours, reported) of the two runs' provenance, and the likely reasons for a
  difference their provenance shows (a commit, a CPU, a version that differs)."""
  def get(s, *path):
    v = s.get("provenance") or {}
    for p in path:
      v = v.get(p) if isinstance(v, dict) else None
    return "not recorded" if v in (None, "") else str(v)

  def cpu(s):
    return f"{get(s, 'cpu', 'model')}, {get(s, 'cpu', 'cpu_count')} cores"
  versions = sorted(set((yours.get("provenance") or {}).get("versions") or {})
                    | set((reported.get("provenance") or {}).get("versions") or {}))
  rows = [["commit", _short_commit(yours), _short_commit(reported)],
          ["CPU", cpu(yours), cpu(reported)], ["platform", get(yours, "platform"),
                                               get(reported, "platform")]]
  rows += [[v, get(yours, "versions", v), get(reported, "versions", v)] for v in versions]
  reasons = []
  if rows[0][1] != rows[0][2]:
    reasons.append(f"the commits differ ({rows[0][1]} against {rows[0][2]}): code between them "
                   "may move the figures")
  if rows[1][1] != rows[1][2]:
    reasons.append(f"the CPUs differ ({rows[1][1]} against {rows[1][2]}): the toy world is "
                   "pretrained on the CPU that runs the job and XLA's kernels differ by "
                   "instruction set (docs/results/README.md)")
  if diff := [r[0] for r in rows[3:] if r[1] != r[2]]:
    reasons.append("versions differ: " + ", ".join(
        f"{r[0]} {r[1]} against {r[2]}" for r in rows[3:] if r[0] in diff))
  return rows, reasons


def compare(yours: Mapping, reported: Mapping, run: Run, peers: Sequence[Run],
            peer_summaries: Sequence[Mapping], where: str = "yours") -> tuple[str, bool]:
  """The text ``--compare`` prints, and whether every entry is within the spread (or the
  default tolerance): ``yours`` (a summary, read from ``where``) beside the committed ``run``'s
  ``reported`` summary, entry by entry (``compare_entries``, the spread across the
  ``peers``: every committed run of ``run.config``, with their ``peer_summaries``), an
  overall verdict, and both runs' provenance with the likely reasons for a difference."""
  from platonic_jax.eval import layout
  verdicts = compare_entries(yours, reported, peer_summaries)
  names = ", ".join(f"{p.name} ({p.label}, {p.cpu})" for p in peers)
  if len(peers) >= 2:
    spread_note = (f"Spread: per entry, the range (max - min) across the {len(peers)} committed "
                   f"runs of {run.config} ({names}); an entry fewer than two of them hold is "
                   f"read against the default tolerance.")
  else:
    spread_note = (f"Spread: unmeasured (one committed run of {run.config}: {names}); every "
                   f"entry is read against the default tolerance, TOLERANCE in "
                   f"experiments/readme_results.py: {TOLERANCE['points']:g} point per change, "
                   f"{TOLERANCE['ratio']:g} per retention.")
  body = []
  for v in verdicts:
    fmt = _fmt("ratio" if len(v.key) == 1 else "points")
    body.append([v.label, fmt(v.yours, len(v.key) > 1), fmt(v.reported, len(v.key) > 1),
                 fmt(v.difference), fmt(v.tolerance, False) + ("" if v.measured else " (default)")
                 if v.tolerance is not None else "n/a", v.words])
  table = layout.md_table(["entry", "yours", "reported", "difference", "spread", "verdict"], body,
                          pad=True)
  differ = [v for v in verdicts if v.status != "same"]
  outside = [v for v in verdicts if v.status == "outside"]
  alone = [v for v in verdicts if v.status == "one"]
  cells = [v for v in verdicts if "; cells " in v.words]
  spread_words = "the spread" if len(peers) >= 2 else "the default tolerance"
  if not differ and not cells:
    verdict = (f"Overall: no difference: every one of the {len(verdicts)} entries equals "
               f"{run.name}'s.")
  else:
    parts = [f"{len(differ)} of {len(verdicts)} entries differ from {run.name}'s"]
    if outside:
      parts.append(f"{len(outside)} beyond {spread_words}: " + "; ".join(
          f"{v.label} ({_fmt('ratio' if len(v.key) == 1 else 'points')(v.difference)})"
          for v in outside))
    else:
      parts.append(f"none beyond {spread_words}")
    if alone:
      parts.append(f"{len(alone)} held by one run only: " + "; ".join(
          f"{v.label} ({v.words})" for v in alone))
    if cells:
      parts.append(f"{len(cells)} over other cell counts (another config?)")
    head = (f"within {spread_words}" if not outside and not alone
            else "outside" if outside else "not comparable")
    verdict = f"Overall: {head}: " + "; ".join(parts) + "."
  rows, reasons = _provenance_rows(yours, reported)
  prov = layout.md_table(["provenance", "yours", "reported"], rows, pad=True)
  if reasons and (differ or cells):
    why = "Likely reasons: " + "; ".join(reasons) + "."
  elif reasons:
    why = "The provenance differs (" + "; ".join(reasons) + "), the figures do not."
  else:
    why = ("Same commit, CPU and versions" + (": the same config and seed on the same machine "
                                               "gives the same figures; another seed or config "
                                               "gives others." if differ or cells else "."))
  head = (f"# {where} beside {run.name} ({run.label}, {run.cpu}, {run.config}; committed in "
          f"{os.path.relpath(run.dir, ROOT)})\n")
  text = "\n".join([head, spread_note, "", table, verdict, "", prov, why]) + "\n"
  return text, not outside and not alone


def compare_workdir(workdir: str, name_or_dir: str, runs_path: str = RUNS) -> tuple[str, bool]:
  """``compare`` of the workdir's summary.json with the committed run ``name_or_dir`` (a name
  or directory of the registry at ``runs_path``), its peers every run of its config."""
  runs = load_runs(runs_path)
  run = find_run(runs, name_or_dir)
  yours = read_summary(workdir)
  peers = [r for r in runs if r.config == run.config]
  return compare(yours, read_summary(run.dir), run, peers, [read_summary(p.dir) for p in peers],
                 where=workdir)
