"""Every command of README.md and docs/*.md runs verbatim, so a documented command that fails
cannot land again.

* Each fenced block tagged ``bash``, ``sh``, ``shell`` or ``console`` is one test case
  (id ``file:line`` of its opening fence), run as one ``bash -e -o pipefail`` script in a
  scratch directory that mirrors the repository through symlinks (so ``.venv/bin/...`` and
  ``training/...`` resolve, and outputs such as ``out/...`` land in the scratch directory),
  with a clean-shell environment (``userenv.env``: never this process's ``os.environ``,
  which importing TensorFlow changes) and an empty scratch HOME. It must exit 0, print no
  traceback, and leave no process of its own running (a block that starts a server in the
  background stops it itself).
* The blocks of a walkthrough (``WALKTHROUGHS``) continue each other, as in one reader's
  shell: they share one scratch directory per test session and the variables an earlier
  block exported; a block's test first runs the earlier blocks not yet run (under a file
  lock, so that pytest-xdist workers never run one twice).
* Blocks that train with TensorFlow Federated (about a minute each even at toy sizes on a
  loaded 2-core machine) are marked slow in ``SLOW_BLOCKS``, with the reason; in a
  walkthrough every block after a slow one is slow too.
* Commands that other tests exercise (``make test`` is the suite itself; ``make demo`` is
  long) are not run here but mapped in ``COVERED_ELSEWHERE`` to the tests that cover them;
  the mapping must match the documents exactly and name tests that exist.
* Inline commands of the prose (``.venv/bin/...`` or ``make ...`` in backticks) run here too,
  unless a runnable block holds them or they are mapped.
* Blocks tagged ``text`` are prose (downloads from the internet, full-scale multi-day jobs)
  and must sit right next to a runnable block, the small version of the same thing.
* A ``python`` block introduced by a link to a file under ``examples/`` is an excerpt: its
  lines appear in that file, in order, and the file runs (``.venv/bin/python
  examples/fed_avg_with_mf.py``). Any other ``python`` block runs as a program.
"""

from __future__ import annotations

import dataclasses
import fcntl
import glob
import json
import os
import re
import shlex
import signal
import subprocess
import tempfile
import time
from typing import Dict, List, Optional, Tuple

import pytest

import userenv

REPO = userenv.REPO
DOC_FILES = ["README.md"] + sorted(
    os.path.relpath(p, REPO)
    for p in glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True))
SHELL_TAGS = ("bash", "sh", "shell", "console")
# What the scratch directory links to: everything a documented command reads from the
# repository root. (Nothing documented writes under these paths: a write would go through
# the link into the repository.)
MIRRORED = ("tff_mf", "training", "stackoverflow", "examples", "benchmarks", "docs", "Makefile",
            "requirements", "scripts", "setup.cfg", "pyproject.toml", "BUILD", "README.md",
            "BENCHMARKS.md", ".venv")
BLOCK_TIMEOUT_SECONDS = 420
# Documents whose blocks continue each other (step 0 builds the data and exports $D, $R, ...).
WALKTHROUGHS = ("docs/reproduce.md",)

