"""An operator in headless Chromium: log in, request a build with the form, watch it finish,
see the kernel matrix and the apt install line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import _require

from .test_service import KERNEL, Service, hello_tarball, moddeb, service_env

pytestmark = pytest.mark.docker
CHROMIUM = "/usr/bin/chromium"
PASSWORD = "operator password 1"


@pytest.fixture
def browser():
    """Playwright driving the system's Chromium (no browser downloads here)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        _require("playwright", f"pip install playwright ({exc})")
    if not shutil.which(CHROMIUM):
        _require("Chromium", "apt-get install chromium")
    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield b
        b.close()


def test_operator_builds_hello_from_the_browser(
    tmp_path: Path, shared_home: Path, runner, base_image, browser
) -> None:
    """Log in, upload hello with one kernel chosen, watch the page turn green, read the apt line."""
    env = service_env(tmp_path / "home", shared_home)
    logs = tmp_path / "logs"
    logs.mkdir()
    moddeb(env, "user", "create", "operator", "--password-stdin", stdin=PASSWORD + "\n")
    tarball = tmp_path / "hello-1.0.tar.gz"
    tarball.write_bytes(hello_tarball())
    service = Service(env, logs)
    page = browser.new_page()
    try:
        service.serve()
        page.goto(f"{service.url}/builds/new")
        assert "/login" in page.url
        page.fill("input[name=name]", "operator")
        page.fill("input[name=password]", PASSWORD)
        page.click("button:has-text('Log in')")
        page.wait_for_url("**/builds/new")

        page.check("input[name=source_kind][value=upload]")
        page.set_input_files("input[name=source]", str(tarball))
        page.select_option("select[name=kernels]", [KERNEL])
        page.click("button:has-text('Build')")
        page.wait_for_url("**/builds/*")
        assert page.locator(f"#matrix tr[data-kernel='{KERNEL}']").count() == 1

        page.wait_for_selector("#state.succeeded", timeout=600_000)
        # The page reloads itself once the build ends, to show the install commands.
        page.wait_for_function(
            "() => (document.querySelector('#install pre') || {}).innerText?.includes('apt-get')",
            timeout=60_000,
        )
        page.wait_for_load_state()
        cell = page.locator(f"#matrix tr[data-kernel='{KERNEL}'] td.cell")
        assert cell.get_attribute("class") == "cell succeeded"
        assert cell.evaluate("el => getComputedStyle(el).backgroundColor") == "rgb(26, 127, 55)"
        install = page.inner_text("#install pre")
        assert f"{service.url}/apt bookworm main" in install
        assert "sudo apt-get install hello-modules-$(uname -r)" in install
        assert "published" in page.inner_text("#events")
        links = page.locator("#artifacts a").all_inner_texts()
        assert f"hello-modules-{KERNEL}_1.0-1_amd64.deb" in links
        page.screenshot(path=str(tmp_path / "build.png"), full_page=True)
    finally:
        page.close()
        service.stop()
