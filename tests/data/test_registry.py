"""The task registry: class counts and uniqueness, templates, names, the probe rule, subsets."""

import importlib.util
import os

import numpy as np
import pytest

from platonic_jax.data import registry

COUNTS = {"eurosat": 10, "dtd": 47, "cars": 196, "gtsrb": 43, "mnist": 10, "resisc45": 45,
          "svhn": 10, "sun397": 397, "cifar100": 100, "imagenet": 1000, "ucmerced": 21, "aid": 30,
          "esc50": 50, "gtzan": 10, "urbansound8k": 10}
DOMAINNET = tuple(f"domainnet_{d}" for d in ("real", "sketch", "clipart", "painting", "quickdraw",
                                             "infograph"))
COUNTS.update({name: 345 for name in DOMAINNET})


def test_every_task_is_registered_with_its_class_count():
  assert set(registry.TASKS) == set(COUNTS)
  for name, count in COUNTS.items():
    spec = registry.get_task(name)
    assert spec.name == name and spec.num_classes == count == len(spec.classnames), name
  assert set(registry.AUDIO_TASKS) == {"esc50", "gtzan", "urbansound8k"}
  assert set(registry.IMAGE_TASKS) | set(registry.AUDIO_TASKS) == set(registry.TASKS)
  assert set(registry.CONTROL_TASKS) == {"cifar100", "imagenet"}


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_names_unique_templates_have_one_slot_splits_present(name):
  spec = registry.get_task(name)
  assert len(set(spec.classnames)) == spec.num_classes
  assert all(isinstance(c, str) and c.strip() == c and c for c in spec.classnames)
  assert spec.templates and len(set(spec.templates)) == len(spec.templates)
  for t in spec.templates:
    assert t.count("{}") == 1, t
    assert "{" not in t.replace("{}", "") and "}" not in t.replace("{}", "")
  assert spec.prompts(spec.classnames[0])[0] == spec.templates[0].format(spec.classnames[0])
  assert {"train", "test"} <= set(spec.splits)
  assert spec.modality in (registry.IMAGE, registry.AUDIO)
  assert spec.build_section
  # every on-disk spelling of a class is unambiguous after normalisation
  index = spec.class_index()
  if not spec.index_by_sorted_folders:
    assert len({registry.folder_key(c) for c in spec.classnames}) == spec.num_classes
    for i, c in enumerate(spec.classnames):
      assert index[registry.folder_key(c)] == i
    for i, f in enumerate(spec.folder_names or ()):
      assert index[registry.folder_key(f)] == i


def test_known_folder_spellings_match():
  eurosat = registry.get_task("eurosat").class_index()
  assert eurosat[registry.folder_key("SeaLake")] == 9
  assert eurosat[registry.folder_key("lake or sea")] == 9
  assert registry.get_task("gtsrb").class_index()[registry.folder_key("00042")] == 42
  assert registry.get_task("mnist").class_index()[registry.folder_key("7")] == 7
  assert registry.get_task("cifar100").class_index()[registry.folder_key("aquarium_fish")] == 1
  assert registry.get_task("gtzan").class_index()[registry.folder_key("hiphop")] == 4
  ucm = registry.get_task("ucmerced").class_index()
  assert ucm[registry.folder_key("denseresidential")] == 6
  aid = registry.get_task("aid").class_index()
  assert aid[registry.folder_key("BareLand")] == 1
  assert registry.get_task("esc50").class_index()[registry.folder_key("sea_waves")] == 11
  sun = registry.get_task("sun397").class_index()
  assert sun[registry.folder_key("apartment_building_outdoor")] == 8
  cars = registry.get_task("cars").class_index()
  assert cars[registry.folder_key("Ram C-V Cargo Van Minivan 2012")] == 173


def test_get_task_aliases_and_errors():
  for alias in ("CIFAR-100", "cifar100", "Cifar_100", " cifar 100 "):
    assert registry.get_task(alias).name == "cifar100"
  assert registry.get_task("Stanford Cars").name == "cars"
  assert registry.get_task("ImageNet-1k").name == "imagenet"
  assert registry.get_task("UrbanSound8K").name == "urbansound8k"
  assert registry.get_task("ESC-50").name == "esc50"
  spec = registry.get_task("dtd")
  assert registry.get_task(spec) is spec
  with pytest.raises(ValueError, match="unknown task 'flowers'.*eurosat.*urbansound8k"):
    registry.get_task("flowers")


def test_domainnet_domains_share_one_class_list():
  specs = [registry.get_task(n) for n in DOMAINNET]
  first = specs[0]
  assert first.num_classes == len(set(first.classnames)) == 345
  assert len(set(registry.DOMAINNET_FOLDERS)) == 345
  for spec in specs:
    assert spec.classnames == first.classnames and spec.folder_names == first.folder_names
    assert spec.modality == registry.IMAGE and not spec.control
    assert spec.split_name("train") == "train" and spec.split_name("test") == "test"
    assert spec.build_section == "DomainNet"
    assert len(spec.templates) >= 3 and all(t.count("{}") == 1 for t in spec.templates)
    assert all("_" not in c for c in spec.classnames)
  # each domain prompts in its own words
  assert len({s.templates for s in specs}) == len(specs)
  assert "a sketch of a {}." in registry.get_task("domainnet_sketch").templates
  assert "a photo of a {}." in registry.get_task("domainnet_real").templates
  # label order: the release's folders, alphabetical ignoring case
  folders = registry.DOMAINNET_FOLDERS
  assert list(folders) == sorted(folders, key=str.lower)
  assert folders[:3] == ("aircraft_carrier", "airplane", "alarm_clock") and folders[-1] == "zigzag"
  names = first.classnames
  assert names[0] == "aircraft carrier" and names[folders.index("The_Eiffel_Tower")] == (
      "The Eiffel Tower")
  index = first.class_index()
  assert index[registry.folder_key("The_Great_Wall_of_China")] == folders.index(
      "The_Great_Wall_of_China")
  assert index[registry.folder_key("teddy-bear")] == index[registry.folder_key("teddy bear")]


