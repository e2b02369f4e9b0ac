#!/usr/bin/env bash
# What the browser tests (tests/test_label_browser.py) need: Debian's `chromium` (Playwright drives
# it headless) and `chromium-driver` (chromedriver, for Selenium). Run by `make test` and `.ci/run`.
#   present          -> nothing to do, exit 0
#   missing, root    -> apt-get installs both
#   missing, no root -> one line naming the command to run, exit 2
# --check: only look, never install (what a user who is not root gets), e.g. to test this script.
set -euo pipefail

PACKAGES="chromium chromium-driver"
check_only=0
case "${1:-}" in
    "") ;;
    --check) check_only=1 ;;
    *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

missing() {
    ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1
}

missing || exit 0

if [ "$check_only" -eq 0 ] && [ "$EUID" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "browser tests: installing Debian's $PACKAGES (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    # shellcheck disable=SC2086
    apt-get install -y -q --no-install-recommends $PACKAGES
    missing || exit 0
    echo "browser tests: chromium or chromedriver still not on PATH after apt-get install $PACKAGES" >&2
    exit 2
fi

echo "browser tests need chromium and chromedriver: run 'sudo apt-get install $PACKAGES'" \
    "(Debian), or 'make test-fast' to skip them" >&2
exit 2
