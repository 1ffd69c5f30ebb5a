# See flake.nix beside this file. `import nixpkgs { system; config; }` lands here.
{ system, config ? { }, overlays ? [ ] }:
let
  isDerivation = x: builtins.isAttrs x && (x.type or null) == "derivation";

  # Derivation attributes must be strings, lists, numbers, booleans, paths or derivations.
  flatten = value:
    if builtins.isAttrs value && !isDerivation value then builtins.toJSON value else value;

  mk = name: attrs:
    builtins.derivation (
      builtins.mapAttrs (_: flatten) attrs
      // {
        inherit name system;
        builder = "/bin/sh";
        args = [ "-c" "echo 'stub nixpkgs: evaluation only, not buildable' >&2; exit 1" ];
      }
    );

  expect = cond: message: value: if cond then value else throw "stub nixpkgs: ${message}";

  mkPython = version:
    let
      short = builtins.replaceStrings [ "." ] [ "" ] version;
      self = mk "python3-${version}.0" { } // {
        interpreter = "${self}/bin/python${version}";
        sitePackages = "lib/python${version}/site-packages";
        pythonVersion = version;
        pkgs = {
          pip = mk "python${short}-pip" { };
          nox = mk "python${short}-nox" { };
        };
        withPackages = f: mk "python${version}-env" { packages = f self.pkgs; };
      };
    in
    self;

  # Keys of an OCI image config that flake.nix may set.
  ociConfigKeys = [ "Cmd" "Entrypoint" "Env" "ExposedPorts" "Labels" "StopSignal" "User" "Volumes" "WorkingDir" ];

  streamLayeredImage =
    { name
    , tag ? null
    , fromImage ? null
    , contents ? [ ]
    , config ? { }
    , architecture ? null
    , created ? "1970-01-01T00:00:01Z"
    , mtime ? null
    , uid ? 0
    , gid ? 0
    , uname ? "root"
    , gname ? "root"
    , maxLayers ? 100
    , extraCommands ? ""
    , fakeRootCommands ? ""
    , enableFakechroot ? false
    , includeStorePaths ? true
    , includeNixDB ? false
    , passthru ? { }
    , meta ? { }
    }:
    let
      badKeys = builtins.filter (k: !(builtins.elem k ociConfigKeys)) (builtins.attrNames config);
      badEnv = builtins.filter (e: builtins.match "[A-Za-z_][A-Za-z0-9_]*=.*" e == null) (config.Env or [ ]);
      checked =
        expect (badKeys == [ ]) "streamLayeredImage: unknown config keys ${builtins.toJSON badKeys}" (
          expect (badEnv == [ ]) "streamLayeredImage: Env entries must be NAME=VALUE: ${builtins.toJSON badEnv}" (
            expect (maxLayers > 1) "streamLayeredImage: maxLayers must be > 1" (
              expect (builtins.all isDerivation contents) "streamLayeredImage: contents must be derivations" true)));
      imageName = expect checked "unreachable" (builtins.replaceStrings
        [ "A" "B" "C" "D" "E" "F" "G" "H" "I" "J" "K" "L" "M" "N" "O" "P" "Q" "R" "S" "T" "U" "V" "W" "X" "Y" "Z" ]
        [ "a" "b" "c" "d" "e" "f" "g" "h" "i" "j" "k" "l" "m" "n" "o" "p" "q" "r" "s" "t" "u" "v" "w" "x" "y" "z" ]
        name);
      stream = mk "stream-${baseNameOf name}" {
        inherit imageName extraCommands fakeRootCommands contents maxLayers;
        imageTag = if tag == null then "" else tag;
        conf = { inherit config created; };
      };
    in
    stream // passthru // { inherit imageName; imageTag = tag; isExe = true; };
in
{
  inherit system config;

  python311 = mkPython "3.11";
  python312 = mkPython "3.12";
  python313 = mkPython "3.13";

  fetchurl = { name ? null, url, sha256 }:
    builtins.derivation {
      name = if name == null then baseNameOf url else name;
      inherit system url;
      builder = "/bin/sh";
      args = [ "-c" "echo 'stub nixpkgs: evaluation only, not buildable' >&2; exit 1" ];
      outputHashMode = "flat";
      outputHashAlgo = "sha256";
      outputHash = expect (builtins.match "[0-9a-f]{64}" sha256 != null) "fetchurl: sha256 ${sha256} is not hex" sha256;
    };

  runCommand = name: env: buildCommand:
    mk name (builtins.removeAttrs env [ "passthru" ] // { inherit buildCommand; }) // (env.passthru or { });

  writeShellScriptBin = name: text: mk name { inherit text; };

  mkShell = { name ? "nix-shell", packages ? [ ], shellHook ? "" }:
    mk name { inherit packages shellHook; };

  dockerTools = { inherit streamLayeredImage; };

  stdenv = {
    cc = mk "gcc-wrapper-14" { } // { cc = { lib = mk "gcc-14-lib" { }; }; };
  };

  bashInteractive = mk "bash-interactive-5.3" { };
  coreutils = mk "coreutils-9.8" { };
  cacert = mk "nss-cacert-3.117" { };
  zlib = mk "zlib-1.3.1" { };
  uv = mk "uv-0.9" { };
  podman = mk "podman-5.6" { };
  skopeo = mk "skopeo-1.20" { };
  hadolint = mk "hadolint-2.14" { };
  shellcheck = mk "shellcheck-0.11" { };

  cudaPackages_12_8 = { cudatoolkit = mk "cuda-merged-12.8" { }; };
  cudaPackages_13_0 = { cudatoolkit = mk "cuda-merged-13.0" { }; };
}
