"""glibc malloc settings for the launchers, applied by re-executing the process.

glibc reads ``GLIBC_TUNABLES`` at start-up only, so a launcher that wants them calls
``reexec_with_tunables`` first thing in ``main``; it returns when they are already in place.

* ``HUGETLB`` (glibc >= 2.35): transparent huge pages for malloc's memory (fewer page faults on
  large activation buffers).
* ``KEEP_MEMORY``: one arena, no separate mmap of large blocks, no trimming: freed memory stays
  in the process and the next step or program reuses pages that are already mapped. On the
  development VM, memory free for about two seconds goes back to the host and costs ~2.5 ms per
  2 MB page to fault in again (measurements in ``experiments/bench/lora.py``).
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

HUGETLB = "glibc.malloc.hugetlb=1"
KEEP_MEMORY = ("glibc.malloc.arena_max=1", "glibc.malloc.mmap_max=0",
               "glibc.malloc.trim_threshold=68719476736")


def reexec_with_tunables(module: str, argv: Sequence[str], *, hugepages: bool = True,
                         keep_memory: bool = True) -> None:
  """Re-runs ``python -m module argv...`` with the wanted tunables unless they are set already."""
  tunables = os.environ.get("GLIBC_TUNABLES", "")
  wanted = ([HUGETLB] if hugepages else []) + (list(KEEP_MEMORY) if keep_memory else [])
  missing = [t for t in wanted if t not in tunables.split(":")]
  if not missing:
    return
  env = dict(os.environ, GLIBC_TUNABLES=":".join(t for t in [tunables] + missing if t))
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, "-m", module] + list(argv), env)
