"""The page's JavaScript and CSS from npm packages installed by name, so the site loads nothing from a CDN.

asv's index.html loads jQuery, flot and its plugins, Bootstrap, stupidtable and blueimp-md5 from CDNs. The versions
are pinned in www/package.json and www/package-lock.json (with their integrity hashes), installed once per lock
file with `npm ci` into a cache folder, and copied beside the page; each CDN tag of index.html then names the copy.
Where asv pins a version npm does not carry, the nearest kept release of the same major version is used
(Bootstrap 3.4.1 for 3.1.1, stupid-table-plugin 1.1.3 for stupidtable 1.0.1); the browser test proves the page
still draws with them.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from harness.errors import HarnessError

WWW = Path(__file__).parent / "www"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "qwen36" / "history-js"
# The file each CDN URL of asv's index.html stands for (matched by the URL's last part), and where npm keeps it.
ASSETS = {
    "jquery-3.3.1.min.js": "jquery/dist/jquery.min.js",
    "jquery.flot.min.js": "flot/jquery.flot.js",
    "jquery.flot.time.min.js": "flot/jquery.flot.time.js",
    "jquery.flot.selection.min.js": "flot/jquery.flot.selection.js",
    "jquery.flot.categories.min.js": "flot/jquery.flot.categories.js",
    "jquery.flot.orderBars.js": "flot-orderbars/js/jquery.flot.orderBars.js",
    "stupidtable.min.js": "stupid-table-plugin/stupidtable.min.js",
    "md5.min.js": "blueimp-md5/js/md5.min.js",
    "bootstrap.min.js": "bootstrap/dist/js/bootstrap.min.js",
    "bootstrap.min.css": "bootstrap/dist/css/bootstrap.min.css",
}
FONTS = "bootstrap/dist/fonts"  # bootstrap.min.css loads ../fonts/glyphicons-*
_CDN_TAG = re.compile(r'<(script|link)\b[^>]*?(?:src|href)="(https?://[^"]+)"[^>]*>')


def node_modules(cache: Path = CACHE) -> Path:
    """The installed packages for the committed lock file, installing them the first time."""
    lock = (WWW / "package-lock.json").read_bytes()
    folder = cache / hashlib.sha256(lock + (WWW / "package.json").read_bytes()).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder.with_suffix(".lock"), "w") as guard:  # parallel test workers publish at once
        fcntl.flock(guard, fcntl.LOCK_EX)
        return _installed(folder)


def _installed(folder: Path) -> Path:
    if (folder / "node_modules" / ".complete").exists():
        return folder / "node_modules"
    npm = shutil.which("npm")
    if npm is None:
        raise HarnessError("the history page needs npm to install its JavaScript (jQuery, flot, Bootstrap) by name: "
                           "install Node.js and npm (Debian: `apt-get install npm`), then publish again")
    for name in ("package.json", "package-lock.json"):
        shutil.copy2(WWW / name, folder / name)
    done = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"], cwd=folder,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise HarnessError(f"`npm ci` in {folder} failed (exit {done.returncode}): "
                           f"{(done.stderr or done.stdout).strip()[-800:]}; check that the npm registry is reachable")
    (folder / "node_modules" / ".complete").touch()
    return folder / "node_modules"


def vendor_page(html_dir: Path, modules: Path) -> None:
    """Copy the assets beside the page and point index.html (and any other page) at them."""
    vendor = html_dir / "vendor"
    for name, rel in ASSETS.items():
        target = vendor / ("css" if name.endswith(".css") else "js") / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(modules / rel, target)
    shutil.copytree(modules / FONTS, vendor / "fonts", dirs_exist_ok=True)
    for page in html_dir.glob("*.html"):
        page.write_text(_local_tags(page.read_text(), page.name))


def _local_tags(html: str, page: str) -> str:
    def local(match: re.Match) -> str:
        tag, url = match.group(1), match.group(2)
        name = url.rsplit("/", 1)[-1]
        if name not in ASSETS:
            raise HarnessError(f"{page} loads {url}, which the history page does not vendor: add it to "
                               "harness/history/site/vendor.py ASSETS and www/package.json")
        folder = "css" if name.endswith(".css") else "js"
        if tag == "link":
            return f'<link rel="stylesheet" href="vendor/{folder}/{name}">'
        rest = " onerror=\"js_load_failure()\"" if "js_load_failure" in match.group(0) else ""
        return f'<script src="vendor/{folder}/{name}"{rest}>'
    return _CDN_TAG.sub(local, html)


def remote_loads(html: str) -> list[str]:
    """What a page would still fetch from the network (scripts, styles, images); empty for a vendored page."""
    return re.findall(r'<(?:script|link|img)\b[^>]*?(?:src|href)="(https?://[^"]+)"', html)
