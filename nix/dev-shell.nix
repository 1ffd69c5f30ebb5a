# The toolchain: Python with nox, uv, the container tools and the linters CI runs.
{ pkgs }:
let
  python = pkgs.python312.withPackages (ps: [ ps.nox ]);
in
pkgs.mkShell {
  packages = [ python pkgs.uv pkgs.podman pkgs.skopeo pkgs.hadolint pkgs.shellcheck ];
  shellHook = ''
    # uv must use this shell's Python, never download one.
    export UV_PYTHON_DOWNLOADS=never
  '';
}
