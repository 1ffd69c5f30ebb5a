# `nix run .#matrix -- [ARGS]`: `nox -s matrix -- ARGS` in the current checkout, with the pinned toolchain.
{ pkgs }:
let
  python = pkgs.python312.withPackages (ps: [ ps.nox ]);
  path = builtins.concatStringsSep ":" (map (p: "${p}/bin") [ python pkgs.uv pkgs.podman ]);
  script = pkgs.writeShellScriptBin "servematrix-matrix" ''
    set -eu
    if [ ! -f noxfile.py ]; then
      echo "servematrix-matrix: run it from a servematrix checkout (no noxfile.py in $PWD)" >&2
      exit 2
    fi
    export PATH="${path}:$PATH"
    export UV_PYTHON_DOWNLOADS=never
    exec nox -s matrix -- "$@"
  '';
in
{
  type = "app";
  program = "${script}/bin/servematrix-matrix";
}