# Documented commands that are not run here, each with the tests that cover it.
COVERED_ELSEWHERE: Dict[str, Tuple[str, ...]] = {
    # The suite itself; the Makefile lines behind every make target are pinned here.
    "make test": ("tests/test_docs_commands.py::test_make_targets_run_the_documented_commands",),
    "make test-slow": (
        "tests/test_docs_commands.py::test_make_targets_run_the_documented_commands",),
    # Every make target runs `venv` (scripts/bootstrap.sh) first, `make test` included.
    "make venv": ("tests/test_docs_commands.py::test_make_targets_run_the_documented_commands",),
    # The main job at full size takes ~12 minutes: the slow test runs it end to end on the tiny
    # StackOverflow fixture, the fast ones its √L table from a clean shell and the Makefile line.
    "make demo": ("tests/test_training_main_job.py::test_main_job_writes_results_and_plot",
                  "tests/test_training_main_job.py::test_factorization_table_from_a_clean_shell",
                  "tests/test_docs_commands.py::test_make_targets_run_the_documented_commands"),
    ".venv/bin/python -m training.main_job --output_dir out/demo": (
        "tests/test_training_main_job.py::test_main_job_writes_results_and_plot",
        "tests/test_training_main_job.py::test_factorization_table_from_a_clean_shell"),
    # The benchmarks take hours and write BENCHMARKS.md; no test runs them. Only the Makefile
    # line is pinned.
    "make bench": ("tests/test_docs_commands.py::test_make_targets_run_the_documented_commands",),
    # The Flower layer's suite in its own environment (.venv-flower); CI runs it after make test.
    "make test-flower": (
        "tests/test_docs_commands.py::test_make_targets_run_the_documented_commands",),
    "make venv-flower": (
        "tests/test_docs_commands.py::test_make_targets_run_the_documented_commands",),
    # The documentation site in its own environment (.venv-docs); CI builds it after
    # make test-flower. docs-check needs Chromium: it is never part of the default suite.
    "make docs": ("tests/test_docs_commands.py::test_make_targets_run_the_documented_commands",
                  "tests/test_docs_site.py::test_make_docs_builds_the_site_in_strict_mode"),
    "make docs-check": (
        "tests/test_docs_commands.py::test_make_targets_run_the_documented_commands",
        "tests/test_docs_site.py::test_docs_check_loads_the_site_in_headless_chromium"),
    ".venv-flower/bin/python examples/flower_mf.py": (
        "tests/flower/test_example.py::test_flower_example_concludes_from_its_seeds",),
    # The Flower App: built and run with `flwr run` by its test in .venv-flower (from a clean
    # shell, offline: uv takes the lock's wheels from dist/wheelhouse, as the App's README says).
    "make flower-app": (
        "tests/flower/test_app.py::test_app_under_flwr_run",
        "tests/test_docs_commands.py::test_make_targets_run_the_documented_commands"),
    "make flower-wheelhouse": (
        "tests/flower/test_app.py::test_app_under_flwr_run",
        "tests/test_docs_commands.py::test_make_targets_run_the_documented_commands"),
    "source .venv-flower/bin/activate": (
        "tests/flower/test_app.py::test_app_under_flwr_run",),
    'flwr run examples/flower_app --stream --federation-config "num-supernodes=16"': (
        "tests/flower/test_app.py::test_app_under_flwr_run",),
    ".venv/bin/python examples/fed_avg_with_mf.py": (
        "tests/test_docs_commands.py::test_fed_avg_example_runs_and_meets_its_target_epsilon",),
    ".venv/bin/python examples/run_notebook.py examples/tutorial.ipynb": (
        "tests/test_tutorial.py::test_tutorial_cells_run_in_order",),
    # A worker in the foreground (it never exits); docs run it in the background next to this.
    ".venv/bin/python -m training.distributed serve --port 8000": (
        "tests/test_distributed_runtime.py::test_serve_and_check_work_from_a_clean_shell",),
}

# Shell blocks (found by a command they hold) that run only in the slow suite, and why.
SLOW_BLOCKS: Dict[str, str] = {  # (times measured at load 6-9 on 2 cores)
    "training/run_stackoverflow.py --dataset=pydocs": (
        "20 TFF rounds on the docstring dataset and its evaluation: 1.5-2.5 minutes"),
    "training.sweep --grid table4_repeats --slice 0:2": (
        "two training runs (TensorFlow and TFF start-up each): 1.5-2.5 minutes"),
    "training.sweep --grid table4_repeats --slice 2:3": (
        "a training run on two TFF workers: about a minute"),
    "training.run_stackoverflow --mechanism=opt_momentum": (
        "a training run on two TFF workers: 1-1.5 minutes"),
    "--canaries=32": (
        "a training run with its one-run audit (TensorFlow start-up, task and audit): "
        "0.5-1 minute; the flag is tested in tests/test_canaries.py"),
    ".venv/bin/pip wheel --quiet --no-deps . -w out/wheels": (
        "a fresh venv with the core's dependencies from the package index: about a minute; "
        "tests/test_core_install.py installs the same wheel in the default suite"),
    "tff-mf audit --mechanism opt_prefix_sum": (
        "two audits, each building and running federated averaging: 1-2 minutes (the command "
        "itself is tested in tests/test_audit.py)"),
}


