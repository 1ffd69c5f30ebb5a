#!/usr/bin/env bash
# The README's test command: install what the tests need, start the services they use, run them.
set -euo pipefail
cd "$(dirname "$0")/.."

bash ci/install-system-deps.sh
export UV_PYTHON_DOWNLOADS=never
exec nox -s tests -- "$@"
