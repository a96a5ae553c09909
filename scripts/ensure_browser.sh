#!/usr/bin/env bash
# Make a headless Chromium available for the browser tests: Debian's `chromium` package,
# which Playwright drives through `executable_path`. Never fails the build: where no
# browser can be installed, the browser tests skip and print why.
set -u
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure_browser: no apt-get here; browser tests will skip" >&2
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO="sudo -n"
    else
        echo "ensure_browser: not root and no passwordless sudo; browser tests will skip" >&2
        exit 0
    fi
fi
echo "ensure_browser: installing Debian's chromium for the browser tests"
if ! ($SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium) >/tmp/lace-ensure-browser.log 2>&1; then
    echo "ensure_browser: apt-get install chromium failed (log: /tmp/lace-ensure-browser.log); browser tests will skip" >&2
fi
exit 0
