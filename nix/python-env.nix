# One environment's Python: a venv of nixpkgs' interpreter holding exactly the locked wheels.
#
# Every wheel is a fixed-output derivation (pkgs.fetchurl) whose sha256 is the one the lock lists for that
# file, so Nix refuses any other bytes whatever the mirror. pip then installs them from a local wheelhouse:
# --no-index (nothing can be fetched), --no-deps (the lock is already the whole closure), by name==version
# rather than by path (a path install would record the build directory in direct_url.json).
{ pkgs, envId, env, wheels, wheelBases, manifest }:
let
  lib = import ./lib.nix;
  pythonAttr = lib.pythonAttr env.python_version;
  python =
    pkgs.${pythonAttr} or (throw "servematrix: nixpkgs has no ${pythonAttr} for environment ${envId}");
  baseUrl = name:
    wheelBases.${name} or (throw (
      "servematrix: wheel base '${name}' has no URL. Give it in nix/wheel-bases.json, or as "
      + "SERVEMATRIX_WHEEL_BASES='{\"${name}\": \"https://...\"}' with --impure (docs/nix.md)."
    ));
  fetchWheel = sha256:
    let wheel = wheels.${sha256}; in
    {
      inherit (wheel) name version filename;
      src = pkgs.fetchurl {
        name = wheel.filename;
        url = "${lib.trimTrailingSlash (baseUrl wheel.base)}/${wheel.path}";
        inherit sha256;
      };
    };
  fetched = map fetchWheel env.wheels;
in
pkgs.runCommand "servematrix-python-${envId}"
  {
    # The wheelhouse needs each file under its wheel name: pip reads name, version and tags from it.
    wheelhouse = builtins.concatStringsSep "\n" (map (w: "${w.src} ${w.filename}") fetched);
    requirements = builtins.concatStringsSep "\n" (map (w: "${w.name}==${w.version}") fetched) + "\n";
    passAsFile = [ "wheelhouse" "requirements" ];
    pip = python.pkgs.pip;
    passthru = {
      inherit python manifest;
      wheels = fetched;
    };
  }
  ''
    mkdir wheelhouse
    while read -r src filename; do
      ln -s "$src" "wheelhouse/$filename"
    done < "$wheelhousePath"

    ${python.interpreter} -m venv --without-pip "$out"
    PYTHONPATH="$pip/${python.sitePackages}" "$out/bin/python" -m pip install \
      --no-index --find-links ./wheelhouse --no-deps --no-cache-dir --no-compile \
      --disable-pip-version-check --no-warn-script-location --progress-bar off \
      --requirement "$requirementsPath"

    # Bytecode with hash-based invalidation: deterministic, and the store is read-only at run time. Files
    # that do not compile (templates, other Pythons' code shipped in wheels) are left as they are.
    "$out/bin/python" -m compileall -q -j "$NIX_BUILD_CORES" --invalidation-mode unchecked-hash "$out/lib" || true

    mkdir -p "$out/share/servematrix"
    cp ${manifest} "$out/share/servematrix/env.json"
  ''