@dataclasses.dataclass(frozen=True)
class Block:
  path: str  # relative to the repository root
  line: int  # 1-based line of the opening fence
  tag: str
  text: str
  before: str  # the prose between the previous fenced block and this one

  @property
  def id(self) -> str:
    return f"{self.path}:{self.line}"


def parse_blocks(path: str) -> List[Block]:
  """The fenced code blocks of a markdown file (backtick fences, any tag)."""
  with open(os.path.join(REPO, path), encoding="utf-8") as f:
    lines = f.read().splitlines()
  blocks, prose, i = [], [], 0
  while i < len(lines):
    opening = re.match(r"^(\s*)(`{3,})\s*([^`\s]*)", lines[i])
    if not opening:
      prose.append(lines[i])
      i += 1
      continue
    fence, start, body = opening.group(2), i, []
    i += 1
    while i < len(lines) and not re.match(rf"^\s*{fence}\s*$", lines[i]):
      body.append(lines[i])
      i += 1
    if i == len(lines):
      raise ValueError(f"{path}:{start + 1}: unclosed code block")
    i += 1
    blocks.append(Block(path, start + 1, opening.group(3).lower(), "\n".join(body) + "\n",
                        "\n".join(prose)))
    prose = []
  return blocks


def inline_commands(path: str) -> List[Tuple[int, str]]:
  """(line, command) of the backticked commands in the prose: `.venv/bin/...`, `make ...`."""
  with open(os.path.join(REPO, path), encoding="utf-8") as f:
    lines = f.read().splitlines()
  out, in_block = [], False
  for number, line in enumerate(lines, start=1):
    if re.match(r"^\s*```", line):
      in_block = not in_block
      continue
    if in_block:
      continue
    for span in re.findall(r"`([^`]+)`", line):
      if re.match(r"^(\.venv/bin/\S|make \w|python3? )", span):
        out.append((number, " ".join(span.split())))
  return out


def command_lines(block: Block) -> List[str]:
  """The commands of a shell block: continuation lines joined, comments and prompts dropped."""
  text = block.text
  if block.tag == "console":  # only the `$ ` lines are commands; the rest is output
    text = "\n".join(line[2:] for line in text.splitlines() if line.startswith("$ "))
  out = []
  for line in text.replace("\\\n", " ").splitlines():
    line = re.sub(r"(^|\s)#.*$", "", line).strip()
    if line:
      out.append(" ".join(line.split()))
  return out


def script_of(block: Block) -> str:
  return "\n".join(command_lines(block)) + "\n" if block.tag == "console" else block.text


def is_covered_elsewhere(block: Block) -> bool:
  return any(line in COVERED_ELSEWHERE for line in command_lines(block))


def slow_reason(block: Block) -> Optional[str]:
  joined = " ".join(command_lines(block))
  reasons = [why for key, why in SLOW_BLOCKS.items() if key in joined]
  if reasons:
    return reasons[0]
  if block.path in WALKTHROUGHS:
    earlier = [b for b in WALKTHROUGH_BLOCKS[block.path] if b.line < block.line]
    for b in earlier:
      if slow_reason(b):
        return f"continues {b.id}, which is slow"
  return None


SHELL_BLOCKS = [b for path in DOC_FILES for b in parse_blocks(path) if b.tag in SHELL_TAGS]
RUN_BLOCKS = [b for b in SHELL_BLOCKS if not is_covered_elsewhere(b)]
WALKTHROUGH_BLOCKS = {path: [b for b in RUN_BLOCKS if b.path == path] for path in WALKTHROUGHS}
RUN_LINES = {line for b in RUN_BLOCKS for line in command_lines(b)}
INLINE_TO_RUN = [(path, line, command) for path in DOC_FILES
                 for line, command in inline_commands(path)
                 if command not in RUN_LINES and command not in COVERED_ELSEWHERE]


