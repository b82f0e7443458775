"""Runs a launcher as one JAX program of N local processes (what a pod or a cluster runs, here).

    python -m experiments.launch_local --processes=2 --devices_per_process=2 -- \\
        experiments.main --config=experiments/configs/main.py:micro --workdir=/tmp/pj_mp

After ``--`` comes the launcher as a module, ``MODULE [args]``, ``-m MODULE [args]`` or
``python -m MODULE [args]`` (the processes run this interpreter). Starts N copies of
``python -m <module> <args>``, each with ``--coordinator_address`` (a free
loopback port, 127.0.0.1), ``--num_processes=N`` and ``--process_id=i`` appended, on the CPU
backend with ``--devices_per_process`` host devices each
(``XLA_FLAGS=--xla_force_host_platform_device_count=M``; cross-process collectives by gloo).
Each process's output lines are printed as they come, behind ``[p<i>]``. Exits with the first
non-zero exit status of a process (the others are then stopped), else 0.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Sequence


def free_port() -> int:
  """A TCP port free on 127.0.0.1 now (the kernel's choice)."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _parser() -> argparse.ArgumentParser:
  from experiments import cli
  p = cli.ArgumentParser(
      prog="python -m experiments.launch_local",
      usage="python -m experiments.launch_local --processes=N [--devices_per_process=M] "
            "[--port=P] -- [python] [-m] MODULE [args...]",
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--processes", type=int, required=True, help="local processes to start")
  p.add_argument("--devices_per_process", type=int, default=1,
                 help="CPU devices each process sees")
  p.add_argument("--port", type=int, default=0, help="coordinator port (0: a free one)")
  p.add_argument("--verbose", action="store_true", help=cli.VERBOSE_HELP)
  return p


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
  """``(options, [module, args...])``; ``--help`` prints the usage and exits 0. A bad count, a
  missing ``--`` or a command that names no module: ``error: <message>``, SystemExit 2."""
  argv = list(argv)
  cut = argv.index("--") if "--" in argv else len(argv)
  p = _parser()
  opts = p.parse_args(argv[:cut])  # --help exits here, status 0
  if cut == len(argv):
    p.error("missing '--' before the command to run, e.g. -- experiments.main --workdir=/tmp/w")
  if opts.processes < 1:
    p.error(f"--processes must be >= 1, got {opts.processes}")
  if opts.devices_per_process < 1:
    p.error(f"--devices_per_process must be >= 1, got {opts.devices_per_process}")
  return opts, module_command(argv[cut + 1:], p.error)


# The interpreter's options that may stand between ``python`` and ``-m`` (each process runs
# ``sys.executable -u -m MODULE``, so they are dropped).
_PYTHON_OPTIONS = ("-u", "-B", "-O", "-OO", "-E", "-s", "-I", "-P")


def module_command(command: Sequence[str], error=None) -> list[str]:
  """``[module, args...]`` of the command after ``--``: ``MODULE args``, ``-m MODULE args`` or
  ``python -m MODULE args`` (any ``python``, ``python3.11`` or a path to one; the processes
  run this interpreter, ``sys.executable``). ``error(message)`` (default: ValueError) for a
  command that names no module: empty, a script path, or a python without ``-m``."""
  def refuse(message):
    if error is None:
      raise ValueError(message)
    error(message)
    raise ValueError(message)  # an error() that returned

  hint = "after '--': MODULE [args], -m MODULE [args] or python -m MODULE [args]"
  cmd = list(command)
  if cmd and re.fullmatch(r"python[0-9.]*", os.path.basename(cmd[0])):
    cmd = cmd[1:]
    while cmd and cmd[0] in _PYTHON_OPTIONS:
      cmd = cmd[1:]
    if cmd and not cmd[0].startswith("-m") and not cmd[0].endswith(".py"):
      refuse(f"launch_local runs a module, not {' '.join(command)!r}; {hint}")
  if cmd and cmd[0] == "-m":
    cmd = cmd[1:]
  elif cmd and cmd[0].startswith("-m"):  # -mexperiments.main
    cmd = [cmd[0][2:]] + cmd[1:]
  if not cmd or cmd[0].startswith("-"):
    refuse(f"name the launcher module (e.g. experiments.main); {hint}")
  module = cmd[0]
  if module.endswith(".py") or "/" in module or os.sep in module:
    dotted = module[:-3] if module.endswith(".py") else module
    dotted = dotted.strip("./").replace("/", ".").replace(os.sep, ".")
    refuse(f"{module!r} is a file: give its module, -- python -m {dotted} [args]")
  if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", module):
    refuse(f"{module!r} is not a module name; {hint}")
  return cmd


def commands(opts: argparse.Namespace, command: Sequence[str], port: int) -> list[list[str]]:
  """The command line of each process."""
  module, args = command[0], list(command[1:])
  return [[sys.executable, "-u", "-m", module, *args, f"--coordinator_address=127.0.0.1:{port}",
           f"--num_processes={opts.processes}", f"--process_id={i}"]
          for i in range(opts.processes)]


def environment(devices: int, base: dict | None = None) -> dict:
  """The processes' environment: CPU backend with ``devices`` host devices (other XLA flags
  kept)."""
  env = dict(os.environ if base is None else base)
  flags = [f for f in env.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={devices}"])
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONUNBUFFERED"] = "1"
  return env


def _stream(i: int, proc: subprocess.Popen, out) -> None:
  for line in proc.stdout:
    out.write(f"[p{i}] {line}")
    out.flush()


def run(opts: argparse.Namespace, command: Sequence[str], out=None) -> int:
  """Starts the processes, streams their output behind ``[p<i>]`` to ``out`` (default
  stdout), waits; returns 0 if all succeed, else the first failure's exit status (the other
  processes are then terminated: a multi-process program cannot go on without one of them)."""
  out = out or sys.stdout
  port = opts.port or free_port()
  env = environment(opts.devices_per_process)
  procs = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1) for c in commands(opts, command, port)]
  threads = [threading.Thread(target=_stream, args=(i, p, out), daemon=True)
             for i, p in enumerate(procs)]
  for t in threads:
    t.start()
  failed = None
  try:
    while any(p.poll() is None for p in procs):
      for i, p in enumerate(procs):
        if failed is None and p.poll() not in (None, 0):
          failed = (i, p.returncode)
      if failed is not None:
        break
      time.sleep(0.05)
  finally:
    for p in procs:
      if p.poll() is None:
        p.send_signal(signal.SIGTERM if failed is not None else signal.SIGINT)
    for p in procs:
      try:
        p.wait(timeout=10)
      except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    for t in threads:
      t.join(timeout=5)
  if failed is None:
    bad = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode != 0]
    failed = bad[0] if bad else None
  if failed is not None:
    out.write(f"launch_local: process {failed[0]} exited with status {failed[1]}\n")
    out.flush()
    return failed[1] if failed[1] > 0 else 1
  return 0


def main(argv: Sequence[str] | None = None) -> int:
  opts, command = parse(sys.argv[1:] if argv is None else argv)
  from experiments import cli
  return cli.refusing(run)(opts, command)


if __name__ == "__main__":
  sys.exit(main())
