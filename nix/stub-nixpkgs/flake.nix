# A stand-in for nixpkgs, for the offline checks only (tests/integration/test_flake_eval.py):
#   nix flake check --no-build --override-input nixpkgs path:nix/stub-nixpkgs
# It has the attributes flake.nix uses, with the argument names of the real functions (unknown arguments
# are errors), and derivations whose builder refuses to run: it is for evaluation, never for building.
{
  description = "servematrix: evaluation-only stub of the nixpkgs attributes flake.nix uses";
  outputs = { self }: {
    legacyPackages = {
      x86_64-linux = import ./default.nix { system = "x86_64-linux"; };
      aarch64-linux = import ./default.nix { system = "aarch64-linux"; };
    };
  };
}
