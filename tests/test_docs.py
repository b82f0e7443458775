"""The documents a newcomer reads: README.md, BUILD.md and docs/ (links, commands, headers)."""

import ast
import glob
import importlib.util
import os
import re

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
README = os.path.join(ROOT, "README.md")
RESULTS = os.path.join(ROOT, "docs", "results")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
HEADING = re.compile(r"^#{1,6} (.+)$", re.M)


def _read(path):
  with open(path, encoding="utf-8") as f:
    return f.read()


def _links(text):
  """Relative link targets of a markdown text (web and mail links left out)."""
  return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def _slug(heading):
  """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
  s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
  return s.replace(" ", "-")


def _check_links(page, root=ROOT):
  """Every relative link of ``page`` names a file inside ``root`` (and an anchor of it that
  exists); returns the problems."""
  problems = []
  for target in _links(_read(page)):
    path, _, anchor = target.partition("#")
    full = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
    where = f"{os.path.relpath(page, root)} -> {target}"
    if os.path.isabs(path) or not full.startswith(root + os.sep):
      problems.append(f"{where}: outside the repository")
    elif not os.path.exists(full):
      problems.append(f"{where}: no such file")
    elif anchor and full.endswith(".md"):
      if anchor not in {_slug(h) for h in HEADING.findall(_read(full))}:
        problems.append(f"{where}: no heading with that anchor")
  return problems


def test_readme_fits_in_200_lines():
  n = len(_read(README).splitlines())
  assert n <= 200, f"README.md has {n} lines"


def test_readme_links_point_into_the_repository():
  text = _read(README)
  assert _links(text), "README.md links nothing"
  assert "docs/method.png" in _links(text) and "docs/method.md" in _links(text)
  assert _check_links(README) == []
  outside = [m.group(0) for m in re.finditer(r"\.\./\S*|/work/\S*|METHOD\.md", text)]
  assert outside == [], f"README.md names paths outside the repository: {outside}"


def test_every_document_links_only_to_what_exists():
  pages = [README, os.path.join(ROOT, "BUILD.md")]
  pages += sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
  problems = [p for page in pages for p in _check_links(page)]
  assert problems == []


def test_link_checker_catches_missing_files_anchors_and_escapes(tmp_path):
  (tmp_path / "a.md").write_text("# Top\n\n## Seed 1, again\n")
  page = tmp_path / "p.md"
  page.write_text("[ok](a.md#seed-1-again) [web](https://x.org) [self](#top)\n# Top\n"
                  "[gone](b.md) [anchor](a.md#seed-2) [up](../c.md)\n")
  problems = _check_links(str(page), root=str(tmp_path))
  assert len(problems) == 3
  assert "b.md: no such file" in problems[0]
  assert "a.md#seed-2: no heading" in problems[1]
  assert "../c.md: outside the repository" in problems[2]


def test_readme_code_paths_exist():
  text = _read(README)
  missing = []
  for span in CODE_SPAN.findall(text) + _commands(text):
    for token in span.split():
      if token.startswith(("platonic_jax/", "experiments/", "tests/")):
        path = token.split(":")[0].rstrip(").,")
        if not os.path.exists(os.path.join(ROOT, path)):
          missing.append(token)
  assert missing == []


def _commands(text):
  """Shell lines of the README: indented code lines and code spans that start with ``python``
  or ``pip``, continuation lines joined."""
  lines = re.sub(r"\\\n\s*", " ", text).splitlines()
  cmds = [ln.strip() for ln in lines if ln.startswith("    ") and
          ln.strip().startswith(("python ", "pip "))]
  cmds += [s for s in CODE_SPAN.findall(text) if s.startswith("python ")]
  return cmds


def test_readme_commands_name_modules_and_configs_that_exist():
  cmds = _commands(_read(README))
  assert len(cmds) >= 10
  for cmd in cmds:
    for module in re.findall(r"python -m ([\w.]+)", cmd):
      if module == "pytest":
        continue
      assert importlib.util.find_spec(module) is not None, f"{cmd}: no module {module}"
      assert _module_file(module).startswith(ROOT), f"{cmd}: {module} is not this repository's"
  configs = re.findall(r"--config=([\w/.]+\.py(?::\w+)?)", _read(README))
  assert "experiments/configs/main.py:micro" in configs
  for spec in configs:
    path, _, arg = spec.partition(":")
    full = os.path.join(ROOT, path)
    assert os.path.isfile(full), f"no config file {path} ({spec})"
    _load(full).get_config(arg or None)  # a variant the config refuses raises here


def _module_file(module):
  return os.path.abspath(importlib.util.find_spec(module).origin)


def _load(path):
  spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3] + "_doc_check", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_readme_runs_the_ci_test_line_verbatim():
  ci = [ln for ln in _read(os.path.join(ROOT, ".ci", "run")).splitlines()
        if ln and not ln.startswith("#") and "pytest" in ln]
  assert len(ci) == 1
  assert f"    {ci[0]}" in _read(README).splitlines()


def test_readme_keeps_the_main_job_line():
  assert "    pip install -e . && python -m experiments.main --workdir=workdir/main" in \
      _read(README).splitlines()


def _result_pages():
  return sorted(p for p in glob.glob(os.path.join(RESULTS, "*.md"))
                if os.path.basename(p) != "README.md")


@pytest.mark.parametrize("page", _result_pages(), ids=os.path.basename)
def test_result_page_is_headed_by_commit_machine_date_and_command(page):
  head = _read(page).splitlines()[:16]
  assert head[0].startswith("# "), f"{page}: no title"
  for field in ("Commit", "Machine", "Date", "Command"):
    assert any(ln.startswith(f"- **{field}:** ") for ln in head), f"{page}: no {field} line"


def test_results_index_lists_every_page_and_the_machine_dependence():
  assert len(_result_pages()) >= 10
  index = _read(os.path.join(RESULTS, "README.md"))
  listed = set(_links(index))
  assert {os.path.basename(p) for p in _result_pages()} <= listed
  for figure in ("+7.6 / -5.3", "+6.5 / -6.2", "0.55", "0.50"):
    assert figure in index
  main_job = _read(os.path.join(RESULTS, "main_job.md"))
  assert "## Machine dependence" in main_job and "Intel Xeon" in main_job


def test_method_page_names_every_option_that_departs_from_the_definitions():
  text = _read(os.path.join(ROOT, "docs", "method.md"))
  for name in ("calibrate", "include_ceiling", '"min"', '"1se"', "keep", "head edit",
               "Corollary 1", "random-UTD", "weight-space", "consensus", "1e-12", "1e-5"):
    assert name in text, name


def test_config_docstrings_carry_their_command():
  configs = sorted(glob.glob(os.path.join(ROOT, "experiments", "configs", "*.py")))
  checked = 0
  for path in configs:
    if os.path.basename(path) in ("__init__.py", "common.py", "provenance.py",
                                  "quickstart_world.py"):  # no launcher: the notebook reads it
      continue
    doc = ast.get_docstring(ast.parse(_read(path)))
    assert doc and re.search(r"^\s+python -m experiments\.\w+", doc, re.M), path
    checked += 1
  assert checked >= 10


def _figure_script():
  return _load(os.path.join(ROOT, "docs", "make_figure.py"))


def test_method_figure_is_a_small_png():
  path = os.path.join(ROOT, "docs", "method.png")
  with open(path, "rb") as f:
    assert f.read(8) == PNG_SIGNATURE
  assert os.path.getsize(path) < 200 * 1024


def test_figure_script_draws_the_png(tmp_path):
  out = tmp_path / "method.png"
  assert _figure_script().draw(str(out)) == str(out)
  data = out.read_bytes()
  assert data[:8] == PNG_SIGNATURE and len(data) < 200 * 1024
  width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
  assert (width, height) == (1100, 440)


def test_figure_script_refuses_a_bad_output_and_writes_nothing(tmp_path):
  script = _figure_script()
  with pytest.raises(SystemExit, match=r"'.*method\.jpg' does not end in \.png"):
    script.main(["make_figure.py", str(tmp_path / "method.jpg")])
  with pytest.raises(SystemExit, match="usage"):
    script.main(["make_figure.py", str(tmp_path / "a.png"), str(tmp_path / "b.png")])
  assert list(tmp_path.iterdir()) == []
