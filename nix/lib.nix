# Small helpers on builtins only: the flake's own logic must not depend on nixpkgs' lib, so that the stub
# nixpkgs used by the offline checks (nix/stub-nixpkgs) can stay small.
rec {
  genAttrs = names: f: builtins.listToAttrs (map (name: { inherit name; value = f name; }) names);

  filterAttrs = pred: set:
    builtins.listToAttrs (
      builtins.concatMap (name: if pred name set.${name} then [ { inherit name; value = set.${name}; } ] else [ ])
        (builtins.attrNames set)
    );

  # { "<prefix><key>" = f key value; } for every key of set.
  prefixed = prefix: f: set:
    builtins.listToAttrs (map (name: { name = prefix + name; value = f name set.${name}; }) (builtins.attrNames set));

  unique = list: builtins.attrNames (builtins.listToAttrs (map (x: { name = x; value = null; }) list));

  # "3.12" -> "python312", the attribute of that interpreter in nixpkgs.
  pythonAttr = version: "python" + builtins.replaceStrings [ "." ] [ "" ] version;

  # "12.8" -> "cudaPackages_12_8".
  cudaAttr = version: "cudaPackages_" + builtins.replaceStrings [ "." ] [ "_" ] version;

  trimTrailingSlash = s:
    let n = builtins.stringLength s; in
    if n > 0 && builtins.substring (n - 1) 1 s == "/" then trimTrailingSlash (builtins.substring 0 (n - 1) s) else s;

  imageRepository = "localhost/servematrix-nix";
}
