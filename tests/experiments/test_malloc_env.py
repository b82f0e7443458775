"""The launchers' glibc tunables re-execution."""

import sys

import pytest

from experiments import malloc_env


def test_reexec_adds_only_the_missing_tunables(monkeypatch):
  calls = []
  monkeypatch.setattr(malloc_env.os, "execve", lambda *a: calls.append(a))
  monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.tcache_count=0:" + malloc_env.HUGETLB)
  malloc_env.reexec_with_tunables("experiments.main", ["--workdir=w"])
  (exe, argv, env), = calls
  assert exe == sys.executable and argv == [sys.executable, "-m", "experiments.main", "--workdir=w"]
  got = env["GLIBC_TUNABLES"].split(":")
  assert got[:2] == ["glibc.malloc.tcache_count=0", malloc_env.HUGETLB]
  assert got[2:] == list(malloc_env.KEEP_MEMORY)


@pytest.mark.parametrize("hugepages,keep_memory", [(True, True), (False, True), (False, False)])
def test_reexec_returns_when_everything_wanted_is_set(monkeypatch, hugepages, keep_memory):
  monkeypatch.setattr(malloc_env.os, "execve", lambda *a: pytest.fail("re-executed"))
  have = ([malloc_env.HUGETLB] if hugepages else []) + list(malloc_env.KEEP_MEMORY if keep_memory else [])
  monkeypatch.setenv("GLIBC_TUNABLES", ":".join(have))
  malloc_env.reexec_with_tunables("m", [], hugepages=hugepages, keep_memory=keep_memory)
  if not have:
    monkeypatch.delenv("GLIBC_TUNABLES")
    malloc_env.reexec_with_tunables("m", [], hugepages=False, keep_memory=False)
