# Each environment's manifest (what the lock says, and which wheel file of each package), as a derivation
# that needs no input at all: builtins.derivation with /bin/sh. It is the part of the flake that builds for
# real without nixpkgs (the offline CI builds it), and the image carries it as SERVEMATRIX_ENV_MANIFEST.
{ data }:
let
  describe = envId: env: {
    env_id = envId;
    inherit (env) axes inputs_hash lock lock_sha256 matrices platform python_version system;
    wheels = map (sha256: { inherit sha256; inherit (data.wheels.${sha256}) name version filename; }) env.wheels;
  };
in
rec {
  manifest = envId: env: builtins.derivation {
    name = "servematrix-env-${envId}.json";
    inherit (env) system;
    builder = "/bin/sh";
    # The JSON travels in the environment: dash's printf writes it without re-parsing it.
    args = [ "-c" "printf '%s\\n' \"$manifest\" > \"$out\"" ];
    manifest = builtins.toJSON (describe envId env);
  };

  # { "manifest-<env_id>" = ...; } for the given environments.
  packages = envs: builtins.listToAttrs (map (envId: { name = "manifest-${envId}"; value = manifest envId envs.${envId}; })
    (builtins.attrNames envs));
}
