#!/usr/bin/env bash
#
# Prints the path of a Python that has `openapi-spec-validator` (the
# reference OpenAPI 3.x validator), creating a cached venv the first time:
#   ${XDG_CACHE_HOME:-~/.cache}/mailroom/openapi-venv  (one pip install, ~10 s;
#   later calls only check it). scripts/test.sh exports the result as
#   MAILROOM_TEST_OPENAPI_PYTHON for mailroom-server's openapi test.
set -euo pipefail

VERSION="0.9.0"
venv="${XDG_CACHE_HOME:-$HOME/.cache}/mailroom/openapi-venv"
py="$venv/bin/python"
stamp="$venv/.openapi-spec-validator-$VERSION"
if [[ ! -x "$py" || ! -e "$stamp" ]]; then
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv" >&2
  "$py" -m pip install --quiet --disable-pip-version-check \
    "openapi-spec-validator==$VERSION" >&2
  touch "$stamp"
fi
echo "$py"
