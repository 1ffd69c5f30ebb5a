{
  description = "servematrix: the LLM serving matrix with a pinned toolchain, and one OCI image per locked environment";

  # Pinned by flake.lock (docs/nix.md says where that pin comes from and how to move it).
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-25.11";

  outputs = { self, nixpkgs }:
    let
      lib = import ./nix/lib.nix;

      # The environments and their wheels, generated from the matrices' locks by
      # `python -m servematrix.scaleout.nixexport`: the one truth is the lock, this is its Nix-readable form.
      data = builtins.fromJSON (builtins.readFile ./nix/envs.json);
      wheelBases = import ./nix/wheel-bases.nix { file = ./nix/wheel-bases.json; };
      manifests = import ./nix/manifests.nix { inherit data; };

      envSystems = map (env: env.system) (builtins.attrValues data.environments);
      systems = lib.unique ([ "x86_64-linux" "aarch64-linux" ] ++ envSystems);
      envsFor = system: lib.filterAttrs (_: env: env.system == system) data.environments;

      # CUDA's toolkit (nvcc, for JIT kernels) is unfree; nothing else here is.
      pkgsFor = system: import nixpkgs { inherit system; config.allowUnfree = true; };

      environmentOutputs = system:
        let
          pkgs = pkgsFor system;
          envs = envsFor system;
          manifest = envId: manifests.manifest envId envs.${envId};
          pythonEnv = envId: import ./nix/python-env.nix {
            inherit pkgs envId wheelBases;
            inherit (data) wheels;
            env = envs.${envId};
            manifest = manifest envId;
          };
          image = envId: import ./nix/image.nix {
            inherit pkgs envId;
            env = envs.${envId};
            pythonEnv = pythonEnv envId;
            manifest = manifest envId;
          };
        in
        # One of each per environment: image-<env_id> (the servematrix nix backend builds this),
        # python-<env_id> (its Python alone) and manifest-<env_id> (input-less).
        lib.prefixed "image-" (envId: _: image envId) envs
        // lib.prefixed "python-" (envId: _: pythonEnv envId) envs
        // manifests.packages envs;
    in
    {
      lib = {
        inherit (data) environments;
        imageReference = envId: "${lib.imageRepository}:${envId}";
      };

      packages = lib.genAttrs systems environmentOutputs;

      devShells = lib.genAttrs systems (system: {
        default = import ./nix/dev-shell.nix { pkgs = pkgsFor system; };
      });

      apps = lib.genAttrs systems (system:
        let matrix = import ./nix/matrix-app.nix { pkgs = pkgsFor system; }; in
        {
          inherit matrix;
          default = matrix;
        });

      # What `nix flake check` builds: the manifests, which need nothing from the network.
      checks = lib.genAttrs systems (system: manifests.packages (envsFor system));
    };
}
