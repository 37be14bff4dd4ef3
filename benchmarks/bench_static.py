"""Chart pages in Chromium: first and repeat visit of /correlations/ with production static files.

Collects static files (hashed names, compressed) into a throwaway var folder, migrates an
SQLite database there and loads the demo data (seed_demo), starts gunicorn as in production
(DEBUG off; the web workers share one Redis cache, a redis-server of the run's own) on a
loopback port, then opens the page in Debian's Chromium (Playwright; never downloads a
browser): one first visit, then repeat visits in the same browser context. Prints the load
time (navigation start to load event) of the first visit, min/median/max and each of the
repeats, the bytes of plotly.min.js fetched on each visit, and its Cache-Control header.
Target (issue 14): repeat visit < 300 ms.

    .venv/bin/python benchmarks/bench_static.py --repeats 5
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from _server import PRODUCTION, private_redis, start_gunicorn

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"


def visit(page, url: str) -> tuple[float, int]:
    page.goto(url, wait_until="load")
    timing = page.evaluate("""() => {
        const nav = performance.getEntriesByType("navigation")[0];
        const plotly = performance.getEntriesByType("resource").filter(r => r.name.includes("plotly"));
        return [nav.loadEventEnd - nav.startTime, plotly.reduce((n, r) => n + r.transferSize, 0)];
    }""")
    return float(timing[0]), int(timing[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as var, private_redis() as cache:
        env = {**os.environ, **PRODUCTION, "CACHE_URL": cache, "PRBENCH_VAR_DIR": var,
               "DJANGO_SETTINGS_MODULE": "prbench.settings"}
        env.pop("DATABASE_URL", None)
        for command in (["collectstatic", "--noinput", "-v0"], ["migrate", "--noinput", "-v0"]):
            subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=env, check=True)
        # The demo's data (DEBUG on for this step only): two evaluated baselines and synthetic
        # outcomes, so the page draws its charts.
        subprocess.run([sys.executable, "manage.py", "seed_demo"], cwd=ROOT, env={**env, "DEBUG": "1"}, check=True,
                       stdout=subprocess.DEVNULL)
        server, base = start_gunicorn(env, workers=2, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"{base}/correlations/"
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
                page = browser.new_context().new_page()
                first, first_bytes = visit(page, url)
                repeats = [visit(page, url) for _ in range(args.repeats)]
                plotly_url = page.evaluate(
                    "() => performance.getEntriesByType('resource').map(r => r.name).find(n => n.includes('plotly'))")
                browser.close()
            cache = urllib.request.urlopen(plotly_url).headers.get("Cache-Control")
        finally:
            server.terminate()
            server.wait(timeout=30)
    times = [t for t, _ in repeats]
    print(f"plotly: {plotly_url.rsplit('/', 1)[-1]}  Cache-Control: {cache}")
    print(f"first visit: {first:.0f} ms ({first_bytes} bytes of plotly transferred)")
    print(f"repeat visit ({args.repeats}x): min {min(times):.0f} / median {statistics.median(times):.0f} / "
          f"max {max(times):.0f} ms (plotly bytes transferred: {sorted({b for _, b in repeats})}); "
          f"each: {', '.join(f'{t:.0f}' for t in times)}")
    print(f"target repeat < 300 ms: {'met' if statistics.median(times) < 300 else 'NOT met'}")


if __name__ == "__main__":
    main()
