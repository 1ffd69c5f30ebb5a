# One environment's OCI image: its Python (nix/python-env.nix), a shell, a C compiler (Triton and FlashInfer
# compile kernels at run time) and, for a CUDA environment, that CUDA release's toolkit (nvcc for JIT).
#
# No NVIDIA driver is inside: the runtime injects it (CDI, `podman run --device nvidia.com/gpu=all`, or the
# NVIDIA container toolkit, `docker run --gpus all`). CDI mounts the driver's libraries at their host paths,
# and nixpkgs' glibc ignores /etc/ld.so.cache, so the usual host library directories are on LD_LIBRARY_PATH
# after the image's own; TRITON_LIBCUDA_PATH points Triton at them (it would otherwise ask ldconfig).
#
# The layout matches the podman/docker backend's images (containers/Dockerfile): the environment at
# /opt/servematrix/env, user 10001, home /home/servematrix. So servematrix runs both kinds the same way.
{ pkgs, envId, env, pythonEnv, manifest }:
let
  lib = import ./lib.nix;
  cudaVersion = env.axes.cuda or null;
  cudaAttr = if cudaVersion == null then null else lib.cudaAttr cudaVersion;
  cudaPackages =
    if cudaAttr == null then null
    else pkgs.${cudaAttr} or (throw "servematrix: nixpkgs has no ${cudaAttr} for environment ${envId}");
  cudaToolkit = if cudaPackages == null then null else cudaPackages.cudatoolkit;
  driverLibraryDirs = [
    "/usr/lib/x86_64-linux-gnu" # Debian and Ubuntu hosts
    "/usr/lib/aarch64-linux-gnu"
    "/usr/lib64" # RHEL-like hosts
    "/usr/local/nvidia/lib64" # the legacy NVIDIA runtime hook
  ];
  libraryPath = builtins.concatStringsSep ":" (
    [ "${pkgs.stdenv.cc.cc.lib}/lib" "${pkgs.zlib}/lib" ] ++ driverLibraryDirs
  );
  binPath = builtins.concatStringsSep ":" (
    [ "/opt/servematrix/env/bin" "/bin" ] ++ (if cudaToolkit == null then [ ] else [ "${cudaToolkit}/bin" ])
  );
  axesLabel = builtins.concatStringsSep "," (map (k: "${k}=${env.axes.${k}}") (builtins.attrNames env.axes));
in
pkgs.dockerTools.streamLayeredImage {
  name = lib.imageRepository;
  tag = envId;
  contents = [ pkgs.bashInteractive pkgs.coreutils pkgs.cacert pkgs.stdenv.cc ];
  extraCommands = ''
    mkdir -p opt/servematrix etc tmp home/servematrix
    chmod 1777 tmp
    ln -s ${pythonEnv} opt/servematrix/env
    echo 'root:x:0:0:root:/root:/bin/sh' > etc/passwd
    echo 'servematrix:x:10001:10001::/home/servematrix:/bin/bash' >> etc/passwd
    echo 'root:x:0:' > etc/group
    echo 'servematrix:x:10001:' >> etc/group
  '';
  fakeRootCommands = ''
    chown 10001:10001 home/servematrix
  '';
  config = {
    User = "10001:10001";
    WorkingDir = "/home/servematrix";
    Cmd = [ "python" ];
    Env = [
      "PATH=${binPath}"
      "VIRTUAL_ENV=/opt/servematrix/env"
      "HOME=/home/servematrix"
      "USER=servematrix"
      "LD_LIBRARY_PATH=${libraryPath}"
      "TRITON_LIBCUDA_PATH=/usr/lib/x86_64-linux-gnu"
      "NVIDIA_VISIBLE_DEVICES=all"
      "NVIDIA_DRIVER_CAPABILITIES=compute,utility"
      "SSL_CERT_FILE=${pkgs.cacert}/etc/ssl/certs/ca-bundle.crt"
      "SERVEMATRIX_ENV_MANIFEST=${manifest}"
    ] ++ (if cudaToolkit == null then [ ] else [ "CUDA_HOME=${cudaToolkit}" ]);
    Labels = {
      "org.servematrix.env-id" = envId;
      # As the podman/docker backend labels its images: lock-hash is the lock's inputs hash.
      "org.servematrix.lock-hash" = env.inputs_hash;
      "org.servematrix.lock-sha256" = env.lock_sha256;
      "org.servematrix.axes" = axesLabel;
      "org.servematrix.python" = env.python_version;
      "org.servematrix.builder" = "nix";
    };
  };
  maxLayers = 100;
}
