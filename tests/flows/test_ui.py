"""The Prefect UI in headless Chromium (Debian's ``chromium``): the deployment and the completed run
triggered in test_server are visible, and a screenshot of each page is saved under tmp_path."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hang import HANG_S  # noqa: E402  (the suite's one hang guard)

pytestmark = [pytest.mark.prefect, pytest.mark.slow, pytest.mark.shared_data, pytest.mark.ray]

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage", "--hide-scrollbars"]


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:  # `make test` installs it where it can (root with apt-get); elsewhere it is truly absent
        pytest.skip("needs Debian's chromium, not installed here (`make test` installs it when run as root "
                    "with apt-get; or: apt-get install -y chromium)")
    return exe


def _render(url: str, tmp_path: Path, name: str, budget_ms: int = 15000) -> str:
    """The page's DOM after its scripts ran for ``budget_ms`` of virtual time; also saves a PNG."""
    exe = _chromium()
    common = FLAGS + [f"--virtual-time-budget={budget_ms}", "--window-size=1400,1000"]
    dom = subprocess.run([exe, *common, f"--user-data-dir={tmp_path / (name + '-profile-dom')}", "--dump-dom", url],
                         capture_output=True, text=True, timeout=HANG_S)
    assert dom.returncode == 0, dom.stderr[-2000:]
    png = tmp_path / f"{name}.png"
    shot = subprocess.run([exe, *common, f"--user-data-dir={tmp_path / (name + '-profile-png')}",
                           f"--screenshot={png}", url], capture_output=True, text=True, timeout=HANG_S)
    assert shot.returncode == 0, shot.stderr[-2000:]
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    return dom.stdout


def test_ui_shows_deployment_and_completed_run(prefect_server, completed_run, tmp_path):
    assert completed_run["state"]["type"] == "COMPLETED"
    ui = prefect_server["ui"]
    dep = completed_run["by_yaml"]["prepare-data/default"]
    page = _render(f"{ui}/deployments/deployment/{dep['id']}", tmp_path, "deployment")
    assert "prepare-data" in page and "default" in page
    run_id = completed_run["run_id"]
    page = _render(f"{ui}/runs/flow-run/{run_id}", tmp_path, "flow-run")
    assert "Completed" in page
    assert "prepare-data" in page
