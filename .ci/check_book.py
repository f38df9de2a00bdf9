"""Open every page of the built book in headless Chromium and check what a reader sees.

    python .ci/check_book.py [_build/html]        (or: make check-book)

A page fails when, after MathJax has typeset it:

- raw TeX is left in its text (``$$``, ``\\(``, ``\\frac`` ... outside code), or
  MathJax reported an error in a formula;
- an image did not load (``naturalWidth`` 0);
- a JavaScript error was thrown (an uncaught exception) or the browser logged an
  error (a script, style sheet or other resource that failed to load);
- a launch button (Colab, Binder) or repository link points at a file that does
  not exist in the repository.

Needs Chromium (Debian: ``apt-get install chromium``; another binary via the
``CHROMIUM`` environment variable). It talks to Chromium over the DevTools
protocol with tornado's websocket client (tornado comes with Jupyter), and serves
the pages over HTTP from a local port, as a web server would. Nothing is downloaded.
"""

from __future__ import annotations

import asyncio
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE_TIMEOUT = 30.0  # seconds per page

# ---------------------------------------------------------------------------
# Pure parts (tested in tests/test_check_book.py)
# ---------------------------------------------------------------------------

_RAW_TEX = re.compile(
    r"\$\$"  # display math delimiters
    r"|\\[(\[]|\\[)\]]"  # \( \) \[ \]
    r"|\\(?:frac|sum|prod|sqrt|mathbb|mathrm|mathcal|operatorname|text|left|right|begin|end|hat|bar"
    r"|tilde|cdot|times|log|exp|min|max|mid|pi|theta|sigma|mu|epsilon|beta|nabla|partial|leq|geq|approx)(?![a-zA-Z])"
    r"|\$[^$\s][^$\n]*[\\^_{][^$\n]*\$"  # $...$ holding TeX markup
)


_REDIRECT = re.compile(r"""<meta\s+http-equiv=["']?refresh["']?\s+content=["']?\d+;\s*url=([^"'>\s]+)""", re.IGNORECASE)


def redirect_target(html: str) -> str | None:
    """Where a redirect-only page (``<meta http-equiv="refresh" ...>``) sends the reader, else None."""
    match = _REDIRECT.search(html)
    return match.group(1) if match else None


def find_raw_tex(text: str, context: int = 25) -> list[str]:
    """Snippets of ``text`` (a page's visible prose) that look like untypeset TeX; nearby hits share one."""
    spans: list[list[int]] = []
    for m in _RAW_TEX.finditer(text):
        if spans and m.start() <= spans[-1][1] + context:
            spans[-1][1] = m.end()
        else:
            spans.append([m.start(), m.end()])
    return [text[max(0, a - context) : b + context].replace("\n", " ") for a, b in spans]


def repo_path_from_url(href: str, repo_url: str, branch: str) -> tuple[str | None, str | None]:
    """``(path in the repository, problem)`` for a link into the repository, else ``(None, None)``.

    Knows the link forms of Jupyter Book's buttons: Colab
    ``colab.research.google.com/github/ORG/REPO/blob/BRANCH/PATH``, GitHub
    ``github.com/ORG/REPO/{blob,edit,tree}/BRANCH/PATH`` and Binder
    ``.../v2/gh/ORG/REPO/BRANCH?urlpath=tree/PATH`` (or ``filepath=PATH``).
    ``problem`` names a link to another repository or branch.
    """
    org_repo = "/".join(urllib.parse.urlparse(repo_url).path.strip("/").split("/")[:2])
    url = urllib.parse.urlparse(href)
    parts = url.path.strip("/").split("/")
    found: tuple[str, str, str] | None = None  # (org/repo, branch, path)
    if url.netloc.endswith("colab.research.google.com") and parts[:1] == ["github"] and len(parts) >= 6 and parts[3] == "blob":
        found = ("/".join(parts[1:3]), parts[4], "/".join(parts[5:]))
    elif url.netloc == "github.com" and len(parts) >= 5 and parts[2] in ("blob", "edit", "tree"):
        found = ("/".join(parts[:2]), parts[3], "/".join(parts[4:]))
    elif "/v2/gh/" in url.path:
        gh = url.path.split("/v2/gh/", 1)[1].strip("/").split("/")
        query = urllib.parse.parse_qs(url.query)
        target = (query.get("filepath") or query.get("urlpath") or [""])[0]
        target = re.sub(r"^(lab/)?tree/", "", target)
        if len(gh) >= 3 and target:
            found = ("/".join(gh[:2]), gh[2], target)
    if found is None:
        return None, None
    where, ref, path = found
    path = urllib.parse.unquote(path)
    if where.lower() != org_repo.lower():
        return path, f"{href} points at repository {where}, not {org_repo}"
    if ref != branch:
        return path, f"{href} points at branch {ref!r}, not {branch!r}"
    return path, None


