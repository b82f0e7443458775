"""notebooks/quickstart.ipynb: stored without outputs, needing no PyTorch, and executed top to
bottom in a Jupyter kernel (nbclient) on its own toy world
(``experiments/configs/quickstart_world.py``, pretrained into a temporary cache: one to two
minutes), where it must show what it says it shows: the closed form's transfer raising the
added task, the negation lowering the removed one, both in one fold, the controls near
zero-shot."""

import json
import os
import re

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(ROOT, "notebooks", "quickstart.ipynb")


def _read():
  return nbformat.read(NOTEBOOK, as_version=4)


def test_the_notebook_is_stored_without_outputs():
  nb = _read()
  nbformat.validate(nb)
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert code and all(c.outputs == [] and c.execution_count is None for c in code)
  # one marked cell switches to real checkpoints
  switch = [c for c in code if "REAL = False" in c.source]
  assert len(switch) == 1 and "pj.load_model(" in switch[0].source
  # the branch the tests do not run at least compiles and calls only what pj has
  import platonic_jax as pj
  for c in code:
    compile(c.source, "quickstart cell", "exec")
    missing = [n for n in re.findall(r"\bpj\.(\w+)", c.source) if not hasattr(pj, n)]
    assert not missing, missing
  # `pip install -e .` is all it needs: no cell imports PyTorch or open_clip
  for c in code:
    assert not re.search(r"^\s*(import|from)\s+(torch|open_clip)\b", c.source, re.M), c.source
  assert "pj.set_progress(False)" in code[0].source
  # its links point at files that exist
  text = "".join(c.source for c in nb.cells if c.cell_type == "markdown")
  for link in re.findall(r"\]\((\.\./[^)#]+)", text):
    assert os.path.exists(os.path.join(ROOT, "notebooks", link)), link
  assert "METHOD" not in text and "BUILD.md" not in text


# The demo's claims, with the margins they are checked at. On the quickstart world's seeds 0
# and 100-103 (experiments/configs/quickstart_world.py's docstring), with every source
# fine-tune at 99-100 % of its own training images, the added task gains +25.8 to +51.4 points,
# the removed task loses 10.6 to 98.8 and the controls move by at most 9.4 (seed 0 under this
# suite's XLA settings: +46.8, -11.6, 4.2). Pretraining differs by CPU, so the claims are
# checked where the source learned its tasks (as the notebook says, a fine-tune that has not has
# nothing to pass on). The margins sit outside those ranges: they test that the effects are
# there, not their size.
GAIN, LOSS, CONTROL = 20.0, -5.0, 15.0


def test_the_notebook_runs_top_to_bottom_and_shows_the_method_working(monkeypatch, tmp_path):
  monkeypatch.setenv("PLATONIC_JAX_CACHE", str(tmp_path / "cache"))  # pretrains its world
  monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.setenv("TMPDIR", str(tmp_path))  # the notebook exports into a temporary dir
  nb = _read()
  # read back what the tables showed (the notebook's own `changes`, in points)
  nb.cells.append(nbformat.v4.new_code_cell(
      "import json; print('CHANGES ' + json.dumps(changes))"))
  NotebookClient(nb, timeout=600, kernel_name="python3",
                 resources={"metadata": {"path": ROOT}}).execute()
  outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
  errors = [o for o in outputs if o.output_type == "error"]
  assert not errors, errors
  text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
  assert "IProgress" not in text and "TqdmWarning" not in text, text
  assert "pretrained in" in text
  assert "source clip-b (clip), target clip-a (clip)" in text
  assert "selected rank=" in text  # the closed form's label-free selection table
  assert "reloaded: image embeddings match the edited model's" in text
  images = [o for o in outputs
            if o.output_type == "display_data" and "image/png" in o.get("data", {})]
  assert len(images) == 1  # the at-a-glance plot
  assert os.path.isfile(os.path.join(next(tmp_path.glob("pj_quickstart_*")), "edited",
                                     "config.json"))

  changes = json.loads(re.search(r"^CHANGES (.*)$", text, re.M).group(1))
  learned = {t: float(a) for t, a in
             re.findall(r"source on (\w+)'s training images: [\d.]+ -> ([\d.]+) %", text)}
  assert set(learned) == {"position", "pattern"}
  added, removed, composed = (changes["+position @1.0"], changes["-pattern @-1"],
                              changes["+position -pattern"])
  if min(learned.values()) < 90:
    pytest.skip(f"the notebook ran, but this CPU's pretrained source learned its tasks only to "
                f"{learned} % of its training images: its edits have nothing to show")
  assert added["position"] > GAIN and composed["position"] > GAIN, changes
  assert removed["pattern"] < LOSS and composed["pattern"] < LOSS, changes
  for edit in (added, removed, composed):
    for control in ("scene", "look"):
      assert edit[control] > -CONTROL, changes