def _params(blocks):
  return [pytest.param(b, id=b.id, marks=[pytest.mark.slow] if slow_reason(b) else [])
          for b in blocks]


# --- running a script as a user's shell would -----------------------------------------------

@pytest.fixture(scope="session")
def venv_pythonpath() -> Optional[str]:
  """PYTHONPATH for the commands: None, or the scratch directory when the venv's editable
  install points at another checkout (a git worktree sharing a venv), so that the commands
  exercise this checkout."""
  python = os.path.join(REPO, ".venv", "bin", "python")
  if not os.path.exists(python):
    pytest.skip(".venv/ is missing: the documented commands run .venv/bin/...; run `make venv`")
  found = subprocess.run([python, "-c", "import tff_mf; print(tff_mf.__file__)"], cwd="/",
                         env=userenv.env(), capture_output=True, text=True, timeout=120)
  assert found.returncode == 0, found.stderr
  root = os.path.dirname(os.path.dirname(os.path.realpath(found.stdout.strip())))
  return None if root == os.path.realpath(REPO) else "scratch"


def make_scratch(directory: str, pythonpath: Optional[str]) -> Tuple[str, Dict[str, str]]:
  """(root, env): a directory that looks like the repository root to a command (created on
  first use) and a clean shell's environment with an empty HOME beside it."""
  root = os.path.join(directory, "repo")
  home = os.path.join(directory, "home")
  if not os.path.isdir(root):
    os.makedirs(root)
    os.makedirs(home, mode=0o700)
    for name in MIRRORED:
      if os.path.lexists(os.path.join(REPO, name)):
        os.symlink(os.path.join(REPO, name), os.path.join(root, name))
  env = userenv.env(home=home)
  if pythonpath:
    env["PYTHONPATH"] = root
  return root, env


def _group_alive(pgid: int) -> bool:
  try:
    os.killpg(pgid, 0)
    return True
  except ProcessLookupError:
    return False
  except PermissionError:
    return True


def run_script(script: str, cwd: str, env: Dict[str, str],
               timeout: float = BLOCK_TIMEOUT_SECONDS) -> Dict[str, object]:
  """Runs ``script`` with ``bash -e -o pipefail`` in its own process group.

  Output goes to files, not pipes, so that a background process the script leaves running
  (which would hold a pipe open) is reported as a leftover instead of blocking the test.
  """
  started = time.monotonic()
  with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
    proc = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", script], cwd=cwd, env=env,
                            stdin=subprocess.DEVNULL, stdout=out, stderr=err, text=True,
                            start_new_session=True)
    leftovers, note = False, ""
    try:
      try:
        returncode = proc.wait(timeout=timeout)
      except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        returncode, note = -1, f"\n[timed out after {timeout} s]"
        proc.wait()
      deadline = time.monotonic() + 10
      while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
      leftovers = returncode != -1 and _group_alive(proc.pid)
    finally:
      if _group_alive(proc.pid):
        os.killpg(proc.pid, signal.SIGKILL)
    out.seek(0)
    err.seek(0)
    return {"returncode": returncode, "stdout": out.read(), "stderr": err.read() + note,
            "leftovers": leftovers, "seconds": round(time.monotonic() - started, 1)}


def check_result(what: str, result: Dict[str, object]) -> None:
  tail = (f"\n--- stdout ---\n{str(result['stdout'])[-4000:]}"
          f"\n--- stderr ---\n{str(result['stderr'])[-6000:]}")
  assert result["returncode"] == 0, f"{what} exited with {result['returncode']}{tail}"
  assert "Traceback" not in result["stderr"], f"{what} printed a traceback{tail}"
  assert not result["leftovers"], f"{what} left processes running (stop what it starts){tail}"


# --- walkthroughs: one shell session per document --------------------------------------------

