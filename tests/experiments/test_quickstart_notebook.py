"""notebooks/quickstart.ipynb: stored without outputs, and executed top to bottom in a Jupyter
kernel (nbclient) on the micro toy world this directory's ``micro`` fixture has pretrained into
its cache, so the notebook loads the families instead of pretraining them."""

import os
import re

import nbformat
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


def test_the_notebook_runs_top_to_bottom(micro, monkeypatch, tmp_path):
  _, experiments_cache = micro
  monkeypatch.setenv("PLATONIC_JAX_CACHE", os.path.dirname(experiments_cache))
  monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.setenv("TMPDIR", str(tmp_path))  # the notebook exports into a temporary dir
  # the kernel's compiled programs: the session's (tests/conftest.py), as a launcher's would be
  from platonic_jax.engine import compilation_cache_dir
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", compilation_cache_dir(experiments_cache))
  monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  nb = _read()
  NotebookClient(nb, timeout=600, kernel_name="python3",
                 resources={"metadata": {"path": ROOT}}).execute()
  text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
                 if o.output_type == "stream")
  errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if o.output_type == "error"]
  assert not errors
  assert "loaded from cache" in text and "pretrained in" not in text
  assert "source siglip-b (siglip), target clip-a (clip)" in text
  assert "selected rank=" in text  # the closed form's label-free selection table
  assert "CLIPModel from " + str(tmp_path) in text and "image features match ours" in text
  assert "+color +pattern -count" in text  # the composition's accuracy changes
  images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if o.output_type == "display_data" and "image/png" in o.get("data", {})]
  assert len(images) == 1  # the accuracy-change plot
  assert os.path.isfile(os.path.join(next(tmp_path.glob("pj_quickstart_*")), "edited",
                                     "config.json"))