def test_domainnet_aliases():
  assert registry.get_task("DomainNet-Sketch").name == "domainnet_sketch"
  assert registry.get_task("DomainNet-Real").name == "domainnet_real"
  assert registry.get_task("domainnet real").name == "domainnet_real"
  assert registry.get_task("DomainNet_Infograph").name == "domainnet_infograph"
  assert registry.get_task("DomainNet-Paint").name == "domainnet_painting"
  assert registry.get_task("dn_quickdraw").name == "domainnet_quickdraw"
  with pytest.raises(ValueError, match="unknown task"):
    registry.get_task("DomainNet")


def test_imagenet_split_and_sorted_folders():
  spec = registry.get_task("imagenet")
  assert spec.index_by_sorted_folders and spec.split_name("test") == "val"
  assert spec.split_name("train") == "train" and spec.split_name("extra") == "extra"


def test_task_spec_validation():
  with pytest.raises(ValueError, match="exactly one"):
    registry.TaskSpec("t", ("a", "b"), ("a {} and {}",))
  with pytest.raises(ValueError, match="exactly one"):
    registry.TaskSpec("t", ("a", "b"), ("no slot",))
  with pytest.raises(ValueError, match="duplicate"):
    registry.TaskSpec("t", ("a", "a"), ("{}",))
  with pytest.raises(ValueError, match="folder names"):
    registry.TaskSpec("t", ("a", "b"), ("{}",), folder_names=("x",))
  with pytest.raises(ValueError, match="modality"):
    registry.TaskSpec("t", ("a", "b"), ("{}",), modality="video")
  with pytest.raises(ValueError, match="ambiguous"):
    registry.TaskSpec("t", ("a b", "ab"), ("{}",)).class_index()


def test_probe_indices_sorted_seeded_without_replacement():
  p = registry.probe_indices(1000, 100, seed=3)
  assert p.shape == (100,) and p.dtype == np.int64
  assert np.all(np.diff(p) > 0) and p.min() >= 0 and p.max() < 1000
  np.testing.assert_array_equal(p, registry.probe_indices(1000, 100, seed=3))
  assert not np.array_equal(p, registry.probe_indices(1000, 100, seed=4))
  np.testing.assert_array_equal(registry.probe_indices(5, 5, seed=0), np.arange(5))
  assert registry.probe_indices(5, 0, seed=0).shape == (0,)
  with pytest.raises(ValueError, match="6 probes from a train split of 5"):
    registry.probe_indices(5, 6, seed=0)
  with pytest.raises(ValueError, match="non-negative"):
    registry.probe_indices(5, -1, seed=0)


def test_balanced_subset():
  labels = np.repeat(np.arange(4), [5, 3, 7, 4])
  idx = registry.balanced_subset(labels, 3, seed=0)
  assert idx.shape == (12,) and np.all(np.diff(idx) > 0)
  np.testing.assert_array_equal(np.bincount(labels[idx]), [3, 3, 3, 3])
  np.testing.assert_array_equal(idx, registry.balanced_subset(labels, 3, seed=0))
  assert not np.array_equal(idx, registry.balanced_subset(labels, 3, seed=1))
  with pytest.raises(ValueError, match="class 1 has 3 examples"):
    registry.balanced_subset(labels, 4, seed=0)
  loose = registry.balanced_subset(labels, 4, seed=0, strict=False)
  np.testing.assert_array_equal(np.bincount(labels[loose]), [4, 3, 4, 4])
  with pytest.raises(ValueError, match="class 4 has 0"):
    registry.balanced_subset(labels, 1, seed=0, num_classes=5)


def _open_clip_metadata():
  """open_clip's ImageNet lists, read from its file without importing the package."""
  spec = importlib.util.find_spec("open_clip")
  if spec is None or not spec.submodule_search_locations:
    pytest.skip("open_clip is not installed (the test extra installs it)")
  path = os.path.join(spec.submodule_search_locations[0], "zero_shot_metadata.py")
  if not os.path.isfile(path):
    pytest.skip(f"{path} not found")
  ns = {}
  with open(path) as f:
    exec(compile(f.read(), path, "exec"), ns)
  return ns


def test_imagenet_names_and_templates_match_the_reference():
  ref = _open_clip_metadata()
  names = list(ref["IMAGENET_CLASSNAMES"])
  ours = registry.get_task("imagenet")
  diffs = {i: (r, o) for i, (r, o) in enumerate(zip(names, ours.classnames)) if r != o}
  # the reference repeats two names; ours keeps the WordNet lemma at one of each pair
  assert diffs == {744: ("missile", "projectile"), 836: ("sunglasses", "sunglass")}
  assert names[657] == "missile" and names[837] == "sunglasses"
  templates = [t("{}") if callable(t) else t for t in ref["OPENAI_IMAGENET_TEMPLATES"]]
  assert tuple(templates) == ours.templates


def test_every_task_has_a_datasets_md_section():
  path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "datasets.md")
  with open(path) as f:
    text = f.read()
  assert text.startswith("# Preparing datasets\n")
  for name in registry.TASKS:
    assert f"\n## {registry.get_task(name).build_section}\n" in text, name
