"""Drive the course in a real JupyterLab, in Debian's headless Chromium, through playwright.

Things that break such tests, and what this module does about each:

- JupyterLab restores earlier tabs and layouts: every server gets fresh settings, workspace,
  config, data and runtime directories, and pages are opened with ``?reset``.
- "Run All" before the kernel is idle does nothing: we wait until the notebook's kernel is
  connected and idle (read from the JupyterLab application object, exposed with
  ``--LabApp.expose_app_in_browser``) before clicking Run > Run All Cells.
- A news notice ("Would you like to receive official Jupyter news?") pops up: the
  notification plugin's ``fetchNews`` and ``checkForUpdates`` settings are turned off in the
  fresh user settings, and the update checker class is replaced by the one that never checks.
- Cells far from the viewport are not in the DOM (notebook windowing): windowing is off.
- Running a notebook autosaves its outputs: autosave is off and the server works on a copy
  of the notebooks, so the committed notebooks stay clean.

Nothing here downloads a browser: Chromium is Debian's, given by path.
"""
from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

CHROMIUM = os.environ.get("COURSE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# User settings written into the fresh settings directory of every server.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
    # Every cell stays in the DOM, so outputs and widgets can be inspected anywhere.
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    # Outputs must not be written back into the notebooks under test.
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
}

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def browser_missing_reason() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    if not Path(CHROMIUM).exists():
        return (f"no Chromium at {CHROMIUM}: install Debian's with `apt-get install -y chromium` "
                "(the browser tests never download one)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is missing: pip install playwright (a test extra)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LabServer:
    """A JupyterLab server on 127.0.0.1 with no token, isolated from the user's settings.

    ``notebooks`` is copied to ``<root>/notebooks``; every other top-level entry of ``repo``
    (except VCS and venv folders) is linked next to it, so relative paths work as in the repo.
    """

    def __init__(self, notebooks: Path, repo: Path | None = None, startup_timeout: float = 90.0):
        self.notebooks = Path(notebooks)
        self.repo = Path(repo) if repo else None
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen | None = None
        self.tmp: Path | None = None
        self.url = ""

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> "LabServer":
        self.tmp = Path(tempfile.mkdtemp(prefix="course_lab_"))
        root = self.tmp / "root"
        root.mkdir()
        shutil.copytree(self.notebooks, root / "notebooks",
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        if self.repo:
            for entry in self.repo.iterdir():
                if entry.name in {"notebooks", ".git", ".venv", "artifacts"} or entry.name.startswith("."):
                    continue
                with contextlib.suppress(OSError):
                    (root / entry.name).symlink_to(entry)
        dirs = {name: self.tmp / name for name in ("settings", "workspaces", "config", "data", "runtime", "ipython")}
        for d in dirs.values():
            d.mkdir()
        for plugin, values in LAB_SETTINGS.items():
            f = dirs["settings"] / f"{plugin}.jupyterlab-settings"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(json.dumps(values))
        env = dict(os.environ)
        env.update(
            JUPYTERLAB_SETTINGS_DIR=str(dirs["settings"]),
            JUPYTERLAB_WORKSPACES_DIR=str(dirs["workspaces"]),
            JUPYTER_CONFIG_DIR=str(dirs["config"]),
            JUPYTER_DATA_DIR=str(dirs["data"]),
            JUPYTER_RUNTIME_DIR=str(dirs["runtime"]),
            IPYTHONDIR=str(dirs["ipython"]),
            PYTHONUNBUFFERED="1",
        )
        env.pop("JUPYTER_TOKEN", None)
        env.pop("MPLBACKEND", None)  # the kernel picks the inline backend, as for a student
        last_error = ""
        for _attempt in range(3):  # the free port may be taken between probing and binding
            port = free_port()
            self.url = f"http://127.0.0.1:{port}"
            cmd = [
                sys.executable, "-m", "jupyterlab",
                "--no-browser",
                "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={port}",
                "--ServerApp.port_retries=0",
                "--IdentityProvider.token=",
                "--ServerApp.password=",
                # lets the harness stop kernels through the REST API (a local, throwaway server)
                "--ServerApp.disable_check_xsrf=True",
                f"--ServerApp.root_dir={root}",
                "--LabApp.expose_app_in_browser=True",
                "--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate",
                f"--LabApp.user_settings_dir={dirs['settings']}",
                f"--LabApp.workspaces_dir={dirs['workspaces']}",
            ]
            if hasattr(os, "geteuid") and os.geteuid() == 0:
                cmd.append("--allow-root")
            self.log_path = self.tmp / f"server_{port}.log"
            log = open(self.log_path, "wb")
            self.proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
            log.close()
            atexit.register(self.stop)  # no orphaned server or kernels if the test run dies early
            if self._wait_ready():
                return self
            last_error = self.log_tail()
            self._kill()
        self.stop()
        raise RuntimeError(f"JupyterLab did not start; server log:\n{last_error}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(self.url + "/api/status", timeout=2) as r:
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.3)
        return False

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except (OSError, AttributeError):
            return ""

    def add_notebook(self, rel_path: str, nb) -> str:
        """Write an nbformat notebook under the server root (for tests that build their own)."""
        import nbformat

        target = self.tmp / "root" / rel_path
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, str(target))
        return rel_path

    def api(self, method: str, path: str):
        req = urllib.request.Request(self.url + path, method=method)
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None

    def shutdown_kernels(self, timeout: float = 15.0) -> list:
        """Stop every kernel (and so its worker processes): the machine has few cores.
        Returns the kernels still listed after `timeout` (normally none)."""
        left = []
        with contextlib.suppress(Exception):
            for session in self.api("GET", "/api/sessions"):
                with contextlib.suppress(Exception):
                    self.api("DELETE", f"/api/sessions/{session['id']}")
            deadline = time.monotonic() + timeout
            while True:
                left = self.api("GET", "/api/kernels")
                if not left or time.monotonic() > deadline:
                    break
                for kernel in left:
                    with contextlib.suppress(Exception):
                        self.api("DELETE", f"/api/kernels/{kernel['id']}")
                time.sleep(0.3)
        return left

    def _kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()  # the server shuts its kernels down on SIGTERM
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.shutdown_kernels()
            self._kill()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


@contextlib.contextmanager
def chromium():
    """Debian's Chromium, headless, driven by playwright (yields a Browser)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


# -- JavaScript run in the page --------------------------------------------------------------

# Finds the notebook panel for `path` in the JupyterLab shell; every snippet below starts with it.
_PANEL_JS = """
const app = window.jupyterapp;
const panel = app ? Array.from(app.shell.widgets('main')).find(w => w.context && w.context.path === path) : null;
"""

STATE_JS = (
    "(path) => {"
    + _PANEL_JS
    + """
  if (!app) return {phase: 'no app'};
  if (!panel) return {phase: 'no panel'};
  if (!panel.context.isReady) return {phase: 'loading'};
  const sc = panel.sessionContext;
  const kernel = sc && sc.session ? sc.session.kernel : null;
  const dialog = document.querySelector('.jp-Dialog');
  const cells = [];
  panel.content.widgets.forEach((cell, i) => {
    const m = cell.model;
    const src = m.sharedModel.getSource();
    const c = {index: i, type: m.type, source: src.slice(0, 300), empty: src.trim() === ''};
    if (m.type === 'code') {
      c.count = m.executionCount;
      const p = cell.node.querySelector('.jp-InputPrompt');
      c.prompt = p ? p.textContent.trim() : '';
      c.outputs = [];
      for (let j = 0; j < m.outputs.length; j++) {
        const o = m.outputs.get(j).toJSON();
        const s = {type: o.output_type};
        if (o.output_type === 'error') {
          s.ename = o.ename; s.evalue = o.evalue;
          s.traceback = (o.traceback || []).join('\\n').slice(-3000);
        }
        if (o.output_type === 'stream') {
          s.name = o.name;
          s.text = (Array.isArray(o.text) ? o.text.join('') : o.text).slice(-3000);
        }
        if (o.data) s.mimes = Object.keys(o.data);
        c.outputs.push(s);
      }
      // Top-level outputs of this cell, and which of them are rendered widget views.
      const area = cell.node.querySelector('.jp-Cell-outputArea');
      const topLevel = ':scope > .jp-OutputArea-child > .jp-OutputArea-output';
      const tops = area ? Array.from(area.querySelectorAll(topLevel)) : [];
      c.widgetOutputs = tops.filter(o => o.querySelector(':scope > .jupyter-widgets')).length;
      c.widgetErrors = tops.map(o => o.textContent || '')
        .filter(t => t.includes('Error displaying widget') || t.includes('Loading widget...'))
        .map(t => t.trim().slice(0, 300));
      // A widget callback that raised (e.g. an interact function) prints its traceback into
      // the widget's Output area, not into the cell's outputs.
      c.widgetTracebacks = area ? Array.from(area.querySelectorAll(
          '.widget-output .jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'))
        .map(o => o.textContent || '').filter(t => t.includes('Traceback (most recent call last)'))
        .map(t => t.slice(-1500)) : [];
    }
    cells.push(c);
  });
  return {phase: 'ready', sessionReady: !!(sc && sc.isReady), kernel: kernel ? kernel.status : null,
          connection: kernel ? kernel.connectionStatus : null,
          dialog: dialog ? dialog.textContent.trim().slice(0, 500) : null, cells};
}"""
)

# Marks the nth (0-based) usable ipywidgets slider of the notebook with data-course-slider="1";
# returns its cell index and current readout, or null.
MARK_SLIDER_JS = "([path, nth]) => {" + _PANEL_JS + """
  if (!panel) return null;
  for (const a of ['data-course-slider', 'data-course-slider-handle'])
    document.querySelectorAll('[' + a + ']').forEach(e => e.removeAttribute(a));
  const cells = panel.content.widgets;
  for (let i = 0; i < cells.length; i++) {
    const area = cells[i].node.querySelector('.jp-Cell-outputArea');
    if (!area) continue;
    for (const s of area.querySelectorAll('.widget-slider')) {
      if (s.classList.contains('mod-disabled') || s.querySelector('[disabled]')) continue;
      const handle = s.querySelector('.noUi-handle');
      if (!handle) continue;
      if (nth-- > 0) continue;
      s.setAttribute('data-course-slider', '1');
      handle.setAttribute('data-course-slider-handle', '1');
      const readout = s.querySelector('.widget-readout');
      return {cell: i, readout: readout ? readout.textContent.trim() : null,
              classes: s.className, label: (s.querySelector('.widget-label') || {}).textContent || ''};
    }
  }
  return null;
}"""

# Marks the button of the interact (or box) holding the marked slider: interact_manual's "Run Interact".
MARK_BUTTON_JS = """() => {
  document.querySelectorAll('[data-course-slider-button]').forEach(e => e.removeAttribute('data-course-slider-button'));
  const s = document.querySelector('[data-course-slider]');
  const box = s ? (s.closest('.widget-interact') || s.closest('.widget-box')) : null;
  const b = box ? box.querySelector('button.widget-button:not([disabled])') : null;
  if (!b) return false;
  b.setAttribute('data-course-slider-button', '1');
  return true;
}"""

SLIDER_READOUT_JS = """() => {
  const s = document.querySelector('[data-course-slider]');
  const r = s ? s.querySelector('.widget-readout') : null;
  const h = s ? s.querySelector('.noUi-handle') : null;
  return (r ? r.textContent.trim() : '') + '|' + (h ? (h.getAttribute('aria-valuenow') || '') : '');
}"""

# Every output of the notebook, with the marked slider cut out: what the slider may change.
OUTPUTS_SIGNATURE_JS = "(path) => {" + _PANEL_JS + """
  if (!panel) return [];
  const parts = [];
  panel.content.widgets.forEach((cell, i) => {
    const area = cell.node.querySelector('.jp-Cell-outputArea');
    if (!area) return;
    area.querySelectorAll(':scope > .jp-OutputArea-child > .jp-OutputArea-output').forEach((o, j) => {
      const clone = o.cloneNode(true);
      clone.querySelectorAll('[data-course-slider]').forEach(e => e.remove());
      // A canvas (e.g. an interactive matplotlib figure) keeps its pixels out of the HTML.
      const canvases = Array.from(o.querySelectorAll('canvas')).map(c => {
        try { return c.toDataURL(); } catch (e) { return ''; }
      });
      parts.push({cell: i, output: j, html: clone.innerHTML, canvases});
    });
  });
  return parts;
}"""


def _digest(parts) -> dict:
    return {(p["cell"], p["output"]): hashlib.sha256((p["html"] + "".join(p["canvases"])).encode()).hexdigest()
            for p in parts}


class NotebookError(AssertionError):
    pass


class NotebookPage:
    """One notebook opened in JupyterLab in its own browser context."""

    def __init__(self, browser, server: LabServer, rel_path: str, viewport=(1400, 1000)):
        self.server = server
        self.path = rel_path  # relative to the server root, e.g. "notebooks/00_x.ipynb"
        self.context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
        self.page = self.context.new_page()
        self.console: list[str] = []
        self.notes: list[str] = []  # things a student would notice that are not failures
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}") if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))

    def close(self):
        with contextlib.suppress(Exception):
            self.context.close()

    # -- reading ---------------------------------------------------------------------------
    def state(self) -> dict:
        return self.page.evaluate(STATE_JS, self.path)

    def _wait(self, predicate, timeout: float, what: str, interval: float = 0.25):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = self.state()
            if last.get("dialog"):
                if last["dialog"].startswith("Select Kernel") and self._accept_kernel_dialog(last["dialog"]):
                    continue
                raise NotebookError(f"{self.path}: a dialog blocks the notebook while {what}: {last['dialog']}")
            if predicate(last):
                return last
            self.page.wait_for_timeout(interval * 1000)
        raise NotebookError(f"{self.path}: timed out after {timeout:.0f} s {what}; last state: "
                            f"{_brief(last)}\nbrowser console: {self.console[-10:]}")

    def _accept_kernel_dialog(self, text: str) -> bool:
        """A notebook without kernelspec metadata asks which kernel to start; a student clicks
        Select (the default, Python 3). We do the same, once, and note it."""
        if any(n.startswith("kernel dialog") for n in self.notes):
            return False
        self.notes.append("kernel dialog: the notebook has no kernelspec metadata, so JupyterLab asked "
                          "which kernel to start; accepted the default")
        self.page.locator(".jp-Dialog .jp-mod-accept").first.click(timeout=5000)
        self.page.wait_for_timeout(300)
        return True

    # -- steps -----------------------------------------------------------------------------
    def open(self, timeout: float = 60.0) -> dict:
        """Open the notebook on a reset workspace and wait until its kernel is idle."""
        self.page.goto(f"{self.server.url}/lab/tree/{self.path}?reset", wait_until="domcontentloaded")
        return self._wait(
            lambda s: s.get("phase") == "ready" and s["sessionReady"]
            and s["kernel"] == "idle" and s["connection"] == "connected",
            timeout, "waiting for the notebook to open and its kernel to be idle")

    def run_all(self) -> str:
        """Run > Run All Cells from the menu bar (as a student would); returns how it was triggered."""
        self.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook").first.click(
            position={"x": 5, "y": 5})
        try:
            self.page.locator(".lm-MenuBar-itemLabel", has_text="Run").filter(
                has_text=re.compile(r"^Run$")).first.click(timeout=5000)
            self.page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click(timeout=5000)
            return "menu"
        except Exception:  # the menu is not the subject of the test: run the same command directly
            self.page.keyboard.press("Escape")
            self.page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            return "command"

    def wait_finished(self, timeout: float, settle: float = 2.0) -> dict:
        """Wait until no cell is queued or running and the kernel is idle again.

        Done when every code cell has run, or once cells were seen running and none is any
        more (Run All stops at an error), or when nothing has been queued or running for
        `settle` seconds after some cell ran (a run too quick to be seen running)."""
        seen = {"running": False, "quiet_since": None}

        def done(s):
            if s.get("phase") != "ready":
                return False
            code = [c for c in s["cells"] if c["type"] == "code" and not c["empty"]]
            if any(c["prompt"].startswith("[*]") for c in code) or s["kernel"] != "idle":
                seen["running"] = seen["running"] or any(c["prompt"].startswith("[*]") for c in code)
                seen["quiet_since"] = None
                return False
            if all(c["count"] is not None for c in code) or seen["running"]:
                return True
            if any(c["count"] is not None for c in code):
                seen["quiet_since"] = seen["quiet_since"] or time.monotonic()
                return time.monotonic() - seen["quiet_since"] >= settle
            return False

        return self._wait(done, timeout, "waiting for all cells to finish", interval=0.5)

    def wait_widgets_rendered(self, timeout: float = 20.0) -> dict:
        """Every widget-view output the kernel produced must be rendered as widget DOM."""
        def ok(s):
            for c in s["cells"]:
                if c["type"] != "code":
                    continue
                want = sum(1 for o in c["outputs"] if WIDGET_MIME in (o.get("mimes") or []))
                if c["widgetErrors"] or c["widgetOutputs"] < want:
                    return False
            return True
        try:
            return self._wait(ok, timeout, "waiting for widgets to render")
        except NotebookError:
            return self.state()  # the caller reports which cells lack their widgets

    def cell_output_text(self, index: int) -> str:
        """What the student sees in the output area of cell `index` right now (DOM text)."""
        return self.page.evaluate("([path, i]) => {" + _PANEL_JS + """
          const cell = panel ? panel.content.widgets[i] : null;
          const area = cell ? cell.node.querySelector('.jp-Cell-outputArea') : null;
          return area ? area.textContent : '';
        }""", [self.path, index])

    def mark_slider(self, nth: int = 0):
        return self.page.evaluate(MARK_SLIDER_JS, [self.path, nth])

    def outputs_signature(self) -> dict:
        return _digest(self.page.evaluate(OUTPUTS_SIGNATURE_JS, self.path))

    def move_slider(self, timeout: float = 30.0, max_sliders: int = 3) -> dict:
        """Move the first slider and wait for some output to change.

        A slider that changes nothing (say, one waiting for a "Run" button) is reported in
        "tried" and the next slider is moved, up to `max_sliders`. Returns {"slider": info,
        "method": ..., "before": readout, "after": readout, "changed": [(cell, output), ...],
        "tried": [earlier results]}; "changed" is empty when no slider changed any output.
        """
        tried = []
        deadline = time.monotonic() + timeout
        for nth in range(max_sliders):
            info = self.mark_slider(nth)
            if info is None:
                if nth == 0:
                    raise NotebookError(f"{self.path}: no ipywidgets slider found in the outputs")
                break
            # the first slider gets most of the time: its redraw may run a cluster
            budget = deadline - time.monotonic()
            budget = budget if nth == max_sliders - 1 else max(4.0, budget * (0.6 if nth == 0 else 0.5))
            result = self._move_one(info, budget)
            result["tried"] = tried
            if result["changed"] or time.monotonic() >= deadline:
                return result
            tried.append({k: v for k, v in result.items() if k != "tried"})
        result["tried"] = tried[:-1]
        return result

    def _move_one(self, info: dict, timeout: float, quiet: float = 4.0) -> dict:
        """Move the marked slider: a key press, else a drag, else steps back (at the maximum a
        step right does nothing); with interact_manual, then click the interact's button, as a
        student would. Waits for an output to change and the kernel to be idle again; gives up
        on a gesture once the kernel has stayed idle for `quiet` seconds with nothing changed."""
        handle = self.page.locator("[data-course-slider-handle]")
        handle.scroll_into_view_if_needed()
        self.page.wait_for_timeout(300)
        before_value = self.page.evaluate(SLIDER_READOUT_JS)
        before = self.outputs_signature()
        result = {"slider": info, "before": before_value, "changed": [], "method": None}
        deadline = time.monotonic() + timeout

        def diff():
            after = self.outputs_signature()
            return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))

        def wait_change() -> bool:
            idle_since = time.monotonic()
            while time.monotonic() < deadline:
                self.page.wait_for_timeout(300)
                idle = self._kernel_idle()
                if diff() and idle:
                    self.page.wait_for_timeout(500)  # let the redraw settle, then read again
                    result["changed"] = diff()
                    return True
                if not idle:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > quiet:
                    return False
            return False

        gestures = [("keyboard", self._press), ("drag", self._drag), ("keyboard-back", self._press_back)]
        for method, act in gestures:
            act(handle)
            result["method"] = method
            if wait_change():
                break
            if self.page.evaluate(SLIDER_READOUT_JS) != before_value:
                # the value moved yet nothing was redrawn: maybe the interact waits for its button
                button = self.page.locator("[data-course-slider-button]")
                if self.page.evaluate(MARK_BUTTON_JS) and time.monotonic() < deadline:
                    button.scroll_into_view_if_needed()
                    button.click()
                    result["method"] = method + "+button"
                    wait_change()
                break
        result["after"] = self.page.evaluate(SLIDER_READOUT_JS)
        if not result["changed"]:
            result["changed"] = diff()
        return result

    def _kernel_idle(self) -> bool:
        s = self.state()
        return s.get("kernel") == "idle"

    def _press(self, handle):
        handle.focus()
        handle.press("ArrowRight")

    def _press_back(self, handle):
        handle.focus()
        handle.press("ArrowLeft")
        handle.press("ArrowLeft")

    def _drag(self, handle):
        box = handle.bounding_box()
        if not box:
            return
        x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        self.page.mouse.move(x, y)
        self.page.mouse.down()
        self.page.mouse.move(x + 40, y, steps=5)
        self.page.mouse.up()

    def toasts(self) -> list[str]:
        """Texts of the notification toasts on screen (the news notice would be one)."""
        return [t.strip()[:200] for t in self.page.locator(".Toastify__toast").all_inner_texts()]

    def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(Exception):
            self.page.screenshot(path=str(path))


def _brief(state) -> str:
    if not state or state.get("phase") != "ready":
        return repr(state)
    running = [c["index"] for c in state["cells"] if c["type"] == "code" and c["prompt"].startswith("[*]")]
    return (f"kernel={state['kernel']} connection={state['connection']} running cells={running} "
            f"prompts={[c['prompt'] for c in state['cells'] if c['type'] == 'code']}")


def cell_errors(state: dict) -> list[str]:
    """Human-readable problems: error outputs and code cells that never ran."""
    problems = []
    for c in state["cells"]:
        if c["type"] != "code" or c["empty"]:
            continue
        for o in c["outputs"]:
            if o["type"] == "error":
                problems.append(f"cell {c['index']} raised {o['ename']}: {o['evalue']}\n"
                                f"{_ANSI.sub('', o['traceback'])[-1500:]}")
        for tb in c.get("widgetTracebacks", []):
            problems.append(f"cell {c['index']}: a widget callback raised (traceback in its Output):\n{tb}")
        if c["count"] is None:
            problems.append(f"cell {c['index']} did not run (prompt {c['prompt']!r}): {c['source'][:120]!r}")
    return problems


def widget_problems(state: dict) -> list[str]:
    problems = []
    for c in state["cells"]:
        if c["type"] != "code":
            continue
        want = sum(1 for o in c["outputs"] if WIDGET_MIME in (o.get("mimes") or []))
        if c["widgetErrors"]:
            problems.append(f"cell {c['index']}: widget did not render: {c['widgetErrors']}")
        elif c["widgetOutputs"] < want:
            problems.append(f"cell {c['index']}: {want} widget output(s) but {c['widgetOutputs']} rendered")
    return problems