def page_problems(page: str, result: dict, errors: list[str], root: Path, repo_url: str, branch: str) -> list[str]:
    """Every problem found on one page, one line each."""
    problems = [f"{page}: raw TeX: ...{snippet}..." for snippet in find_raw_tex(result["text"])]
    problems += [f"{page}: MathJax error: {message}" for message in result["mathErrors"]]
    problems += [f"{page}: image did not load: {src}" for src in result["broken"]]
    problems += [f"{page}: JavaScript error: {message}" for message in errors]
    for href in sorted(set(result["links"])):
        path, problem = repo_path_from_url(href, repo_url, branch)
        if problem:
            problems.append(f"{page}: {problem}")
        elif path is not None and not (root / path).exists():
            problems.append(f"{page}: link to a file not in the repository: {path} ({href})")
    return problems


# ---------------------------------------------------------------------------
# Chromium over the DevTools protocol
# ---------------------------------------------------------------------------

_PAGE_JS = r"""
(async () => {
  const wait = (ms) => new Promise((r) => setTimeout(r, ms));
  const mj = window.MathJax;
  if (mj && mj.startup && mj.startup.promise) {
    await Promise.race([mj.startup.promise, wait(20000)]);
  }
  const images = Array.from(document.images);
  for (const img of images) {
    if (img.loading === "lazy") img.loading = "eager";  // off-screen images load too
  }
  await Promise.race([
    Promise.all(images.map((img) => img.complete ? null : new Promise((r) => {
      img.addEventListener("load", r);
      img.addEventListener("error", r);
    }))),
    wait(10000),
  ]);
  const skip = "pre, code, kbd, samp, script, style, textarea, mjx-container, .highlight";
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const texts = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (n.parentElement && !n.parentElement.closest(skip)) texts.push(n.nodeValue);
  }
  return {
    text: texts.join("\n"),
    broken: images.filter((i) => !i.complete || i.naturalWidth === 0).map((i) => i.getAttribute("src")),
    mathErrors: Array.from(document.querySelectorAll("mjx-merror")).map(
      (e) => e.getAttribute("data-mjx-error") || e.textContent),
    formulas: document.querySelectorAll("mjx-container").length,
    images: images.length,
    links: Array.from(document.querySelectorAll("a[href]")).map((a) => a.href),
  };
})()
"""


class DevTools:
    """The few DevTools calls the check needs, over one websocket."""

    def __init__(self, connection):
        self.connection = connection
        self.last_id = 0
        self.events: list[dict] = []

    async def call(self, method: str, **params):
        self.last_id += 1
        sent = self.last_id
        await self.connection.write_message(json.dumps({"id": sent, "method": method, "params": params}))
        while True:
            message = await self.connection.read_message()
            if message is None:
                raise RuntimeError("Chromium closed the DevTools connection")
            data = json.loads(message)
            if data.get("id") == sent:
                if "error" in data:
                    raise RuntimeError(f"{method}: {data['error']}")
                return data["result"]
            self.events.append(data)

    async def until_event(self, name: str) -> None:
        while not any(e.get("method") == name for e in self.events):
            message = await self.connection.read_message()
            if message is None:
                raise RuntimeError("Chromium closed the DevTools connection")
            self.events.append(json.loads(message))


