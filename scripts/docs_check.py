"""The built documentation site in a real browser: `make docs-check`.

Serves ``site/`` on a loopback port, loads the home page and one API page in headless
Chromium (Debian's ``chromium`` package), and checks that each renders: its title, the site
navigation, its content (the API page's rendered members), no console message (a script
error, a resource that failed to load) and no request the server answered with an error.
A screenshot of each page goes to ``--output_dir``. Exit status 0 when every check holds,
1 with one line per failure otherwise, 2 when Chromium or the site is missing.

    .venv-docs/bin/python scripts/docs_check.py --site site --output_dir out/docs-check
"""

import argparse
import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import Dict, List, Optional, Tuple

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
# (path, expected title, text the rendered page must hold)
PAGES: Tuple[Tuple[str, str, Tuple[str, ...]], ...] = (
    ("index.html", "tff-mf", ("Where to start", 'href="install.html"')),
    ("reference/spec.html", "tff_mf.spec - tff-mf",
     ('id="tff_mf.spec.MechanismSpec"', 'href="../index.html"')),
)
# Entries of the site navigation every page shows (mkdocs.yml's nav).
NAV = ("Install", "First run", "Train with TFF", "Use it in Flower", "API reference",
       "Threat model")


def find_browser() -> Optional[str]:
  """The path of a Chromium on PATH, or None."""
  for name in BROWSERS:
    path = shutil.which(name)
    if path:
      return path
  return None


class _Handler(http.server.SimpleHTTPRequestHandler):
  """Serves the site quietly and records every request's status."""
  statuses: List[Tuple[str, int]] = []

  def log_request(self, code="-", size="-"):  # pylint: disable=unused-argument
    self.statuses.append((self.path, int(code) if str(code).isdigit() else 0))

  def log_message(self, format, *args):  # pylint: disable=redefined-builtin
    pass


def serve(site: str) -> Tuple[http.server.ThreadingHTTPServer, List[Tuple[str, int]]]:
  """A server of ``site`` on a free loopback port, running in a daemon thread."""
  statuses: List[Tuple[str, int]] = []
  handler = type("Handler", (_Handler,), {"statuses": statuses})
  server = http.server.ThreadingHTTPServer(
      ("127.0.0.1", 0), functools.partial(handler, directory=site))
  threading.Thread(target=server.serve_forever, daemon=True).start()
  return server, statuses


def chromium(browser: str, url: str, profile: str, extra: List[str]) -> subprocess.CompletedProcess:
  """One headless Chromium run on ``url`` with a private profile directory."""
  command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-extensions", "--disable-background-networking",
             f"--user-data-dir={profile}", "--window-size=1280,900",
             "--virtual-time-budget=5000", *extra, url]
  return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def check_page(browser: str, base: str, page: Tuple[str, str, Tuple[str, ...]],
               output_dir: str, profile: str) -> List[str]:
  """The failures of one page (empty when it renders)."""
  path, title, needles = page
  url = f"{base}/{path}"
  dom = chromium(browser, url, profile, ["--enable-logging=stderr", "--v=0", "--dump-dom"])
  failures = []
  if dom.returncode != 0 or "<html" not in dom.stdout:
    return [f"{path}: Chromium did not render it (exit {dom.returncode}): {dom.stderr[-300:]}"]
  found = re.search(r"<title>(.*?)</title>", dom.stdout, re.S)
  if not found or found.group(1).strip() != title:
    failures.append(f"{path}: title {found.group(1).strip() if found else None!r}, "
                    f"expected {title!r}")
  navigation = re.search(r'<nav class="md-nav md-nav--primary".*?</nav>\s*</div>\s*</div>',
                         dom.stdout, re.S)
  if not navigation:
    failures.append(f"{path}: no site navigation")
  else:
    missing = [entry for entry in NAV if entry not in navigation.group(0)]
    if missing:
      failures.append(f"{path}: the navigation lacks {missing}")
  for needle in needles:
    if needle not in dom.stdout:
      failures.append(f"{path}: the rendered page lacks {needle!r}")
  console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line]
  failures += [f"{path}: console: {line.strip()[:300]}" for line in console]
  screenshot = os.path.join(output_dir, path.replace("/", "_").replace(".html", ".png"))
  shot = chromium(browser, url, profile, [f"--screenshot={screenshot}"])
  if shot.returncode != 0 or not os.path.exists(screenshot) or os.path.getsize(screenshot) == 0:
    failures.append(f"{path}: no screenshot (exit {shot.returncode})")
  return failures


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--site", default="site", help="the built site (default: site)")
  parser.add_argument("--output_dir", default="out/docs-check",
                      help="where the screenshots go (default: out/docs-check)")
  args = parser.parse_args(argv)
  browser = find_browser()
  if browser is None:
    print("docs_check: error: no Chromium on PATH (Debian: apt-get install chromium)",
          file=sys.stderr)
    return 2
  if not os.path.isfile(os.path.join(args.site, "index.html")):
    print(f"docs_check: error: {args.site}/index.html is missing: run `make docs` first",
          file=sys.stderr)
    return 2
  os.makedirs(args.output_dir, exist_ok=True)
  server, statuses = serve(os.path.abspath(args.site))
  base = f"http://127.0.0.1:{server.server_address[1]}"
  failures: List[str] = []
  try:
    with tempfile.TemporaryDirectory() as profile:
      for page in PAGES:
        failures += check_page(browser, base, page, args.output_dir, profile)
  finally:
    server.shutdown()
  errors: Dict[str, int] = {p: code for p, code in statuses if code >= 400}
  failures += [f"the server answered {code} for {p}" for p, code in sorted(errors.items())]
  for failure in failures:
    print(f"docs_check: {failure}", file=sys.stderr)
  if failures:
    return 1
  print(f"docs_check: {len(PAGES)} pages render in {os.path.basename(browser)} (title, "
        f"navigation, content, no console message, {len(statuses)} requests without an "
        f"error); screenshots in {args.output_dir}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
