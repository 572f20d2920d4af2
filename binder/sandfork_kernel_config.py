# Settings of the "Python 3 (Sandfork)" kernel in the Binder image, copied by binder/postBuild
# into <sys.prefix>/etc/jupyter. A Binder session has about 2 GiB of memory for everything
# (JupyterLab, the engine, every sandbox), so sandboxes are smaller than the template's 1 GiB.
c = get_config()  # noqa: F821 (traitlets' config loader defines it)
c.SandforkKernelApp.memory_mb = 512
c.SandforkKernelApp.cpu = 1