def _errors_from(events: list[dict]) -> list[str]:
    errors = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            errors.append(details.get("exception", {}).get("description") or details.get("text", "exception"))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            entry = params["entry"]
            if entry.get("url", "").endswith("/favicon.ico"):
                continue  # the browser asks every server for one by itself; the book declares none
            errors.append(f"{entry.get('text', '')} {entry.get('url', '')}".strip())
        # console.error() calls are a script's own diagnostics, not failures: pydata-sphinx-theme
        # logs one ("invalid theme mode") on a reader's first visit, before it stores a choice.
    return [e.splitlines()[0] if e else "error" for e in errors]


def find_chromium() -> str:
    for candidate in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    raise SystemExit("check-book needs Chromium: apt-get install chromium (or set CHROMIUM=/path/to/chrome)")


def _start_chromium(profile: str) -> tuple[subprocess.Popen, str]:
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
        f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank",
    ]
    proc = subprocess.Popen([find_chromium(), *flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port_file = Path(profile) / "DevToolsActivePort"
    deadline = time.monotonic() + 30
    while not port_file.exists() or not port_file.read_text().strip():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("Chromium did not start (no DevToolsActivePort within 30 s)")
        time.sleep(0.1)
    port = port_file.read_text().split()[0]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
        pages = [t for t in json.load(response) if t["type"] == "page"]
    return proc, pages[0]["webSocketDebuggerUrl"]


async def _check_pages(ws_url: str, base_url: str, pages: list[str]) -> dict[str, tuple[dict, list[str]]]:
    from tornado.websocket import websocket_connect

    connection = await websocket_connect(ws_url, max_message_size=256 * 1024 * 1024)
    tools = DevTools(connection)
    for domain in ("Page", "Runtime", "Log"):
        await tools.call(f"{domain}.enable")
    results = {}
    for page in pages:
        tools.events = []
        await tools.call("Page.navigate", url=f"{base_url}/{page}")
        await asyncio.wait_for(tools.until_event("Page.loadEventFired"), PAGE_TIMEOUT)
        reply = await asyncio.wait_for(
            tools.call("Runtime.evaluate", expression=_PAGE_JS, awaitPromise=True, returnByValue=True), PAGE_TIMEOUT
        )
        if "exceptionDetails" in reply:
            raise RuntimeError(f"{page}: the check's own script failed: {reply['exceptionDetails']}")
        results[page] = (reply["result"]["value"], _errors_from(tools.events))
    connection.close()
    return results


def _serve(folder: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def main(argv: list[str] | None = None) -> int:
    import yaml

    args = sys.argv[1:] if argv is None else argv
    html = Path(args[0] if args else ROOT / "_build" / "html")
    pages, problems = [], []
    for path in sorted(html.rglob("*.html")):
        page = path.relative_to(html).as_posix()
        if page.startswith("_"):  # _static, _sources, _images: assets, not pages
            continue
        target = redirect_target(path.read_text(encoding="utf-8", errors="replace"))
        if target is None:
            pages.append(page)
        elif not (path.parent / target).is_file():  # index.html only redirects; its target must exist
            problems.append(f"{page}: redirects to {target}, which was not built")
    if not pages:
        print(f"no built pages under {html}; run make book (or make book-noexec) first", file=sys.stderr)
        return 1
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    repo_url, branch = config["repository"]["url"], config["repository"].get("branch", "main")
    start = time.perf_counter()
    server, base_url = _serve(html)
    profile = tempfile.mkdtemp(prefix="check-book-")
    proc = None
    try:
        proc, ws_url = _start_chromium(profile)
        results = asyncio.run(_check_pages(ws_url, base_url, pages))
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        server.shutdown()
        shutil.rmtree(profile, ignore_errors=True)
    for page, (result, errors) in results.items():
        problems += page_problems(page, result, errors, ROOT, repo_url, branch)
    formulas = sum(r["formulas"] for r, _ in results.values())
    images = sum(r["images"] for r, _ in results.values())
    for line in problems:
        print(line, file=sys.stderr)
    print(f"check-book: {len(pages)} pages, {formulas} typeset formulas, {images} images, "
          f"{len(problems)} problems, {time.perf_counter() - start:.1f} s")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