@pytest.fixture(scope="session")
def session_dir(tmp_path_factory) -> str:
  """A directory shared by every pytest-xdist worker of this test session."""
  base = tmp_path_factory.getbasetemp()
  return str(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)


def run_in_walkthrough(block: Block, session: str, pythonpath: Optional[str]) -> dict:
  """Runs the walkthrough's blocks up to ``block`` that have not run yet; returns its result."""
  name = "walkthrough-" + re.sub(r"\W", "_", block.path)
  directory = os.path.join(session, name)
  with open(os.path.join(session, name + ".lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    root, env = make_scratch(directory, pythonpath)
    state_path = os.path.join(directory, "results.json")
    exports = os.path.join(directory, "exports.sh")
    results = json.load(open(state_path)) if os.path.exists(state_path) else {}
    for earlier in WALKTHROUGH_BLOCKS[block.path]:
      if earlier.line > block.line:
        break
      if earlier.id not in results:
        script = (f"source {shlex.quote(exports)}\n" if os.path.exists(exports) else "") + (
            script_of(earlier) + f"\nexport -p > {shlex.quote(exports)}\n")
        results[earlier.id] = run_script(script, root, env)
        with open(state_path, "w") as f:
          json.dump(results, f)
      if earlier.id != block.id and results[earlier.id]["returncode"] != 0:
        pytest.fail(f"{block.id} continues {earlier.id}, which failed")
    return results[block.id]


# --- the tests ----------------------------------------------------------------------------------

@pytest.mark.parametrize("block", _params(RUN_BLOCKS))
def test_documented_shell_block_runs_verbatim(block, tmp_path, session_dir, venv_pythonpath):
  if block.path in WALKTHROUGHS:
    result = run_in_walkthrough(block, session_dir, venv_pythonpath)
  else:
    root, env = make_scratch(str(tmp_path), venv_pythonpath)
    result = run_script(script_of(block), root, env)
  check_result(block.id, result)


@pytest.mark.parametrize("path,line,command", INLINE_TO_RUN,
                         ids=[f"{p}:{n}:{c}" for p, n, c in INLINE_TO_RUN])
def test_inline_command_runs_verbatim(path, line, command, tmp_path, venv_pythonpath):
  assert not re.match(r"python3? ", command), (
      f"{path}:{line}: `{command}`: spell out .venv/bin/ (the README's convention)")
  assert not command.startswith("make "), f"{path}:{line}: map `{command}` in COVERED_ELSEWHERE"
  root, env = make_scratch(str(tmp_path), venv_pythonpath)
  check_result(f"{path}:{line}: `{command}`", run_script(command, root, env))


def test_every_command_runs_or_is_mapped_to_the_tests_that_cover_it():
  assert SHELL_BLOCKS, "no shell blocks found in README.md and docs/*.md"
  documented = {line for b in SHELL_BLOCKS for line in command_lines(b)} | {
      command for path in DOC_FILES for _, command in inline_commands(path)}
  for block in SHELL_BLOCKS:
    if is_covered_elsewhere(block):
      # A mapped block holds only mapped commands: nothing documented hides behind one.
      unmapped = [line for line in command_lines(block) if line not in COVERED_ELSEWHERE]
      assert not unmapped, f"{block.id}: {unmapped} neither run nor mapped"
    else:
      # make targets bootstrap .venv/ (and the documented ones are long): never run here.
      assert not any(re.match(r"make(\s|$)", line) for line in command_lines(block)), (
          f"{block.id}: a make target; map it in COVERED_ELSEWHERE")
  stale = set(COVERED_ELSEWHERE) - documented
  assert not stale, f"COVERED_ELSEWHERE maps commands no document shows: {sorted(stale)}"
  for tests in COVERED_ELSEWHERE.values():
    for node in tests:
      path, name = node.split("::")
      with open(os.path.join(REPO, path), encoding="utf-8") as f:
        assert re.search(rf"^def {name}\(", f.read(), re.M), f"{node} does not exist"
  for key in SLOW_BLOCKS:
    matches = [b.id for b in RUN_BLOCKS if key in " ".join(command_lines(b))]
    assert len(matches) == 1, f"SLOW_BLOCKS key {key!r} matches {matches}, not one block"


def test_make_targets_run_the_documented_commands():
  with open(os.path.join(REPO, "Makefile"), encoding="utf-8") as f:
    makefile = f.read()
  for target, command in (
      ("test", r"\$\(PY\) -m pytest .*tests"), ("test-slow", r"\$\(PY\) -m pytest -m slow .*tests"),
      ("demo", r"\$\(PY\) -m training.main_job --output_dir out/demo"),
      ("bench", r"\$\(PY\) benchmarks/run_all.py")):
    assert re.search(rf"^{target}: venv\n\t{command}$", makefile, re.M), target
  assert re.search(r"^venv:\n\t@bash scripts/bootstrap.sh$", makefile, re.M)
  assert re.search(r"^test-flower: venv-flower\n\t\"\$\$\(cd \.venv-flower && pwd -P\)/bin/python\" "
                   r"-m pytest .*tests/flower$",
                   makefile, re.M)
  assert re.search(r"^venv-flower:\n\t@bash scripts/bootstrap_flower.sh$", makefile, re.M)
  assert re.search(r"^venv-docs:\n\t@bash scripts/bootstrap_docs.sh$", makefile, re.M)
  assert re.search(r"^docs: venv-docs\n\t.*\.venv-docs/bin/mkdocs build --strict --clean$",
                   makefile, re.M)
  assert re.search(r"^docs-check: docs\n\t\.venv-docs/bin/python scripts/docs_check\.py ",
                   makefile, re.M)
  assert re.search(r"^flower-app: venv-flower\n\t@bash scripts/build_flower_app.sh$", makefile,
                   re.M)
  assert re.search(r"^flower-wheelhouse: venv-flower\n"
                   r"\t@bash scripts/build_flower_app.sh --wheelhouse$", makefile, re.M)


def test_code_blocks_are_tagged_and_text_blocks_sit_next_to_a_runnable_one():
  for path in DOC_FILES:
    blocks = parse_blocks(path)
    for index, block in enumerate(blocks):
      assert block.tag, f"{block.id}: untagged code block (bash, python or text)"
      if block.tag != "text":
        continue
      neighbours = blocks[max(0, index - 1):index] + blocks[index + 1:index + 2]
      assert any(b.tag in SHELL_TAGS and not is_covered_elsewhere(b) for b in neighbours), (
          f"{block.id}: a text block needs a runnable shell block (its small version) "
          "right before or after it")


PYTHON_BLOCKS = [b for path in DOC_FILES for b in parse_blocks(path) if b.tag == "python"]
EXAMPLE_LINK = re.compile(r"\]\((examples/[\w./-]+\.py)\)")


def _excerpt_source(block: Block) -> Optional[str]:
  """The examples/ file a python block quotes: the last one the paragraph before it links."""
  links = EXAMPLE_LINK.findall(block.before.strip().split("\n\n")[-1])
  return links[-1] if links else None


def test_python_blocks_are_excerpts_of_examples_or_programs():
  assert any(_excerpt_source(b) for b in PYTHON_BLOCKS if b.path == "README.md"), (
      "README.md's drop-in aggregator snippet should quote examples/fed_avg_with_mf.py")
  for block in PYTHON_BLOCKS:
    source = _excerpt_source(block)
    if source is None:
      continue
    with open(os.path.join(REPO, source), encoding="utf-8") as f:
      remaining = iter(f.read().splitlines())
    for line in block.text.splitlines():
      if line.strip():
        assert any(line.rstrip() == candidate.rstrip() for candidate in remaining), (
            f"{block.id}: {line!r} is not in {source} (in this order)")


PROGRAM_BLOCKS = [b for b in PYTHON_BLOCKS if _excerpt_source(b) is None]


@pytest.mark.parametrize("block", PROGRAM_BLOCKS, ids=[b.id for b in PROGRAM_BLOCKS])
def test_documented_python_program_runs(block, tmp_path, venv_pythonpath):
  root, env = make_scratch(str(tmp_path), venv_pythonpath)
  with open(os.path.join(root, "snippet.py"), "w", encoding="utf-8") as f:
    f.write(block.text)
  check_result(block.id, run_script(".venv/bin/python snippet.py", root, env))


def test_fed_avg_example_runs_and_meets_its_target_epsilon(tmp_path, venv_pythonpath):
  with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
    assert "(`.venv/bin/python examples/fed_avg_with_mf.py`)" in f.read()
  root, env = make_scratch(str(tmp_path), venv_pythonpath)
  result = run_script(".venv/bin/python examples/fed_avg_with_mf.py", root, env)
  check_result("examples/fed_avg_with_mf.py", result)
  found = re.search(r"z = ([0-9.]+) for epsilon = ([0-9.]+)", result["stdout"])
  assert found, result["stdout"]
  assert float(found.group(1)) > 0
  assert float(found.group(2)) <= 8.0
  # It shows that training worked: the DP model's held-out loss at least halves, and the
  # script prints the non-private run and the true weights beside it.
  worked = re.search(r"DP training worked: held-out MSE ([0-9.]+) -> ([0-9.]+)", result["stdout"])
  assert worked, result["stdout"]
  assert float(worked.group(2)) < 0.5 * float(worked.group(1))
  assert "true kernel:" in result["stdout"] and "non-private" in result["stdout"]
  assert "tensorflow/core" not in result["stderr"]  # TensorFlow's start-up logs are quiet


# The lines a user's own script needs around README's drop-in snippet: imports, the model and
# one round, and nothing of tff_mf.tf.runtime (the library stops TFF's server itself).
_SNIPPET_BEFORE = """
import json
import numpy as np
import psutil
import tensorflow as tf
import tensorflow_federated as tff
from tff_mf import participation
from tff_mf.spec import MechanismSpec
from tff_mf.tf import aggregators
ROUNDS, CLIENTS_PER_ROUND, EPOCHS = 4, 2, 1


def model_fn():
  keras_model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(3,))])
  return tff.learning.models.from_keras_model(
      keras_model, loss=tf.keras.losses.MeanSquaredError(),
      input_spec=(tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None, 1], tf.float32)))
"""
_SNIPPET_AFTER = """
data = tf.data.Dataset.from_tensor_slices((np.ones((4, 3), np.float32),
                                           np.ones((4, 1), np.float32))).batch(2)
process.next(process.initialize(), [data, data])
children = [p.pid for p in psutil.Process().children(recursive=True)
            if "worker_binary" in p.name()]
print(json.dumps(children), flush=True)
"""


def test_readme_snippet_alone_leaves_no_tff_server_running(tmp_path, venv_pythonpath):
  """README's drop-in snippet in a user's script with no tff_mf.tf.runtime call: after the
  script exits, no worker_binary it started is left running (TFF 0.87 leaves it)."""
  import psutil  # pylint: disable=g-import-not-at-top
  [snippet] = [b for b in PYTHON_BLOCKS
               if b.path == "README.md" and _excerpt_source(b) == "examples/fed_avg_with_mf.py"]
  assert "runtime" not in snippet.text
  root, env = make_scratch(str(tmp_path), venv_pythonpath)
  with open(os.path.join(root, "snippet.py"), "w", encoding="utf-8") as f:
    f.write(_SNIPPET_BEFORE + snippet.text + _SNIPPET_AFTER)
  result = run_script(".venv/bin/python snippet.py", root, env)
  pids = json.loads(str(result["stdout"]).strip().splitlines()[-1])
  assert pids, "the round should have started TFF's worker_binary"
  survivors = []
  for pid in pids:
    try:
      if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        survivors.append(pid)
        os.kill(pid, signal.SIGKILL)  # a server the script started: not left to other tests
    except psutil.NoSuchProcess:
      pass
  assert not survivors, f"worker_binary {survivors} outlived the script"
  check_result("README's drop-in snippet", result)
