"""Reading the share line every process of a divided run ends its log with
(``platonic_jax.engine.sweep.share_line``), for the multi-process tests."""

import re

SHARE = re.compile(r"process (\d) of (\d) did (\d+) fine-tunes, (\d+) solves, (\d+) cells "
                   r"\((\d+) adapter fits\)")


def shares(log: str, processes: int) -> dict[int, tuple[int, ...]]:
  """{process: (fine-tunes, solves, cells, adapter fits)} from each process's last line of a run
  of ``processes`` processes (several: each line carries launch_local's ``[pN]`` prefix)."""
  got = {}
  for line in log.splitlines():
    m = SHARE.search(line)
    if m and int(m.group(2)) == processes:
      p = int(m.group(1))
      if processes > 1:
        assert line.startswith(f"[p{p}]"), line
      got[p] = tuple(int(g) for g in m.groups()[2:])
  assert sorted(got) == list(range(processes)), log[-3000:]
  return got
