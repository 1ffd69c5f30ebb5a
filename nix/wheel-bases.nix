# The URL behind each wheel base name in nix/envs.json. No host is committed (docs/nix.md): the URLs come from
#   - SERVEMATRIX_WHEEL_BASES, a JSON object such as {"default": "https://..."}, read only when
#     the evaluation is impure (`nix build --impure ...`; a pure evaluation sees no environment), else
#   - nix/wheel-bases.json, {} as committed: a site may fill it in its own checkout to build purely.
# The wheels are fixed-output derivations: their sha256 comes from the lock, so whichever mirror serves
# them, the result is the same or the build fails.
{ file }:
let
  fromEnvironment = builtins.getEnv "SERVEMATRIX_WHEEL_BASES";
in
if fromEnvironment != "" then builtins.fromJSON fromEnvironment else builtins.fromJSON (builtins.readFile file)
