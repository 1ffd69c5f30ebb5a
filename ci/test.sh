#!/usr/bin/env bash
# The README's test command: install what the tests need, start the services they use, run them.
#   bash ci/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."

bash ci/install-system-deps.sh
# Services for the integration tests. Each script is idempotent and prints what it exports.
for service in ci/services/*.sh; do
  [ -e "$service" ] || continue
  echo "ci: starting $(basename "$service" .sh)"
  # shellcheck disable=SC1090
  source "$service"
done
export UV_PYTHON_DOWNLOADS=never
exec nox -s tests -- "$@"
